"""Peak memory of one training step: CUDA allocator peak, or a live tensor-storage tracker on CPU.

DESIGN.md "Measurement rules": on CUDA the peak is ``torch.cuda.max_memory_allocated`` after a
reset; on CPU it is the peak of live tensor storage bytes during the step. The CPU tracker is a
``TorchDispatchMode``: every op output whose storage is fresh (shared with no input) is registered
once with its byte size and a ``weakref.finalize`` on the storage object (torch keeps one Python
object per live storage, so the finalizer fires exactly when the storage is freed). Baseline bytes
are the unique storages of the ``roots`` that exist before the step (parameters, gradients, state,
inputs). Every record says which method measured its memory (``memory_method``).
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Iterable

import torch

from ._compat import TorchDispatchMode, tree_flatten

CUDA_METHOD = "cuda_max_memory_allocated"
CPU_METHOD = "cpu_live_storage_tracker"


def _storages(tensors: Iterable[Any]) -> dict[int, torch.UntypedStorage]:
    out: dict[int, torch.UntypedStorage] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            st = t.untyped_storage()
            out[id(st)] = st
        elif isinstance(t, torch.UntypedStorage) and t.device.type != "meta":
            out[id(t)] = t
    return out


def storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the unique storages behind ``tensors`` (views of one storage count once).

    Args:
        tensors: any iterable of tensors or ``torch.UntypedStorage``; anything else is ignored.

    Returns:
        Sum of ``untyped_storage().nbytes()`` over distinct storages, in bytes.
    """
    return sum(st.nbytes() for st in _storages(tensors).values())


class _StorageTracker(TorchDispatchMode):
    """Counts bytes of live storages first produced by an op while the mode is active.

    ``current_bytes`` is relative to the baseline (the ``known`` storages): a known storage
    freed inside the block (``zero_grad(set_to_none=True)`` frees gradients) lowers it.
    """

    def __init__(self, known: dict[int, torch.UntypedStorage]):
        super().__init__()
        self._known = set(known)  # ids of storages counted in the baseline
        self._size: dict[int, int] = {}
        self._finalizers: list[weakref.finalize] = []
        self._lock = threading.Lock()
        self.current_bytes = 0
        self.peak_bytes = 0
        for key, st in known.items():  # a baseline storage freed inside the block leaves the count
            self._size[key] = st.nbytes()
            self._finalizers.append(weakref.finalize(st, self._free, key))

    def _free(self, key: int) -> None:
        with self._lock:
            self.current_bytes -= self._size.pop(key, 0)
            self._known.discard(key)  # a freed root's id may be reused by a new storage

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs, _ = tree_flatten(out)
        fresh = [t for t in outs if isinstance(t, torch.Tensor) and t.device.type != "meta"]
        if not fresh:
            return out
        ins, _ = tree_flatten((args, kwargs))
        input_ids = set(_storages(ins))
        for key, st in _storages(fresh).items():
            n = st.nbytes()
            with self._lock:
                if key in self._size:  # resized in place (out= ops): keep the count exact
                    self.current_bytes += n - self._size[key]
                    self._size[key] = n
                elif key in input_ids or key in self._known:
                    continue  # an alias of a storage that existed before this op
                else:
                    self._size[key] = n
                    self.current_bytes += n
                    self._finalizers.append(weakref.finalize(st, self._free, key))
                self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        return out

    def new_storages(self) -> list[torch.UntypedStorage]:
        """Live storages first produced inside the block (not the baseline's)."""
        out = []
        for f in self._finalizers:
            got = f.peek()
            if got is not None and got[2][0] not in self._known:
                out.append(got[0])
        return out

    def detach_all(self) -> None:
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()


class PeakMemory:
    """Context manager measuring the peak bytes allocated during a block (one training step).

    On CUDA: resets the allocator peak on entry; ``peak_bytes`` is
    ``torch.cuda.max_memory_allocated(device)`` on exit (everything on the device counts) — or,
    when ``roots`` are given, the roots' bytes plus the allocator peak above the bytes allocated
    at entry (so other models held on the same device are not charged to this step).
    On CPU: ``peak_bytes`` = bytes of the unique storages of ``roots`` at entry plus the peak of
    live storage bytes first produced by ops inside the block.

    Args:
        device: ``"cpu"`` or a CUDA device (``"cuda"``, ``"cuda:0"``, ``torch.device``).
        roots: tensors (or ``torch.UntypedStorage``) alive before the block that belong to the
            step's footprint (parameters, their ``.grad``, declared state, input batch,
            optimizer state). On CPU a root freed inside the block stops counting.

    Attributes (after exit):
        peak_bytes: peak bytes during the block, including the baseline.
        baseline_bytes: bytes at entry (storages of ``roots``; CUDA without roots:
            ``memory_allocated``).
        method: ``"cuda_max_memory_allocated"`` or ``"cpu_live_storage_tracker"``.

    Danger:
        The CPU tracker sees storages created by torch ops dispatched while it is active; bytes
        allocated outside the dispatcher (e.g. ``torch.get_rng_state()`` tensors, NumPy arrays)
        and pre-existing tensors not listed in ``roots`` are not counted.

    References:
        Paper §8 (actual allocator peaks); DESIGN.md "Measurement rules".
    """

    def __init__(self, device: str | torch.device = "cpu", roots: Iterable[Any] = ()):
        self.device = torch.device(device)
        self.roots = list(roots)
        self.method = CUDA_METHOD if self.device.type == "cuda" else CPU_METHOD
        self.peak_bytes = 0
        self.baseline_bytes = 0
        self._tracker: _StorageTracker | None = None
        self._entry = 0

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._entry = int(torch.cuda.memory_allocated(self.device))
            # with roots, count only this step's footprint (other models may share the device)
            self.baseline_bytes = storage_bytes(self.roots) if self.roots else self._entry
        else:
            known = _storages(self.roots)
            self.baseline_bytes = sum(st.nbytes() for st in known.values())
            self._tracker = _StorageTracker(known)
            del known
            self.roots = []  # hold no root: one the block frees must leave the count
            self._tracker.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = self.baseline_bytes + self.tracked_peak_bytes
        else:
            assert self._tracker is not None
            self._tracker.__exit__(*exc)
            self.peak_bytes = self.baseline_bytes + self._tracker.peak_bytes
            self._tracker.detach_all()

    def reset_peak(self) -> None:
        """Restart peak tracking from the current live bytes (to measure a sub-phase)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            assert self._tracker is not None
            with self._tracker._lock:
                self._tracker.peak_bytes = self._tracker.current_bytes

    def new_storages(self) -> list[torch.UntypedStorage]:
        """CPU: live storages first produced inside the block so far (e.g. the gradients and
        optimizer state a first training step creates), to pass as ``roots`` of a later block.

        Raises:
            RuntimeError: on CUDA (the allocator does not list storages) or outside the block.
        """
        if self._tracker is None:
            raise RuntimeError("PeakMemory.new_storages: available on CPU inside the with-block only "
                               f"(device {self.device}). Tip: on CUDA the allocator counts every storage.")
        return self._tracker.new_storages()

    @property
    def current_bytes(self) -> int:
        """Live bytes now (CPU: baseline + tracked storages still alive; CUDA: allocated)."""
        if self.device.type == "cuda":
            return self.baseline_bytes + int(torch.cuda.memory_allocated(self.device)) - self._entry
        assert self._tracker is not None
        return self.baseline_bytes + self._tracker.current_bytes

    @property
    def tracked_peak_bytes(self) -> int:
        """Peak bytes above the baseline seen so far (CPU tracker; CUDA: peak − baseline)."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device)) - self._entry
        assert self._tracker is not None
        return self._tracker.peak_bytes


def memory_method(device: str | torch.device) -> str:
    """Name of the peak-memory method used on ``device`` (written into every record)."""
    return CUDA_METHOD if torch.device(device).type == "cuda" else CPU_METHOD
