"""The option registry is the one source of option names (issue 12, item 2).

A fourth option registered in a fixture (``offload``) must be picked up, at call time, by the
card schema, the cost tables (``len(OPTIONS)`` columns), the DP, the exhaustive enumerator and
the MILP, which must still agree with each other on random cards that carry it.
"""
from __future__ import annotations

import numpy as np
import pytest

from stateremat.contract import OPTIONS, Option, OptionCost, ProfileCard, ProfileCardError, SegmentCard
from stateremat.planner import PLANNERS, cost_tables, exhaustive, milp, plan

OFFLOAD = Option("offload", replays=True, preserves="activations on host", label="Offload")


@pytest.fixture
def offload():
    """Register ``offload`` for one test and remove it afterwards."""
    OPTIONS.register(OFFLOAD)
    try:
        yield OFFLOAD
    finally:
        OPTIONS.unregister("offload")


def _card(rng: np.random.Generator, n: int, small: bool = False) -> ProfileCard:
    """Random card: eager keeps most and is fastest; whole/region/offload trade bytes for time.

    ``small``: sizes of 0–4 bytes and integer seconds, so zero retained bytes and exact ties
    are common (the minimum-peak sweep's and the tie rules' corner cases).
    """
    grain = 1 if small else 4096

    def cost(r_hi: int, q_hi: int, t_lo: float, t_hi: float) -> OptionCost:
        t = float(rng.integers(t_lo, t_hi + 1)) if small else float(rng.uniform(t_lo, t_hi))
        return OptionCost(int(rng.integers(0, r_hi + 1)) * grain, int(rng.integers(0, q_hi + 1)) * grain, t)

    segs = []
    for i in range(n):
        a = int(rng.integers(1, 5 if small else 200))
        opts = {"eager": cost(a, 4 if small else 20, 0, 1) if small else
                OptionCost(a * grain, int(rng.integers(0, 20)) * grain, float(rng.uniform(0.5, 1))),
                "whole": cost(a // 2, 4 if small else 100, 1, 2)}
        if rng.random() < 0.6:
            opts["region"] = cost(a // 2, 4 if small else 100, 1, 2)
        if rng.random() < 0.8:  # host offload: little device memory, a transfer's time
            opts["offload"] = cost(a // 4, 4 if small else 60, 1, 3)
        segs.append(SegmentCard(f"seg{i}", opts))
    return ProfileCard(int(rng.integers(0, 5 if small else 100)) * grain, segs)


def test_a_registered_option_widens_cards_tables_and_planners(offload):
    assert OPTIONS.names == ("eager", "whole", "region", "offload") and len(OPTIONS) == 4
    card = _card(np.random.default_rng(0), 5)
    assert any("offload" in s.options for s in card.segments)
    assert ProfileCard.from_dict(card.to_dict()) == card  # the schema accepts it
    tables = cost_tables(card)
    assert tables.option_names == OPTIONS.names and tables.r.shape == (5, 4)
    assert "offload" in PLANNERS and list(PLANNERS)[-1] == "offload"
    fixed = plan(card, 2**40, "offload")
    want = ["offload" if "offload" in s.options else "whole" for s in card.segments]
    assert fixed.options == want and fixed.solver == "fixed"


def test_dp_equals_exhaustive_equals_milp_with_a_fourth_option(offload):
    rng = np.random.default_rng(12)
    chosen = 0
    for i in range(80):
        card = _card(rng, int(rng.integers(1, 7)), small=i % 2 == 1)
        floor = exhaustive(card, 0).min_feasible_peak_bytes
        assert plan(card, 0).min_feasible_peak_bytes == floor  # min-peak sweep (k columns)
        top = card.persistent_bytes + sum(max(c.retained_bytes for c in s.options.values())
                                          for s in card.segments) + max(
            c.temp_bytes for s in card.segments for c in s.options.values())
        for budget in (floor - 1, floor, int(floor + rng.uniform(0, 1) * (top - floor)), top):
            dp, ex, mi = plan(card, budget), exhaustive(card, budget), milp(card, budget)
            assert dp.feasible == ex.feasible == mi.feasible == (budget >= floor), budget
            assert dp.min_feasible_peak_bytes == ex.min_feasible_peak_bytes == mi.min_feasible_peak_bytes
            if not dp.feasible:
                continue
            # same left fold, same tie rule (cost, then peak, then first policy): same policy
            assert (dp.options, dp.predicted_time_s) == (ex.options, ex.predicted_time_s)
            assert mi.predicted_time_s == pytest.approx(ex.predicted_time_s, rel=1e-9)
            assert max(dp.predicted_peak_bytes, mi.predicted_peak_bytes) <= budget
            chosen += "offload" in dp.options
    assert chosen > 20  # the fourth option is really in play, not ignored


def test_unregistering_restores_the_three_options(offload):
    OPTIONS.unregister("offload")
    try:
        assert OPTIONS.names == ("eager", "whole", "region")
        seg = {"eager": OptionCost(1, 0, 1.0), "whole": OptionCost(0, 0, 2.0),
               "offload": OptionCost(0, 0, 1.5)}
        with pytest.raises(ProfileCardError, match=r"unknown option\(s\) \['offload'\]"):
            SegmentCard("s", seg)
        with pytest.raises(ValueError, match="non-empty subset of"):
            exhaustive(ProfileCard(0, [SegmentCard("s", {k: seg[k] for k in ("eager", "whole")})]),
                       10, ("eager", "offload"))
    finally:
        OPTIONS.register(OFFLOAD)  # the fixture unregisters it again


def test_builtin_options_cannot_be_removed_and_names_are_unique():
    with pytest.raises(ValueError, match="built in"):
        OPTIONS.unregister("whole")
    with pytest.raises(ValueError, match="already registered"):
        OPTIONS.register(Option("region", replays=True, preserves="x", label="X"))
    assert [o.required for o in OPTIONS] == [True, True, False]


def test_replays_and_journals_come_from_the_registry(offload):
    """One predicate for 'does this option replay' (the card-only view included) and one for
    'does it journal': the wrappers, apply_plan, the paper's profile and the profiler read them."""
    assert [OPTIONS.replays(n) for n in ("eager", "whole", "region", "offload", "recompute_only")] == \
        [False, True, True, True, True]
    assert [OPTIONS.journals(n) for n in ("eager", "whole", "region", "offload", "recompute_only")] == \
        [False, False, True, False, False]
    with pytest.raises(ValueError, match="unknown checkpoint option 'nope'"):
        OPTIONS.replays("nope")
    assert OPTIONS.baseline == "eager"  # a registered fourth option that replays does not change it
    assert OPTIONS.control == "whole"  # nor the state-agnostic control (offload is not required)


def test_no_library_module_spells_the_baseline_option_as_a_literal_plan():
    """"Every segment without a checkpoint" is ``[OPTIONS.baseline] * n``, not ``["eager"] * n``:
    the profiler, auto_checkpoint, the planner's budget, the integrations and the paper's MoCo."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "src" / "stateremat"
    pattern = re.compile(r"""\[["']eager["']\]\s*\*|get\([^)]*,\s*["']eager["']\)|:\s*["']eager["']\}""")
    hits = [f"{p.relative_to(root)}:{i}: {line.strip()}" for p in root.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_no_module_outside_the_registry_tests_an_option_by_name_or_replays_flag():
    """Option behaviour is read from the registry: no ``== "region"`` or ``.replays`` branch
    is repeated in the torch core, the wrappers or the paper's profile (issue 23, item 4)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "src" / "stateremat"
    files = [*(root / "torch").rglob("*.py"), *(root / "paper" / "profile").rglob("*.py"),
             *(p for p in (root / "planner").glob("*.py") if p.name != "_examples.py"),  # (examples: data)
             root / "paper" / "bench" / "_methods.py"]
    # (the paper's state-agnostic control, whole unpreserved, is OPTIONS.control, not a literal)
    pattern = re.compile(r"""(==|!=)\s*["'](region|whole|eager)["']|["'](region|whole)["']\s+in\s+\w|\]\.replays\b"""
                         r"""|index\(["'](whole|eager)["']\)|\(["']eager["'],\s*["']whole["']\)|\[["']whole["']\]""")
    hits = [f"{p.relative_to(root)}:{i}: {line.strip()}" for p in files
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_wrap_or_not_is_decided_in_one_place_of_the_torch_core():
    """Whether a segment is wrapped (its option replays) is asked once in the torch core, by
    ``_wrap.segment_call``; ``apply_plan``, ``SegmentForward`` and ``checkpoint_sequential``
    take its answer (issue 23, item 4); ``checkpoint_sequential`` refuses a ``preserve`` that
    does not replay by the engines' registry, as ``checkpoint`` does."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "src" / "stateremat" / "torch"
    pattern = re.compile(r"OPTIONS\.replays\(|\.replays\(\)")
    hits = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                  for line in p.read_text().splitlines() if pattern.search(line) and not line.lstrip().startswith("#"))
    assert hits == ["_wrap.py"]


def test_per_segment_counters_are_keyed_by_option():
    """A segment's retained bytes are a dict keyed by option name (``Transaction.retained``),
    not a test of the preserver's class or attributes (issue 23, item 4)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "src" / "stateremat" / "torch"
    pattern = re.compile(r"isinstance\([^)]*(Whole|Region)Preserver\)|hasattr\([^)]*bytes")
    hits = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if "_preserve" not in p.parts
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
