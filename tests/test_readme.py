"""The README's code example runs and prints what the README says it prints."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_why_example_prints_documented_values():
    pytest.importorskip("torch")
    text = README.read_text()
    block = re.search(r"## Why.*?```python\n(.*?)```", text, re.S).group(1)
    expected = re.findall(r"# (tensor\([^)]*\).*)$", block, re.M)
    out = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines[0] == expected[0].split(":")[0].strip()
    assert lines[1] == "tensor(0.) True"


def _section(title):
    text = README.read_text()
    start = text.index(f"## {title}")
    end = text.index("\n## ", start + 3)
    return text[start:end]


def test_readme_your_own_model_blocks_run_and_print_what_they_say(capsys):
    from _clients import import_timm, import_transformers

    import_timm()
    import_transformers()
    blocks = re.findall(r"```python\n(.*?)```", _section("Your own model"), re.S)
    assert len(blocks) == 4
    namespace: dict = {}
    for block in blocks:  # the blocks build on each other (the second reuses the first's model)
        exec(compile(block, str(README), "exec"), namespace)
        printed = capsys.readouterr().out
        for line, expected in re.findall(r"^(print\(.*\))\s+# (.*)$", block, re.M):
            if line == "print(res.explain())":
                assert "(fits budget;" in printed and all(f"\n  {i} " in printed for i in range(1, 7)), printed[:300]
                continue
            value = expected.split(" (")[0]
            assert value in printed.splitlines(), (line, value, printed[-500:])


def test_readme_distributed_and_compiled_training_blocks_run_and_print_what_they_say(capsys):
    from _clients import import_transformers

    import_transformers()
    blocks = re.findall(r"```python\n(.*?)```", _section("Distributed and compiled training"), re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})
        printed = capsys.readouterr().out.splitlines()
        for _, expected in re.findall(r"^(print\(.*\))\s+# (.*)$", block, re.M):
            assert expected in printed, (expected, printed)


def test_readme_inline_calls_of_torch_wrappers_run_as_written():
    """Every inline ``apply_activation_checkpointing(...)`` the distributed section names runs as
    written (it once passed a keyword torch does not take), and the wrapped model trains as eager,
    BatchNorm statistics included, bit for bit."""
    import functools

    import torch
    from torch import nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing, checkpoint_wrapper)

    from stateremat.torch import checkpoint

    calls = re.findall(r"`(apply_activation_checkpointing\(.*?\))`", _section("Distributed and compiled training"))
    assert calls
    for call in calls:
        out = []
        for wrapped in (False, True):
            torch.manual_seed(0)
            model = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Tanh())
                                    for _ in range(2)]).double()
            if wrapped:
                names = {"model": model, "nn": nn, "functools": functools, "checkpoint": checkpoint,
                         "checkpoint_wrapper": checkpoint_wrapper,
                         "apply_activation_checkpointing": apply_activation_checkpointing}
                eval(call.replace("(model,", "(model, check_fn=lambda m: isinstance(m, nn.Sequential) and m is not model,", 1),
                     names)
                assert "CheckpointWrapper" in type(model[0]).__name__, call
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(2):
                x = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(step))
                opt.zero_grad()
                model(x).square().sum().backward()
                opt.step()
            out.append([t.clone() for t in model.state_dict().values()])
        assert all(torch.equal(a, b) for a, b in zip(*out)), call


def test_readme_report_command_on_a_kept_run_changes_no_committed_file(tmp_path):
    # issue 27 item 2: a README command run in a clean clone exits 0 and leaves every committed file as it is
    import subprocess
    import sys

    root = README.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True, timeout=120)
    line = next(ln for ln in README.read_text().splitlines() if ln.startswith("stateremat report results/cpu/"))
    argv = line.split("#")[0].split()[1:]
    env = dict(__import__("os").environ, PYTHONPATH=str(clone / "src"))
    done = subprocess.run([sys.executable, "-m", "stateremat", *argv], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=clone, capture_output=True,
                            text=True, check=True).stdout
    assert status == "", status
    assert any((clone / "runs").rglob("*.md"))  # it wrote its tables where --out said
