"""The five preservation engines: recoveries, R6 journals, recorded noise, byte accounting."""
import numpy as np
import pytest
from typer.testing import CliRunner

from stateremat.cli import app
from stateremat.paper.records import read_records
from stateremat.reference import execute, forward_jacobian_grad
from stateremat.paper.verify._families import family_program
from stateremat.paper.verify._study import check_recovery, semantic_program
from stateremat.paper.verify._summary import summarise_engines
from stateremat.reference.engines import (
    ENGINES, EagerEngine, GuardedEngine, RegionEngine, WholeEngine, make_engine,
)
from stateremat.reference.engines._base import RNG_STATE_BYTES, Recovery, op_read_from_state


def _case(family="queue", d=4, steps=4, seed=0, rows=32):
    p, segs = family_program(family, d, steps, np.random.default_rng(seed), rows=rows)
    return p, segs, forward_jacobian_grad(execute(p))


def test_engine_registry_is_table_1_in_order():
    assert list(ENGINES) == ["eager", "whole", "readset", "region", "guarded"]
    with pytest.raises(ValueError, match="unknown engine 'full'"):
        make_engine("full", None, [])


@pytest.mark.parametrize("family", ["queue", "prototype", "recurrence"])
@pytest.mark.parametrize("name", list(ENGINES))
def test_every_engine_recovers_exactly(family, name):
    p, segs, ref = _case(family, seed=1)
    row = check_recovery(p, segs, make_engine(name, p, segs), ref)
    assert row["outcome"] == "M", row["message"]
    assert row["max_error"] <= 1e-14 and row["repeat_ok"]


def test_journal_of_only_the_segments_own_writes_is_caught_R6():
    # segment 0 reads X; later segments overwrite X. Own-writes-only journals cannot rebuild it.
    p, segs, ref = _case("queue", seed=2)
    bad = check_recovery(p, segs, RegionEngine(p, segs, cover_later_writes=False), ref)
    assert bad["outcome"] == "D" and "reads of op" in bad["message"]
    good = check_recovery(p, segs, RegionEngine(p, segs), ref)
    assert good["outcome"] == "M"
    assert good["retained_bytes"] > bad["retained_bytes"]  # the union costs bytes, and is needed


class _FreshNoiseWhole(WholeEngine):
    """Whole checkpoint that wrongly draws new noise from the live generator during replay."""

    def recover(self, seg, live, rng):
        a, b = self.segments[seg]
        run = execute(self.p, self.anchor[seg], rng, ops=self.p.ops[a:b], start=a, graph=False)
        from stateremat.reference.engines._base import op_read_from_record
        return Recovery({r.k: op_read_from_record(r) for r in run.records}, self.anchor[seg],
                        np.ones(self.p.nbytes, bool), self.anchor_rng[seg])


class _FinalStorageEager(EagerEngine):
    """Control: reads operands from the live (final) storage instead of the saved prestate."""

    def recover(self, seg, live, rng):
        a, b = self.segments[seg]
        return Recovery({k: op_read_from_state(self.p, k, live, self.noise.get(k)) for k in range(a, b)})


def test_drawing_new_noise_or_reading_final_storage_is_caught_R3_R1():
    p, segs, ref = _case("recurrence", seed=3)
    fresh = check_recovery(p, segs, _FreshNoiseWhole(p, segs), ref)
    assert fresh["outcome"] == "D" and "live state" in fresh["message"]  # generator advanced
    final = check_recovery(p, segs, _FinalStorageEager(p, segs), ref)
    assert final["outcome"] == "D" and "gradient error" in final["message"]


def test_retained_bytes_follow_each_engines_definition():
    p, segs, ref = _case("queue", d=8, steps=5, seed=4, rows=128)
    noise = sum(r.eps.nbytes for r in execute(p).records if r.eps is not None)
    eng = {n: make_engine(n, p, segs) for n in ENGINES}
    for e in eng.values():
        assert check_recovery(p, segs, e, ref)["outcome"] == "M"  # forward + two backwards
    assert eng["eager"].retained_bytes == len(p.ops) * (p.nbytes + RNG_STATE_BYTES) + noise
    assert eng["whole"].retained_bytes == len(segs) * (p.nbytes + RNG_STATE_BYTES) + noise
    reads = sum(sum(x.nbytes for x in r.xs) + (0 if r.index_values is None else r.index_values.nbytes)
                for r in execute(p).records)
    assert eng["readset"].retained_bytes == reads + noise
    g = eng["guarded"]
    assert set(g.choice.values()) <= {"journal", "anchor"}
    assert eng["region"].retained_bytes < eng["whole"].retained_bytes / 4  # sparse queue writes
    assert g.retained_bytes <= min(eng["region"].retained_bytes, eng["whole"].retained_bytes)
    assert eng["whole"].workspace_bytes >= p.nbytes  # a full working copy per replay
    assert eng["region"].workspace_bytes < p.nbytes  # in place: only touched bytes and reads
    # read-set: no values copied; the addresses it rebuilds for one segment are its workspace
    recs = {r.k: r for r in execute(p).records}
    addr = [sum(sum(o.nbytes for o in recs[k].src_offsets) + recs[k].dst_offsets.nbytes for k in range(a, b))
            for a, b in segs]
    assert eng["readset"].workspace_bytes == max(addr) > 0


def test_guarded_picks_the_anchor_when_the_journal_is_bigger():
    # tiny state, many later writes: the journal outgrows a whole anchor for early segments
    p, segs, ref = _case("recurrence", d=4, steps=5, seed=5, rows=1)
    g = GuardedEngine(p, segs)
    assert check_recovery(p, segs, g, ref)["outcome"] == "M"
    assert "anchor" in g.choice.values()


def test_semantic_programs_span_the_three_families():
    fams = {semantic_program(0, i)[0].family for i in range(3)}
    assert fams == {"queue", "prototype", "recurrence"}


def test_verify_engines_cli_summary_from_rows(tmp_path):
    out, js = tmp_path / "e", tmp_path / "e.json"
    res = CliRunner().invoke(app, ["verify", "engines", "--programs", "13", "--out", str(out),
                                   "--json", str(js)])
    assert res.exit_code == 0, res.output
    import json
    s = json.loads(js.read_text())
    assert s["programs"] == 13 and s["engines"] == list(ENGINES)
    assert s["recoveries_checked"] == s["recoveries_matched"] == 65
    assert s["max_grad_error"] <= 1e-14
    assert s["complex_step"]["programs"] == 2 and s["complex_step"]["max_error"] <= 1e-14
    assert s["retained_bytes_by_family"]["queue"]["region"] < s["retained_bytes_by_family"]["queue"]["whole"]
    rows = read_records(out, "engines")
    assert summarise_engines(rows) == s
    assert s["structural_checks"]["region"] == [] and s["structural_checks"]["readset"] == ["noise", "operand_values"]
    assert {"retained_bytes", "workspace_bytes", "source_hash", "outcome", "max_error"} <= set(rows.columns)


def test_structural_checks_are_named_and_the_generator_check_replays_the_draws():
    from stateremat.paper.verify._study import _draws_reproduce, _replays_to
    from stateremat.reference._replay import wrong_rng_state

    p, segs, ref = _case("recurrence", seed=6)
    rows = {n: check_recovery(p, segs, make_engine(n, p, segs), ref) for n in ENGINES}
    assert all(r["outcome"] == "M" for r in rows.values())
    assert rows["eager"]["structural_checks"] == "operand_values,restored_bytes"
    assert rows["whole"]["structural_checks"] == "restored_bytes"
    assert rows["readset"]["structural_checks"] == "noise,operand_values"
    assert rows["region"]["structural_checks"] == ""
    # the real checks: R_a must redraw the segment's noise and land on the next state
    fw_run = execute(p)
    truth = {r.k: r for r in fw_run.records}
    a, b = segs[0]
    eps = [truth[k].eps for k in range(a, b)]
    assert any(e is not None for e in eps)
    r_a, r_b = truth[a].rng_before, truth[b].rng_before
    assert _draws_reproduce(r_a, eps, r_b)
    assert not _draws_reproduce(wrong_rng_state(r_a), eps, r_b)
    assert not _draws_reproduce(r_a, [None if e is None else e + 1e-12 for e in eps], r_b)
    b0 = p.initial_bytes()
    b1 = execute(p, ops=p.ops[a:b]).bytes_
    assert _replays_to(p, b0, a, b, truth, b1)
    bad = b0.copy()
    bad[p.view("X").offset_bytes] ^= 1
    assert not _replays_to(p, bad, a, b, truth, b1)


class _WrongRngWhole(WholeEngine):
    """Whole checkpoint whose anchors keep the generator state one draw ahead (a corrupt record)."""

    def before_op(self, k, buf, rng):
        super().before_op(k, buf, rng)
        if k in self.starts:
            from stateremat.reference._replay import wrong_rng_state
            self.anchor_rng[self.starts[k]] = wrong_rng_state(rng.bit_generator.state)


def test_a_wrong_anchored_generator_state_is_caught_by_redrawing():
    p, segs, ref = _case("recurrence", seed=3)
    row = check_recovery(p, segs, _WrongRngWhole(p, segs), ref)
    assert row["outcome"] == "D" and "does not reproduce its draws" in row["message"]


@pytest.mark.parametrize("family, rows, seed", [("queue", 128, 4), ("recurrence", 1, 5), ("prototype", 8, 7)])
def test_guarded_drops_a_journal_once_it_outgrows_the_anchor(family, rows, seed):
    p, segs, ref = _case(family, d=4, steps=5, seed=seed, rows=rows)
    region, g = RegionEngine(p, segs), GuardedEngine(p, segs)
    assert check_recovery(p, segs, region, ref)["outcome"] == "M"
    assert check_recovery(p, segs, g, ref)["outcome"] == "M"
    anchor = p.nbytes + RNG_STATE_BYTES
    for s in range(len(segs)):  # the byte-count rule on the full (region) journal
        jb = region.journal_bytes(s) + RNG_STATE_BYTES
        assert g.choice[s] == ("journal" if jb <= anchor else "anchor")
        assert (s in g.anchor) == (g.choice[s] == "anchor")
        assert (g.journal[s] == []) or g.choice[s] == "journal"
    noise = sum(r.eps.nbytes for r in execute(p).records if r.eps is not None)
    kept = sum(min(region.journal_bytes(s) + RNG_STATE_BYTES, anchor) for s in range(len(segs)))
    assert g.retained_bytes == kept + noise
    # forward workspace: at most every anchor held at once plus journals capped near one anchor,
    # far below keeping both representations of every segment to the end
    both = sum(region.journal_bytes(s) + RNG_STATE_BYTES + anchor for s in range(len(segs)))
    assert g.workspace_bytes < both - kept
    if family == "queue":  # sparse writes: no journal can reach an anchor, so none is taken
        assert set(g.choice.values()) == {"journal"}
        assert g.workspace_bytes < p.nbytes
    if family == "recurrence":
        assert "anchor" in g.choice.values()
