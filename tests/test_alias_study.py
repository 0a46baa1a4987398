"""Joint-alias study: typed aliases, integer reads, stored operations, unsupported outcomes."""
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from stateremat.cli import app
from stateremat.contract import UnsupportedError
from stateremat.paper.records import read_records
from stateremat.reference import execute, reverse_grad
from stateremat.paper.verify._families import integer_write_variant
from stateremat.paper.verify._study import admission, alias_program, alias_rows, stored_operations_ok
from stateremat.paper.verify._summary import summarise_alias


@pytest.mark.parametrize("pattern", ["queue", "prototype", "recurrence"])
def test_alias_inputs_combine_the_declared_hazards(pattern):
    p, segs = alias_program(0, pattern, 32)
    assert len(p.ops) == 16 and len(segs) == 4
    views = {v.name: v for v in p.views}
    assert views["ib32"].dtype == "i4" and views["ib32"].stride == 2      # strided integer alias
    x, s, xs = views["X"], views["S"], views["Xs"]
    assert x.offset_bytes < xs.offset_bytes < s.offset_bytes             # partial overlap of X and S
    run = execute(p)
    assert admission(p, run) is None
    assert any(r.index_values is not None for r in run.records)          # integer reads as indices
    assert any(r.kind == "iaffine" for r in run.records)                 # integer mutation


def test_stored_operations_expose_offsets_and_before_after_values():
    p, _ = alias_program(1, "queue", 32)
    run = execute(p)
    assert stored_operations_ok(p, run)
    r = run.records[0]
    assert r.dst_offsets.dtype == np.int64 and r.old_bytes.shape == r.new_bytes.shape
    assert r.old_bytes.shape[0] == len(r.dst_offsets)
    # a tampered stored operation breaks the chain B0 -> BT
    run.records[3].new_bytes = run.records[3].new_bytes ^ 1
    assert not stored_operations_ok(p, run)


def test_integer_write_into_float_storage_is_unsupported_never_a_gradient_R8():
    p, _ = alias_program(2, "prototype", 32)
    q = integer_write_variant(p)
    run = execute(q)
    assert "op" in admission(q, run)
    with pytest.raises(UnsupportedError, match="cannot differentiate"):
        reverse_grad(run)
    rows = alias_rows(2, "prototype", 32)
    iw = [r for r in rows if r["check"] == "integer_write_gradient"]
    assert len(iw) == 1 and iw[0]["outcome"] == "unsupported" and np.isnan(iw[0]["max_error"])
    assert {r["outcome"] for r in rows if r["check"] == "recovery"} == {"M"}


def test_verify_alias_cli(tmp_path):
    out, js = tmp_path / "a", tmp_path / "a.json"
    res = CliRunner().invoke(app, ["verify", "alias", "--seeds", "2", "--out", str(out), "--json", str(js)])
    assert res.exit_code == 0, res.output
    s = json.loads(js.read_text())
    assert s["inputs"] == 12 and s["supported_recoveries"] == s["matched"] == 60
    assert s["unsupported"] == 12 and s["stored_operations"] == 12 * 16
    assert s["max_grad_error"] <= 1e-14
    rows = read_records(out, "alias")
    assert summarise_alias(rows) == s
    assert "dim" in rows.columns and "dims" not in rows.columns  # one width column
    r = rows.iloc[-1]
    assert json.loads(r["program_seed"]) == [int(r["seed"]), 4, ["queue", "prototype", "recurrence"].index(
        r["pattern"]), int(r["dim"])]
    res = CliRunner().invoke(app, ["verify", "alias", "--seeds", "5:3", "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "half-open" in res.output
