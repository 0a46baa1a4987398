"""End to end: `stateremat app moco --preset tiny` runs seven methods with identical score files."""
from __future__ import annotations

import hashlib
import json

import pytest
from typer.testing import CliRunner

from stateremat.cli import app
from stateremat.paper.records import read_records
from stateremat.paper.moco._summary import summarize
from stateremat.paper.moco._summary import METHODS
from stateremat.paper.workloads._datasets import FASHION_MNIST_DIR

ENTRY_KEYS = {"method", "seed", "peak_bytes", "encoder_time_s", "test_accuracy",
              "test_cross_entropy", "scores_sha256", "policy", "status"}


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
    assert set(summary) == {"dataset", "seeds", "methods", "identical_within_seed",
                            "methods_compared"}
    assert summary["seeds"] == [2701] and summary["identical_within_seed"] is True
    assert summary["methods_compared"] == {"2701": 7}
    expected = "fashion-mnist" if (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file() else "digits"
    assert summary["dataset"] == expected
    assert [e["method"] for e in summary["methods"]] == list(METHODS)
    hashes = set()
    for e in summary["methods"]:
        assert set(e) == ENTRY_KEYS and e["status"] == "ok"
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
    # the shared machine's load next to every encoder time: "1-min 5-min 15-min running/total pid"
    assert all(len(v.split()) == 5 and float(v.split()[0]) >= 0 for v in rows["loadavg"])
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
    assert "7 of 7 methods compared" in md and "not interleaved" in md
    align = [ln for ln in md.splitlines() if ln.startswith("| :--")][0]
    assert align.split("|")[-2].strip() == ":--"   # the policy column is left-aligned
    assert (out / "moco_fig3c.png").stat().st_size > 0 and (out / "moco_fig3c.svg").is_file()


def test_changed_score_file_is_reported_as_a_mismatch(tiny_run, tmp_path):
    out, _ = tiny_run
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    # its own earlier report (the outputs the mismatch must keep), whatever ran before in this module
    assert CliRunner().invoke(app, ["report", str(copy)]).exit_code == 0
    f = copy / "scores" / "seed-2701" / "regions.npy"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1  # one bit of one score
    f.write_bytes(bytes(data))
    summary = summarize(copy)
    assert summary["identical_within_seed"] is None  # a storage problem, not a result
    assert summary["methods_compared"] == {"2701": 6}
    regions = [e for e in summary["methods"] if e["method"] == "regions"]
    assert [(e["scores_sha256"], e["status"]) for e in regions] == [(None, "score file mismatch")]
    # the report recomputes and rewrites summary.json, so the stale `true` cannot survive
    assert json.loads((copy / "summary.json").read_text())["identical_within_seed"] is True
    res = CliRunner().invoke(app, ["report", str(copy)])
    assert res.exit_code == 1, res.output
    assert "2701, regions (score file scores/seed-2701/regions.npy differs from its row's hash)" \
        in res.output
    # never deleted (issue 27): kept as they were and named stale until a new one replaces them
    assert "earlier outputs kept but stale: summary.json, moco_table9.md" in res.output
    assert json.loads((copy / "summary.json").read_text())["identical_within_seed"] is True
    res = CliRunner().invoke(app, ["report", str(copy), "--allow-incomplete"])
    assert res.exit_code == 0, res.output
    assert json.loads((copy / "summary.json").read_text()) == summary
    md = (copy / "moco_table9.md").read_text()
    assert "**False**" not in md and "**not assessed**: score files missing" in md
    assert "score file mismatch: regions" in md and "failed:" not in md


def test_bad_input_is_refused_clearly(tmp_path):
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "huge", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown --preset 'huge'" in r.output
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--methods", "eager,lazy",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown methods ['lazy']" in r.output
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--seeds", "5:5",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--seeds '5:5'" in r.output and "empty" in r.output


@pytest.mark.parametrize("extra, msg", [
    (["--methods", "eager,eager"], "names eager more than once"),
    (["--methods", "eager, whole,eager"], "names eager more than once"),
    (["--methods", ""], "names an empty method"),
    (["--methods", "eager,"], "names an empty method"),
    (["--seeds", "0:100000000000000000000"], "seeds must be at most 4294967295"),
    (["--seeds", "0:1001"], "1,001 seeds, more than the 1,000 allowed"),
    (["--threads", "100000"], "--threads must be >= 1 and <= 1,024, got 100000"),
])
def test_duplicate_empty_and_absurd_selections_are_refused_before_anything_is_written(
        tmp_path, extra, msg):
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--out", str(out), *extra])
    assert r.exit_code == 2 and msg in r.output and "Tip:" in r.output, r.output
    assert not out.exists()


def test_bad_threads_and_device_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    import torch

    out = tmp_path / "run"
    for extra, msg in ((["--threads", "0"], "--threads must be >= 1 and <= 1,024, got 0"),
                       (["--threads", "-2"], "--threads must be >= 1 and <= 1,024, got -2"),
                       (["--device", "bogus"], "--device 'bogus' is not a device name"),
                       (["--device", "meta"], "expected cpu or cuda[:N]")):
        r = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--out", str(out), *extra])
        assert r.exit_code == 2 and msg in r.output and r.exception is not None, r.output
        assert "Traceback" not in r.output and not out.exists()
    # the library entry point refuses the same input before loading data or writing
    from stateremat.paper.moco._app import PRESETS, run_moco

    with pytest.raises(ValueError, match="at least 1, got 0"):
        run_moco(PRESETS["tiny"], [2701], out, threads=0, progress=False)
    with pytest.raises(ValueError, match="not a device name"):
        run_moco(PRESETS["tiny"], [2701], out, device="bogus", progress=False)
    assert not out.exists()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--out", str(out),
                                 "--device", "cuda"])
    assert r.exit_code == 2 and "torch.cuda.is_available() is False" in r.output, r.output
    assert not out.exists()
    (tmp_path / "file").write_text("x")
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny",
                                 "--out", str(tmp_path / "file")])
    assert r.exit_code == 2 and "is a file, not a folder" in r.output


def test_failed_runs_are_printed_and_digits_fallback_is_warned(tmp_path, monkeypatch):
    import stateremat.paper.moco._app as moco_app
    import stateremat.paper.workloads._datasets as datasets

    def boom(*args, **kwargs):
        raise RuntimeError("synthetic failure in training\nsecond line not shown")

    monkeypatch.setattr(datasets, "FASHION_MNIST_DIR", tmp_path / "no-package")
    monkeypatch.setattr(moco_app, "train_one", boom)
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--methods", "eager,whole",
                                 "--seeds", "2701:2702", "--out", str(out)])
    assert r.exit_code == 1, r.output
    assert "warning: load_dataset: Fashion-MNIST package files not found" in r.output
    for m in ("eager", "whole"):
        assert f"failed: seed 2701 {m}: RuntimeError: synthetic failure in training" in r.output
    assert "second line" not in r.output
    assert "fell back" in json.loads((out / "moco.json").read_text())["config"]["data_note"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "digits" and summary["identical_within_seed"] is False
    assert [e["status"] for e in summary["methods"]] == ["failed", "failed"]
    assert summary["methods_compared"] == {"2701": 0}


def test_cifar100_archive_path_runs_end_to_end(tmp_path):
    import numpy as np
    from test_datasets_moco import _write_cifar100

    _write_cifar100(tmp_path / "data", 300, 64, np.random.default_rng(2))
    data = tmp_path / "data" / "cifar-100-python"
    # --dataset fashion-mnist on a CIFAR-100 folder: a tip, not a Fashion-MNIST "not found"
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--dataset", "fashion-mnist",
                                 "--data", str(data), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "looks like CIFAR-100" in r.output
    assert "add --dataset cifar-100" in r.output and "Fashion-MNIST" in r.output
    out = tmp_path / "run"
    # no --dataset: the folder's files say CIFAR-100
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "tiny", "--data", str(data),
                                 "--methods", "eager,deferred", "--seeds", "2701:2702",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "holds cifar-100; using it" in r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "cifar-100"
    # two of seven methods agree, but identity across the seven is not assessed
    assert summary["identical_within_seed"] is None and summary["methods_compared"] == {"2701": 2}
    assert len({e["scores_sha256"] for e in summary["methods"]}) == 1
    assert json.loads((out / "moco.json").read_text())["config"]["preset"]["dataset"] == "cifar-100"
    r = CliRunner().invoke(app, ["app", "moco", "--preset", "paper", "--out", str(tmp_path / "p")])
    assert r.exit_code == 2 and "needs --data" in r.output


def test_a_failed_run_is_retried_on_resume_and_finished_ones_are_not(tmp_path, monkeypatch):
    import stateremat.paper.moco._app as moco_app

    real, calls = moco_app.train_one, []

    def flaky(preset, split, seed, method, *args, **kwargs):
        calls.append(method)
        if method == "whole" and calls.count("whole") == 1:
            raise RuntimeError("synthetic failure of the first attempt")
        return real(preset, split, seed, method, *args, **kwargs)

    monkeypatch.setattr(moco_app, "train_one", flaky)
    out = tmp_path / "run"
    argv = ["app", "moco", "--preset", "tiny", "--methods", "eager,whole", "--seeds", "2701:2702",
            "--out", str(out)]
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 1 and "failed: seed 2701 whole: RuntimeError" in r.output, r.output
    rows = read_records(out, "moco")
    assert sorted(zip(rows["method"], rows["outcome"])) == [("eager", "ok"), ("whole", "error")]
    r = CliRunner().invoke(app, ["report", str(out)])
    assert r.exit_code == 1 and "1 of 2 (seed, method) units have no complete rows" in r.output
    r = CliRunner().invoke(app, argv)  # resume: only the failed run again
    assert r.exit_code == 0, r.output
    assert calls == ["eager", "whole", "whole"]
    rows = read_records(out, "moco")
    assert sorted(zip(rows["method"], rows["outcome"])) == [("eager", "ok"), ("whole", "error"),
                                                            ("whole", "ok")]  # every attempt kept
    assert [e["status"] for e in summarize(out)["methods"]] == ["ok", "ok"]
    assert CliRunner().invoke(app, ["report", str(out)]).exit_code == 0
