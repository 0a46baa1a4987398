"""The parity matrix (issue 24 item 1): compile x engine x model, each cell against the same setup
without checkpointing, in float64 over 3 SGD steps.

Axes: compile ``none`` / ``aot_eager`` / ``inductor``; engine ``single`` (one process), ``ddp``,
``fsdp_inside`` (FSDP2 with the checkpoint inside the unit), ``fsdp_around`` (the checkpoint
around the sharded unit), ``tp`` (tensor parallel, ``DTensor`` parameters and state) on 2 gloo
ranks on CPU; models: a tiny transformers Llama with dropout, a block with a token counter and a
32 KiB queue written in forward, a BatchNorm block (``tests/_torch_parity_worker.py`` builds them).

A cell passes when losses, every local parameter shard and every buffer are bitwise equal to the
model without checkpointing (under inductor: to the *compiled* model without checkpointing, within
the worker's measured ``INDUCTOR_TOLERANCE``, since the checkpoint runs its blocks eagerly), the
default generator's state is equal after every step, BatchNorm counters and token counters are
updated once per step, and every checkpointed segment replayed once per backward. A cell that
cannot be supported is refused at its first forward with an error naming the combination and the
fix, and the test asserts the refusal: ``inductor_rng`` (inductor drawing its own random numbers).

One spawn per engine (``tests/_dist.py``), many cells per spawn, run on first use and shared by the
engine's cells. Every compile mode runs in every engine; to keep the wall time near 1.5 minutes on
2 cores (2.8 with inductor's on-disk cache cold), the Llama is compiled (aot_eager) in two engines
only and never under inductor, which runs the counter block everywhere and the BatchNorm block in
``single`` (``STATEREMAT_PARITY_FULL=1`` runs every model under every compile mode in every
engine: 66 cells, all pass, 2-4.5 min here).
"""
from __future__ import annotations

import pytest

from _dist import run_ranks
from _torch_parity_worker import CELLS, INDUCTOR_TOLERANCE, STEPS

#: every cell spawns its engine's ranks and compiles: minutes (make test runs it; -m 'not slow' skips it)
pytestmark = pytest.mark.slow

ENGINES = ("single", "ddp", "fsdp_inside", "fsdp_around", "tp")

#: cell -> (exception type name, text the message must hold): refused up front, by design.
REFUSED = {"inductor_rng": ("UnsupportedError", ("backend='inductor'", "fallback_random = True", "aot_eager"))}

#: (engine, cell) -> (exception class, reason): real bugs left open as strict xfails (none today);
#: a cell's recorded exception is raised again here as its own class (``_raise_recorded``).
XFAIL: dict[tuple[str, str], tuple[type[BaseException], str]] = {}


def _raise_recorded(r: dict) -> None:
    """Raise the exception a worker cell recorded, as its own class where it can be found."""
    import builtins

    import torch._dynamo.exc as dynamo_exc

    import stateremat.torch as srt

    kind = r.get("error_type", "RuntimeError")
    cls = getattr(srt, kind, None) or getattr(builtins, kind, None) or getattr(dynamo_exc, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = RuntimeError
    try:
        exc = cls(r["error"])
    except Exception:  # noqa: BLE001 - a class that wants other arguments
        exc = RuntimeError(f"{kind}: {r['error']}")
    raise exc


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """engine -> the ranks' records, each engine spawned once, on first use."""
    done: dict[str, list[dict]] = {}

    def records(engine: str) -> list[dict]:
        if engine not in done:
            done[engine] = run_ranks("_torch_parity_worker.py", tmp_path_factory.mktemp(engine), timeout=420,
                                     args=(engine,), world=1 if engine == "single" else 2)
        return done[engine]

    return records


def _cells():
    for engine in ENGINES:
        for model, compile_, preserve in CELLS[engine]:
            name = f"{model}/{compile_}/{preserve}"
            bug = XFAIL.get((engine, name))
            marks = [pytest.mark.xfail(strict=True, raises=bug[0], reason=bug[1])] if bug else []
            yield pytest.param(engine, name, id=f"{engine}-{name}", marks=marks)


@pytest.mark.dist
@pytest.mark.parametrize("engine,name", list(_cells()))
def test_cell_equals_the_setup_without_checkpointing(matrix, engine, name):
    model, compile_, _ = name.split("/")
    for rank, rec in enumerate(matrix(engine)):
        r = rec[name]
        if compile_ in REFUSED:
            kind, phrases = REFUSED[compile_]
            assert r.get("error_type") == kind, (rank, r)
            assert all(p in r["error_message"] for p in phrases), r["error_message"]
            continue
        if "error" in r:  # a crash (in backward, or anywhere): the cell's own exception
            _raise_recorded(r)
        where = (engine, rank, name, r)
        assert r["rng_equal"], where  # the default generator's state after every step
        assert r["replays"] == 2 * STEPS, where  # each of the 2 checkpointed blocks/layers once per backward
        for counter, value in r["counters"].items():  # updated once per step, not once more per replay
            assert value == (STEPS if counter.endswith("num_batches_tracked") else STEPS * r["batch"]), (counter, where)
        if compile_ == "inductor":
            assert r["max_diff"] <= INDUCTOR_TOLERANCE[model], where
        else:
            assert r["equal"] and r["losses_equal"] and r["max_diff"] == 0.0, where


def test_every_axis_is_covered():
    cells = {(e, m, c) for e in ENGINES for m, c, _ in CELLS[e]}
    assert {c for _, _, c in cells} >= {"none", "aot_eager", "inductor", "inductor_rng"}
    for e in ENGINES:
        assert {m for e2, m, c in cells if e2 == e} == {"llama", "counter", "bn"}, e
        assert {c for e2, m, c in cells if e2 == e} >= {"none", "aot_eager", "inductor"}, e
