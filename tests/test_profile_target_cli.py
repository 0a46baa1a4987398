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


BAD_PARTS = textwrap.dedent("""
    import torch
    from torch import nn

    def one_optimizer():
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        x = torch.randn(2, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def step(m):
            m(x).sum().backward()
            opt.step()
        return {"model": model, "step_fn": step, "optimizers": opt}

    def not_a_module():
        return {"model": lambda t: t, "sample": torch.randn(2, 4)}

    def own_type_error():
        def step(m):
            raise TypeError("the user's own bug")
        return {"model": nn.Sequential(nn.Linear(4, 4)), "step_fn": step}
""")


@pytest.mark.parametrize("factory, words", [
    ("one_optimizer", "optimizers must be a list of optimizers, got one SGD"),
    ("not_a_module", "model must be an nn.Module"),
])
def test_a_factory_whose_parts_profile_refuses_exits_2(tmp_path, factory, words):
    """profile's own TypeError (a single optimizer, a function for the model) was a raw
    traceback with exit 1; now one error line naming the target, exit 2."""
    (tmp_path / "bad.py").write_text(BAD_PARTS)
    res = _run(tmp_path, f"bad:{factory}", "--segments", "0", "--out", "c.json", "--repeats", "1")
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert f"bad:{factory} returned what profile refuses: stateremat.torch.profile: {words}" in res.stderr
    assert not (tmp_path / "c.json").exists()


def test_a_type_error_in_the_users_own_step_keeps_its_traceback(tmp_path):
    (tmp_path / "bad.py").write_text(BAD_PARTS)
    res = _run(tmp_path, "bad:own_type_error", "--segments", "0", "--out", "c.json", "--repeats", "1")
    assert res.returncode == 1 and "the user's own bug" in res.stderr and "Traceback" in res.stderr
