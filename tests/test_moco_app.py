"""End to end: `stateremat app moco --preset tiny` runs seven methods with identical score files."""
from __future__ import annotations

import hashlib
import json

import pytest
from typer.testing import CliRunner

from stateremat.cli import app
from stateremat.contract import read_records
from stateremat.experiments._moco_summary import summarize
from stateremat.experiments._moco_summary import METHODS
from stateremat.workloads._datasets import FASHION_MNIST_DIR

ENTRY_KEYS = {"method", "seed", "peak_bytes", "encoder_time_s", "test_accuracy",
              "test_cross_entropy", "scores_sha256", "policy"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("moco")
    res = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--seeds", "2701:2702",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output + repr(res.exception)
    return out, res.output


def test_tiny_seven_methods_have_identical_score_files(tiny_run):
    out, output = tiny_run
    assert "identical_within_seed=True" in output
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"dataset", "seeds", "methods", "identical_within_seed"}
    assert summary["seeds"] == [2701] and summary["identical_within_seed"] is True
    expected = "fashion-mnist" if (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file() else "digits"
    assert summary["dataset"] == expected
    assert [e["method"] for e in summary["methods"]] == list(METHODS)
    hashes = set()
    for e in summary["methods"]:
        assert set(e) == ENTRY_KEYS
        f = out / "scores" / "seed-2701" / f"{e['method']}.npy"
        assert e["scores_sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
        hashes.add(e["scores_sha256"])
        assert len(e["policy"]) == 7 and e["peak_bytes"] > 0 and e["encoder_time_s"] > 0
    assert len(hashes) == 1
    by = {e["method"]: e for e in summary["methods"]}
    assert set(by["whole"]["policy"]) == {"whole"} and set(by["regions"]["policy"]) == {"region"}
    assert set(by["joint"]["policy"]) <= {"eager", "whole", "region"}
    # replay frees activations: every all-replay method peaks below strict eager
    for m in ("whole", "regions", "functional"):
        assert by[m]["peak_bytes"] < by["eager"]["peak_bytes"]
    # 1,000 balanced official test images: chance is 10 %; 3 standard errors is ~2.8 points
    assert by["eager"]["test_accuracy"] > 0.15
    rows = read_records(out, "moco")
    assert (rows["outcome"] == "ok").all() and len(rows) == 7
    assert rows["encoder_sha256"].nunique() == 1 and rows["loss_sha256"].nunique() == 1
    planned = rows[rows["method"].isin(["state_agnostic", "joint"])]
    assert planned["feasible"].all() and (planned["predicted_peak_bytes"] <= planned["budget_bytes"]).all()


def test_rerun_resumes_without_redoing_rows(tiny_run):
    out, _ = tiny_run
    n = len(read_records(out, "moco"))
    res = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--seeds", "2701:2702",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert len(read_records(out, "moco")) == n


def test_report_writes_table_and_figure(tiny_run):
    out, _ = tiny_run
    res = CliRunner().invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    md = (out / "moco_table9.md").read_text()
    assert "| Joint |" in md and "byte-identical within every seed: **True**" in md
    assert (out / "moco_fig3c.png").stat().st_size > 0 and (out / "moco_fig3c.svg").is_file()


def test_changed_score_file_is_reported_as_a_mismatch(tiny_run, tmp_path):
    out, _ = tiny_run
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    f = copy / "scores" / "seed-2701" / "regions.npy"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1  # one bit of one score
    f.write_bytes(bytes(data))
    summary = summarize(copy)
    assert summary["identical_within_seed"] is False
    assert [e["scores_sha256"] for e in summary["methods"] if e["method"] == "regions"] == [None]


def test_bad_input_is_refused_clearly(tmp_path):
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "huge", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown --preset 'huge'" in r.output
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--methods", "eager,lazy",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown methods ['lazy']" in r.output
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--seeds", "5:5",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 2 and "bad --seeds" in r.output


def test_cifar100_archive_path_runs_end_to_end(tmp_path):
    import numpy as np
    from test_datasets_moco import _write_cifar100

    _write_cifar100(tmp_path / "data", 300, 64, np.random.default_rng(2))
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--dataset", "cifar-100",
                                 "--data", str(tmp_path / "data"), "--methods", "eager,deferred",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output + repr(r.exception)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "cifar-100" and summary["identical_within_seed"] is True
    assert json.loads((out / "moco.json").read_text())["config"]["preset"]["dataset"] == "cifar-100"
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "paper", "--out", str(tmp_path / "p")])
    assert r.exit_code == 2 and "needs --data" in r.output
