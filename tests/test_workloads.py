"""Workloads: shapes, presets and the functional reference agree with the stateful chain."""
import pytest

torch = pytest.importorskip("torch")

from stateremat.paper.workloads import (  # noqa: E402
    CPU_BYTES_FACTOR, WORKLOADS, StatefulChain, WorkloadConfig, loss_fn, make_batch,
    preset_budget, preset_config, write_indices,
)


def test_cpu_preset_is_the_h100_shape_scaled_by_one_factor():
    big = preset_config("h100")
    small = preset_config("cpu")
    assert (big.state_bytes, big.width, big.batch, big.live_versions) == (1024**3, 4096, 65536, 16)
    assert big.state_bytes // small.state_bytes == CPU_BYTES_FACTOR
    assert (big.width * big.batch) // (small.width * small.batch) == CPU_BYTES_FACTOR
    assert preset_budget(32, "h100") // preset_budget(32, "cpu") == CPU_BYTES_FACTOR
    assert preset_budget(44, "cpu") == 44 * 1024**2
    assert big.write_fraction == small.write_fraction and big.granularity_bytes is small.granularity_bytes is None


def test_bad_config_is_refused_with_a_tip():
    with pytest.raises(ValueError, match="write_fraction.*Tip"):
        WorkloadConfig(write_fraction=0)
    with pytest.raises(ValueError, match="workload"):
        WorkloadConfig(workload="kv_cache")
    with pytest.raises(ValueError, match="live_versions"):
        WorkloadConfig(live_versions=5, segments=4)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_indices_are_distinct_and_sized_by_write_fraction(workload):
    cfg = WorkloadConfig(workload=workload, state_bytes=64 * 1024, width=16, batch=8,
                         write_fraction=0.01, live_versions=4, segments=4)
    assert cfg.state_rows == 1024 and cfg.write_rows == 10
    for step in range(3):
        for seg in range(4):
            idx = write_indices(cfg, step, seg, "cpu")
            assert idx.numel() == 10 and idx.unique().numel() == 10
            assert int(idx.min()) >= 0 and int(idx.max()) < 1024
    # same (step, segment) -> same rows: replay touches what the forward touched
    assert torch.equal(write_indices(cfg, 2, 1, "cpu"), write_indices(cfg, 2, 1, "cpu"))


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("write_fraction", [0.01, 1.0])
def test_stateful_chain_equals_functional_reference(workload, write_fraction):
    cfg = WorkloadConfig(workload=workload, state_bytes=16 * 1024, width=16, batch=32,
                         write_fraction=write_fraction, live_versions=3, segments=4, dtype="float64")
    chain = StatefulChain(cfg)
    x = make_batch(cfg)
    s0 = chain.state.clone()
    s0_copy = s0.clone()
    torch.manual_seed(5)
    y = chain(x, 1)
    loss_fn(y).backward()
    grads = [p.grad.clone() for p in chain.parameters()]
    s1 = chain.state.clone()
    assert not torch.equal(s0, s1)  # the buffer was written
    changed_rows = int((s0 != s1).any(dim=1).sum())
    assert changed_rows <= 3 * cfg.write_rows
    chain.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    y2, s2 = chain.functional(x, s0, 1)
    loss_fn(y2).backward()
    assert torch.equal(y, y2) and torch.equal(s1, s2)
    assert torch.equal(s0, s0_copy)  # out-of-place: the input version is untouched
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, chain.parameters()))


def test_dropout_consumes_rng_and_replay_needs_it():
    cfg = WorkloadConfig(state_bytes=16 * 1024, width=16, batch=32, live_versions=2, segments=2,
                         dropout=0.5, dtype="float64")
    chain = StatefulChain(cfg)
    x = make_batch(cfg)
    s0 = chain.state.clone()
    torch.manual_seed(1)
    a = chain.functional(x, s0, 0)[0]
    torch.manual_seed(2)
    b = chain.functional(x, s0, 0)[0]
    assert not torch.equal(a, b)


def test_segment_names_are_module_paths():
    cfg = WorkloadConfig(state_bytes=16 * 1024, width=16, batch=8, live_versions=2, segments=3)
    chain = StatefulChain(cfg)
    assert chain.segment_names == ["seg0", "seg1", "seg2"]
    assert not chain.seg0.live and chain.seg1.live and chain.seg1.state is chain.seg2.state
    assert chain.get_submodule("seg2") is chain.seg2


@pytest.mark.parametrize("workload", ["prototype_memory", "unrolled_recurrence"])
def test_eager_retention_does_not_grow_with_the_write_fraction(workload):
    # the scores keep only the key rows, never the whole gathered read set (dense writes)
    from stateremat.torch import PeakMemory

    kept = {}
    for wf in (0.01, 1.0):
        cfg = WorkloadConfig(workload=workload, state_bytes=64 * 1024, width=16, batch=32,
                             write_fraction=wf, live_versions=2, segments=2)
        chain = StatefulChain(cfg)
        x = make_batch(cfg)
        with PeakMemory("cpu", roots=[*chain.parameters(), chain.state, x]) as pm:
            y = chain(x, 0)
            kept[wf] = pm.current_bytes - pm.baseline_bytes
        del y
    assert kept[1.0] - kept[0.01] < 4096
