"""The CPU live-storage tracker against known allocations (DESIGN.md, Measurement rules)."""
import pytest

torch = pytest.importorskip("torch")

from stateremat.torch._memory import CPU_METHOD, PeakMemory, memory_method, storage_bytes  # noqa: E402


def test_fresh_allocation_raises_peak_by_its_bytes():
    with PeakMemory("cpu") as pm:
        a = torch.empty(1000, dtype=torch.float32)
        assert pm.current_bytes == 4000
    assert pm.peak_bytes == 4000 and pm.method == CPU_METHOD
    del a


def test_freed_tensors_decrease_and_peak_is_the_maximum():
    with PeakMemory("cpu") as pm:
        a = torch.ones(250, dtype=torch.float64)  # 2000 B
        b = torch.ones(500, dtype=torch.float64)  # 4000 B
        assert pm.current_bytes == 6000
        del a, b
        assert pm.current_bytes == 0
        c = torch.ones(100, dtype=torch.float64)  # 800 B
        assert pm.current_bytes == 800
    assert pm.peak_bytes == 6000
    del c


def test_views_and_inplace_do_not_count_again_and_roots_form_the_baseline():
    x = torch.zeros(1024)  # 4096 B root
    with PeakMemory("cpu", roots=[x, x[10:]]) as pm:
        assert pm.baseline_bytes == 4096
        v = x[100:200]
        x.add_(1.0)
        v.mul_(2.0)
        assert pm.current_bytes == 4096
        y = x * 2  # fresh 4096 B
        assert pm.current_bytes == 8192
        del y
    assert pm.peak_bytes == 8192


def test_autograd_saved_tensors_and_backward_are_tracked():
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)
    with PeakMemory("cpu", roots=[w, x]) as pm:
        h = torch.tanh(x @ w)  # saved output 32*64*4 = 8192 B
        loss = h.sum()
        mid = pm.current_bytes
        loss.backward()
    # after forward: h (8192 B, saved by tanh) and the scalar loss (4 B); x @ w was freed
    assert mid == pm.baseline_bytes + 8192 + 4
    # the forward peak held x @ w and tanh's output together; backward kept w.grad (16384 B)
    assert pm.peak_bytes >= pm.baseline_bytes + 2 * 8192
    assert pm.peak_bytes >= pm.baseline_bytes + 16384 + 4
    assert storage_bytes([w.grad]) == 16384


def test_storage_bytes_dedupes_views():
    t = torch.zeros(10, 10)
    assert storage_bytes([t, t[0], t.T, 3, None]) == 400


def test_memory_method_names_the_device_method():
    assert memory_method("cpu") == CPU_METHOD
    assert memory_method("cuda") == "cuda_max_memory_allocated"


def _malloc_in_use():
    """glibc's own count of bytes in use (mmapped + arena), independent of torch; or None."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    fn.restype = MallInfo2
    return lambda: (lambda m: m.hblkhd + m.uordblks)(fn())


@pytest.mark.parametrize("policy", ["eager", "whole", "region"])
def test_cpu_tracker_peak_equals_the_c_allocators_in_use_peak(policy):
    """The tracker's step peak equals glibc's in-use peak (sampled after every op) within
    64 KiB of Python-object noise, for eager and for replaying (whole/region) policies."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from stateremat.paper.bench._methods import build_method
    from stateremat.paper.workloads import preset_config

    in_use = _malloc_in_use()
    if in_use is None:
        pytest.skip("glibc mallinfo2 is not available")

    class Probe(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.start, self.peak = in_use(), 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.peak = max(self.peak, in_use() - self.start)
            return out

    run = build_method("check", preset_config("cpu", live_versions=2), [policy] * 2)
    run.train_step(0)
    run.train_step(1)
    with PeakMemory("cpu", roots=run.roots) as pm:
        run.train_step(2)
    probe = Probe()
    with probe:
        run.train_step(3)
    tracked = pm.peak_bytes - pm.baseline_bytes
    assert tracked > 4 * 2**20  # activations of two segments, not a trivially small step
    assert abs(tracked - probe.peak) <= 64 * 1024, (tracked, probe.peak)
