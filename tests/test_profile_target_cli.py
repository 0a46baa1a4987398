"""``stateremat profile pkg.module:factory`` profiles a user's own model (library CLI)."""
import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

FACTORY = textwrap.dedent("""
    import torch
    from torch import nn

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.Sequential(nn.Linear(32, 32), nn.BatchNorm1d(32), nn.Tanh()),
                              nn.Sequential(nn.Linear(32, 32), nn.BatchNorm1d(32), nn.Tanh()), nn.Linear(32, 1))
        return {"model": model, "sample": torch.randn(64, 8)}

    def pair():
        out = build()
        return out["model"], out["sample"]

    def wrong():
        return 42
""")


def _run(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "stateremat", "profile", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def test_profile_a_python_target_writes_a_card(tmp_path):
    (tmp_path / "mymodel.py").write_text(FACTORY)
    res = _run(tmp_path, "mymodel:build", "--out", "card.json", "--repeats", "1")
    assert res.returncode == 0, res.stderr
    card = json.loads((tmp_path / "card.json").read_text())
    assert [s["name"] for s in card["segments"]] == ["1", "2"]  # the repeated block
    assert set(card["segments"][0]["options"]) == {"eager", "whole", "region"}
    assert card["meta"]["model"] == "Sequential" and "wrote card.json: 2 segments" in res.stdout
    res = _run(tmp_path, "mymodel:pair", "--out", "c2.json", "--repeats", "1", "--segments", "2")
    assert res.returncode == 0, res.stderr
    assert [s["name"] for s in json.loads((tmp_path / "c2.json").read_text())["segments"]] == ["2"]


def test_profile_target_errors_name_the_target(tmp_path):
    (tmp_path / "mymodel.py").write_text(FACTORY)
    res = _run(tmp_path, "mymodel:wrong", "--out", "c.json")
    assert res.returncode == 2 and "mymodel:wrong returned int" in res.stderr
    res = _run(tmp_path, "nosuchmodule:build", "--out", "c.json")
    assert res.returncode == 2 and "cannot import 'nosuchmodule'" in res.stderr


def test_workload_only_options_are_refused_for_a_target_and_segments_items_are_stripped(tmp_path):
    (tmp_path / "mymodel.py").write_text(FACTORY)
    for flags in (["--preset", "tiny"], ["--state-mib", "64"], ["--dtype", "float64", "--live", "2"]):
        res = _run(tmp_path, "mymodel:build", "--out", "c.json", "--repeats", "1", *flags)
        assert res.returncode == 2, res.stderr
        assert "only to the built-in workloads" in res.stderr and flags[0] in res.stderr, res.stderr
        assert not (tmp_path / "c.json").exists()
    res = _run(tmp_path, "feature_queue", "--out", "c.json", "--segments", "1")
    assert res.returncode == 2 and "--segments applies only to a pkg.module:factory target" in res.stderr
    res = _run(tmp_path, "mymodel:build", "--out", "c.json", "--repeats", "1", "--segments", "1, 2")
    assert res.returncode == 0, res.stderr
    assert [s["name"] for s in json.loads((tmp_path / "c.json").read_text())["segments"]] == ["1", "2"]
    res = _run(tmp_path, "mymodel:build", "--out", "c.json", "--repeats", "1", "--segments", "1,")
    assert res.returncode == 2 and "--segments has an empty item" in res.stderr
