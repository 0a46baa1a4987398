"""The torch runtime: thread-local bookkeeping, private torch symbols behind one door (issue 12)."""
from __future__ import annotations

import ast
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from stateremat.torch import StatefulCheckpoint, checkpoint

TORCH_PKG = Path(__file__).resolve().parents[1] / "src" / "stateremat" / "torch"


class _Model(nn.Module):
    """A BatchNorm block and a queue written in place: state in every segment."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.lin = nn.Linear(6, 6).double()
        self.bn = nn.BatchNorm1d(6).double()
        self.register_buffer("queue", torch.randn(32, 6, generator=g, dtype=torch.float64))
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(6, 6, generator=g, dtype=torch.float64))
            self.lin.bias.copy_(torch.randn(6, generator=g, dtype=torch.float64))

    def forward(self, x, step):
        h = self.bn(self.lin(x)).tanh()
        loss = (h @ self.queue.clone().T).logsumexp(1).mean()
        self.queue[step % 4 * 8:(step % 4 + 1) * 8] = h.detach()
        return loss


def _train(model: nn.Module, wrap, steps: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    grads = []
    for step in range(steps):
        x = torch.randn(8, 6, generator=g, dtype=torch.float64)
        model.zero_grad()
        wrap(model, x, step).backward()
        grads.append(model.lin.weight.grad.clone())
    return grads, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("preserve", ["region", "whole"])
def test_two_threads_checkpointing_two_models_match_eager(preserve):
    eager = {s: _train(_Model(s), lambda m, x, k: m(x, k), 6, s) for s in (1, 2)}
    out: dict[int, object] = {}
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            out[seed] = _train(_Model(seed), lambda m, x, k: checkpoint(m, x, k, state=[m], preserve=preserve), 6,
                               seed)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for s in (1, 2):
        grads, state = out[s]
        ref_grads, ref_state = eager[s]
        assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
        assert all(torch.equal(state[k], ref_state[k]) for k in ref_state)


def test_wrapped_block_in_a_thread_keeps_batchnorm_exactly_once():
    ref = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).double()
    block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).double()
    block.load_state_dict(ref.state_dict())
    wrapped = StatefulCheckpoint(block, preserve="region")
    x = torch.randn(8, 4, dtype=torch.float64)
    ref(x).sum().backward()
    t = threading.Thread(target=lambda: wrapped(x).sum().backward())
    t.start()
    t.join()
    assert torch.equal(block[1].running_mean, ref[1].running_mean)
    assert int(block[1].num_batches_tracked) == 1


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def _private_torch(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "torch" and any(p.startswith("_") for p in parts[1:])


def test_private_torch_symbols_only_through_compat():
    offenders = {}
    for path in TORCH_PKG.rglob("*.py"):
        if path.name == "_compat.py":
            continue
        bad = [n for n in _imports(path) if _private_torch(n)]
        if bad:
            offenders[str(path.relative_to(TORCH_PKG))] = bad
    assert offenders == {}
    assert any(_private_torch(n) for n in _imports(TORCH_PKG / "_compat.py"))  # the door is used


def test_missing_private_symbol_fails_at_import_naming_the_versions():
    code = ("import torch.utils.checkpoint as c\n"
            "del c.GraphExecGroup\n"
            "try:\n"
            "    import stateremat.torch\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "stateremat.torch needs torch >=2.13,<2.14" in res.stdout
    assert "GraphExecGroup" in res.stdout and "torch==2.13.0" in res.stdout


@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_preservation_counters_are_keyed_by_the_preservers_option(preserve):
    """Each preserver charges what it keeps under its own option name (issue 23, item 4): a
    64 KiB buffer (above the small-storage threshold) written at one element costs its whole
    storage under ``whole`` and the written bytes under ``region``; both are freed after backward."""
    import stateremat.torch as st

    buf = torch.zeros(1 << 14)  # 64 KiB
    w = torch.ones(3, requires_grad=True)

    def seg(x):
        buf.narrow(0, 7, 1).add_(1.0)  # one 4-byte write
        return (x * w).sum()

    import gc

    gc.collect()  # segments an earlier test left unbackwarded in a cycle
    st.reset_preservation_stats()
    before = dict(st.preservation_stats().retained_by_option)  # still held by an earlier test's graph
    loss = st.checkpoint(seg, torch.ones(3), state=[buf], preserve=preserve)
    now = st.preservation_stats().retained_by_option
    held = {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}
    assert held == ({"whole": buf.nbytes} if preserve == "whole" else {"region": 4})
    assert st.preservation_stats().retained_state_bytes - sum(before.values()) == sum(held.values())
    loss.backward()
    assert st.preservation_stats().retained_by_option == {k: v for k, v in before.items() if v}
    assert buf[7].item() == 1.0 and w.grad.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("preserve_rng_state", [True, False])
def test_cuda_first_initialized_inside_a_segment_is_refused_after_its_forward(monkeypatch, preserve_rng_state):
    """R3: a segment that initializes CUDA itself has no CUDA generator state from its forward's
    start: refused (and released) after the forward, unless it keeps no RNG state at all."""
    import stateremat.torch as st
    from stateremat.torch import _rng

    ready = [False]
    monkeypatch.setattr(_rng, "cuda_ready", lambda: ready[0])
    buf = torch.zeros(4)

    def seg(x):
        ready[0] = True  # as torch.cuda.init() inside the forward would
        buf.add_(1.0)
        return (x * 2).sum()

    st.reset_preservation_stats()
    x = torch.ones(3, requires_grad=True)
    if preserve_rng_state:
        with pytest.raises(st.ReplayError, match="CUDA was initialized inside segment") as err:
            st.checkpoint(seg, x, state=[buf], preserve_rng_state=True)
        assert "torch.cuda.init()" in str(err.value)
        assert st.preservation_stats().retained_state_bytes == 0  # released
        ready[0] = True  # the tip: CUDA initialized before the first checkpoint
    loss = st.checkpoint(seg, x, state=[buf], preserve_rng_state=preserve_rng_state)
    loss.backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
