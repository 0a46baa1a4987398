"""DTensor state (issue 24 item 3) on 2 gloo ranks, float64, bit for bit against no checkpoint.

A ``DTensor`` has no storage of its own: stateremat declares, scans and watches it through its local
shard on each rank, and since a DTensor's in-place ops write the shard below ``__torch_function__``
(bumping only the DTensor's version counter), its writes are watched by the dispatch mode, which maps
a written DTensor to its shard, and the DTensor's version is a witness of the journal (R8).

- declared (``state="buffers"`` or ``state=[m.state]``), sharded or replicated, at every size around
  the 16 KiB small-storage threshold per rank, with ``whole`` and ``region`` (above the threshold a
  journal of the written runs, smaller than a snapshot): exact;
- written between the forward and the backward outside any segment: ``whole`` exact; ``region``
  refused as a journal gap (never silent), exact inside ``journal_writes()``;
- written undeclared (a 1-D float and a 2-D integer DTensor, small and large): refused, naming it;
  under ``on_undeclared="declare"`` snapshotted before its first write, exact.
"""
from __future__ import annotations

import pytest

from _dist import run_ranks
from _torch_dtensor_worker import SIZES, STEPS

SMALL_STORAGE_BYTES = 1 << 14


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return run_ranks("_torch_dtensor_worker.py", tmp_path_factory.mktemp("dtensor"), timeout=180)


@pytest.mark.dist
@pytest.mark.parametrize("placement", ["shard", "replicate"])
@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_declared_dtensor_is_preserved_through_its_local_shards_at_every_size(records, placement, preserve):
    for rank, rec in enumerate(records):
        for n in SIZES:
            for declare in ("buffers", "list"):
                r = rec[f"declared/{placement}/{n}/{preserve}/{declare}"]
                where = (rank, n, declare, r)
                assert "error" not in r, r.get("error")
                assert r["is_dtensor"] == "DTensor", where
                assert r["equal"] and r["losses_equal"], where  # parameters, local shards, losses
                assert r["replays"] == STEPS, where
                if preserve == "region" and r["shard_bytes"] > SMALL_STORAGE_BYTES:
                    assert 0 < r["peak_retained"] < r["shard_bytes"], where  # a journal of the written runs
                else:
                    assert r["peak_retained"] == r["shard_bytes"], where  # a whole snapshot of the shard


@pytest.mark.dist
def test_dtensor_written_outside_segments_is_exact_or_refused(records):
    for rec in records:
        for key in ("outside/write/whole", "outside/journal_writes/whole", "outside/journal_writes/region"):
            r = rec[key]
            assert "error" not in r, (key, r.get("error"))
            assert r["equal"] and r["losses_equal"], (key, r)
        r = rec["outside/write/region"]  # the journal never saw that write: a gap, refused at the replay
        assert r.get("error_type") == "ReplayError", r
        assert "'state'" in r["error_message"] and "version gap" in r["error_message"], r["error_message"]
        assert "journal_writes()" in r["error_message"], r["error_message"]


@pytest.mark.dist
def test_undeclared_dtensor_written_in_forward_is_named(records):
    for rec in records:
        for n in (SIZES[0], SIZES[-1]):
            for kind, name in (("float1d", "buffer 'state'"), ("int2d", "buffer 'hits'")):
                r = rec[f"undeclared/{n}/{kind}"]
                assert r.get("error_type") == "UndeclaredStateError", (n, kind, r)
                assert name in r["error_message"], r["error_message"]


@pytest.mark.dist
@pytest.mark.parametrize("cell", ["promoted", "auto"])
def test_undeclared_dtensor_is_preserved_by_declare_and_by_default_and_exact(records, cell):
    """``on_undeclared="declare"`` (promoted) and the default ``state="auto"``: the DTensor written
    in forward is preserved before its first write; exact at every size."""
    for rec in records:
        for n in (SIZES[0], SIZES[-1]):
            r = rec[f"{cell}/{n}"]
            assert "error" not in r, r.get("error")
            assert r["equal"] and r["losses_equal"], (n, r)
