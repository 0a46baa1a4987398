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


# ---------------------------------------------------------------- cpu-faithful preset (issue 26)
@pytest.mark.parametrize("activations", ["large", "small"])
@pytest.mark.parametrize("state_mib", [64, 1024])
def test_cpu_faithful_is_cpu_with_the_state_divided_by_64_only(activations, state_mib):
    cpu = preset_config("cpu", state_mib=state_mib, activations=activations, live_versions=64)
    faithful = preset_config("cpu-faithful", state_mib=state_mib, activations=activations,
                             live_versions=64)
    h100 = preset_config("h100", state_mib=state_mib, activations=activations, live_versions=64)
    assert faithful.state_bytes == h100.state_bytes // 64 == 16 * cpu.state_bytes
    # activations, counts and write fraction exactly as cpu: only the state differs
    assert faithful == cpu.replace(state_bytes=faithful.state_bytes)
    assert preset_budget(20, "cpu-faithful") == preset_budget(20, "cpu") == 20 * 1024**2


def test_cpu_faithful_workloads3_cells_differ_from_cpu_in_state_only():
    from stateremat.paper.bench import experiment_spec

    cpu, faithful = experiment_spec("workloads3", "cpu"), experiment_spec("workloads3", "cpu-faithful")
    assert [c.name for c in faithful.cells] == [c.name for c in cpu.cells]
    for a, b in zip(cpu.cells, faithful.cells):
        assert b.config.state_bytes == 16 * 1024**2 and b.config.write_rows == 524
        assert b.config == a.config.replace(state_bytes=b.config.state_bytes)
        assert (b.methods, b.budget_bytes, b.warmups, b.steps) == (a.methods, a.budget_bytes, a.warmups, a.steps)


def test_unknown_preset_is_refused_naming_cpu_faithful():
    with pytest.raises(ValueError, match="cpu-faithful.*Tip"):
        preset_config("cpu_faithful")


# ---------------------------------------------------------------- prototype draws in O(k)
def test_distinct_rows_are_distinct_sorted_in_range_and_a_function_of_the_generator():
    from stateremat.paper.workloads._chain import distinct_rows

    for rows, k in [(1, 1), (10, 5), (10, 6), (10, 10), (1000, 3), (1000, 500), (32768, 33)]:
        for seed in range(20):
            idx = distinct_rows(rows, k, torch.Generator().manual_seed(seed))
            assert idx.dtype == torch.int64 and idx.numel() == k == idx.unique().numel()
            assert bool((idx.diff() > 0).all()) and 0 <= int(idx.min()) and int(idx.max()) < rows
            again = distinct_rows(rows, k, torch.Generator().manual_seed(seed))
            assert torch.equal(idx, again)  # same generator state, same rows: replay sees them
    draws = {tuple(distinct_rows(1000, 3, torch.Generator().manual_seed(s)).tolist()) for s in range(20)}
    assert len(draws) == 20  # the generator decides the rows (not a fixed pattern)
    with pytest.raises(ValueError, match="k must be in"):
        distinct_rows(10, 11, torch.Generator())


def test_distinct_rows_is_a_uniform_subset_even_with_collisions():
    from stateremat.paper.workloads._chain import distinct_rows

    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(10)
    n = 4000
    for _ in range(n):
        counts[distinct_rows(10, 5, g)] += 1  # k = rows / 2: most draws collide
    assert float((counts / n - 0.5).abs().max()) < 0.04  # each row in half the subsets


def test_prototype_draws_allocate_o_k_not_o_rows():
    # 2^24 rows (a 256 MiB state of width 4, never allocated here), k = 0.001 of them: a
    # randperm(rows) would allocate 128 MiB of int64 per call; k indices need 16,777 x 8 bytes
    from stateremat.torch import PeakMemory

    cfg = WorkloadConfig(workload="prototype_memory", state_bytes=2**24 * 4 * 4, width=4, batch=8,
                         write_fraction=0.001, live_versions=2, segments=2)
    assert cfg.state_rows == 2**24 and cfg.write_rows == 16777
    with PeakMemory("cpu") as mem:
        idx = write_indices(cfg, 3, 1, "cpu")
    assert idx.numel() == 16777 == idx.unique().numel()
    assert mem.peak_bytes < 64 * cfg.write_rows * 8, mem.peak_bytes  # tens of k-sized tensors at most


def test_prototype_chain_replays_its_draws_under_region_and_whole_checkpoints():
    # the semantic check of the bench (replay equality against the functional reference, fp64)
    from stateremat.paper.bench._semantic import check_method

    cfg = WorkloadConfig(workload="prototype_memory", state_bytes=64 * 1024, width=16, batch=16,
                         write_fraction=0.01, live_versions=4, segments=4)
    for method, options in [("regions", ["region"] * 4), ("whole", ["whole"] * 4),
                            ("joint", ["region", "whole", "eager", "region"])]:
        res = check_method(method, cfg, options)
        assert res["semantic_checks"] == "pass", res["semantic_detail"]
