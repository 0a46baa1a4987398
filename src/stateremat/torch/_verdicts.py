"""The watch's byte checks and their device-side verdicts (R7 for writes no version counter sees).

Around the forward the :class:`~._watch.Watch` compares reached tensors that a kernel may write
without a version bump (running statistics: norm probes), storage pointers (``.data =``, ``set_``)
and fingerprints (writes through ``.data`` or another alias). On the host the verdicts are read at
once; on a device they are computed there and read when ready (:class:`Deferred`), so a forward
never waits for its stream (issue 26).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._compat import DisableTorchFunctionSubclass, library_ops
from ._scan import describe
from ._storage import fingerprint_changed, host_readable, storage_key


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool | torch.Tensor:
    """Bitwise equality (NaN == NaN, -0.0 != 0.0); on the device path (``a`` not
    :func:`host_readable`) a 0-dim bool tensor on the device, to be read later."""
    if a.shape != b.shape or a.device != b.device:
        return False
    a, b = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    return torch.equal(a, b) if host_readable(a) else (a == b).all()


class Deferred:
    """Device-side verdicts of the watch's byte checks, read on the host once they are computed.

    The verdicts (one 0-dim bool tensor per name: "this tensor's bytes changed") are stacked and
    copied to pinned host memory without waiting (an event marks the copy's end); :meth:`names`
    reads them, waiting for that event only if the device has not reached it yet. The watch reads
    them after the forward when they are ready, else just before the replay (before anything is
    restored), so a forward never waits for its stream (issue 26).
    """

    def __init__(self, items: list[tuple[str, str, torch.Tensor]]) -> None:
        by_device: dict[torch.device, list] = {}
        for item in items:
            by_device.setdefault(item[2].device, []).append(item)
        self.groups = [self._send(group) for group in by_device.values()]  # (items, array, host, event)

    @staticmethod
    def _send(items: list) -> tuple:
        with torch.no_grad(), DisableTorchFunctionSubclass():
            v = torch.stack([f.reshape(()).to(torch.bool) for _, _, f in items])
            event = None
            if v.device.type == "cuda":
                with torch.cuda.device(v.device):
                    host = torch.empty(v.shape, dtype=torch.bool, pin_memory=True)
                    array = host.numpy()  # (a view of pinned host memory: no device read)
                    host.copy_(v, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record()
            else:
                array = np.zeros(v.shape, dtype=bool)
                host = torch.from_numpy(array)
                host.copy_(v)  # (no stream to wait for)
        return [(n, why) for n, why, _ in items], array, host, event

    def ready(self) -> bool:
        return all(event is None or event.query() for _, _, _, event in self.groups)

    def names(self, found: dict[str, str]) -> list[str]:
        """Add the changed ones to ``found`` (name -> why; the first reason kept); return ``found``'s names."""
        for items, array, _, event in self.groups:
            if event is not None:
                event.synchronize()
            for (n, why), changed in zip(items, array.tolist()):
                if changed:
                    found.setdefault(n, why)
        return list(found)


def byte_checks(self: Any, skip: set[int], own: set, found: dict[str, str], checks: list) -> None:
    """The watch's byte checks (norm probes, pointers, fingerprints): changes read on the host go
    to ``found`` (name -> why); device-side verdicts to ``checks`` as ``(name, why, 0-dim bool)``."""
    if self.norm_probes:
        with library_ops():
            for n, t, before in self.norm_probes:
                if id(t) in skip or storage_key(t) in own:
                    continue
                same = _same_bytes(t, before)
                if isinstance(same, torch.Tensor):
                    checks.append((describe(n), "bytes (a kernel that bumps no version)", ~same))
                elif not same:
                    found.setdefault(describe(n), "bytes (a kernel that bumps no version)")
    for n, t, ptr in self.ptrs:
        if t.data_ptr() != ptr and id(t) not in skip:
            found.setdefault(describe(n), "storage rebound (.data = / set_)")
    for n, t, fp in self.fingerprints:
        if id(t) in skip or describe(n) in found or storage_key(t) in own:
            continue
        changed = fingerprint_changed(t, fp)
        if isinstance(changed, torch.Tensor):
            checks.append((describe(n), "bytes (written through .data or another alias)", changed))
        elif changed:
            found.setdefault(describe(n), "bytes (written through .data or another alias)")


def read_or_defer(names: list[str], deferred: list, wait: bool = False) -> tuple[list[str], Deferred | None]:
    """After the forward: ``(names, pending)``: ``names`` found on the host plus the device-side
    verdicts ``deferred`` when they are ready (a CPU's always are), or when ``names`` is not empty
    (a report is made now and names every tensor, so it waits: only on the error path), or with
    ``wait`` (``state="auto"`` decides now whether this forward keeps its activations: issue 26,
    not yet deferred); else the verdicts are returned as ``pending``, read before the replay
    (:meth:`Watch.versions`)."""
    if not deferred:
        return names, None
    d = Deferred(deferred)
    if wait or names or d.ready():
        return d.names(dict.fromkeys(names, "")), None
    return names, d
