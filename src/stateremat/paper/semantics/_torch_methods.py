"""Run one Torch program under one execution method and collect its observations.

Seven methods (paper §5, Table 2): the functional reference, native eager, the four
``torch.utils.checkpoint`` variants, and the stateremat transactional non-reentrant
checkpoint with the hidden buffer declared as state. The same forward graph is
differentiated twice (``backward(retain_graph=True)`` twice).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from ...contract import internal_assert
from ._compare import StageError
from ._families import HIDDEN_FAMILIES, TORCH_METHOD_NAMES, ProgramParams
from ._torch_programs import TORCH_PROGRAMS


class _Holder(torch.nn.Module):
    """A module whose buffer the hidden-buffer programs mutate (not a segment input)."""

    def __init__(self, buf: torch.Tensor):
        super().__init__()
        self.register_buffer("buf", buf)


def _stateremat_checkpoint() -> Callable:
    from stateremat.torch import checkpoint  # the transactional checkpoint (issue 3)

    return checkpoint


def _native(use_reentrant: bool, preserve_rng_state: bool) -> Callable:
    def run(seg, x, w, holder, family):
        return torch_checkpoint(seg, x, w, use_reentrant=use_reentrant,
                                preserve_rng_state=preserve_rng_state)
    return run


def _transactional(seg, x, w, holder, family):
    state = [holder] if family in HIDDEN_FAMILIES else []
    return _stateremat_checkpoint()(seg, x, w, state=state, preserve="whole")


#: method name -> runner(seg, x, w, holder, family) -> output; None for the functional reference
TORCH_METHODS: dict[str, Callable | None] = {
    "functional_reference": None,
    "native_eager": lambda seg, x, w, holder, family: seg(x, w),
    "reentrant": _native(True, True),
    "nonreentrant": _native(False, True),
    "reentrant_rng_unpreserved": _native(True, False),
    "nonreentrant_rng_unpreserved": _native(False, False),
    "stateremat_transactional": _transactional,
}
internal_assert(tuple(TORCH_METHODS) == TORCH_METHOD_NAMES, "torch method tables disagree")


def torch_method_available(method: str) -> str | None:
    """``None`` if ``method`` can run here, else why not (e.g. the checkpoint is missing)."""
    if method != "stateremat_transactional":
        return None
    try:
        _stateremat_checkpoint()
    except ImportError as exc:
        return f"stateremat.torch.checkpoint is not importable ({exc})"
    return None


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def run_torch(method: str, p: ProgramParams, data: dict[str, np.ndarray],
              dtype: str, device: str = "cpu") -> tuple[dict[str, np.ndarray], int]:
    """Execute program ``p`` under ``method`` once.

    Args:
        method: a key of :data:`TORCH_METHODS`.
        p: program parameters; ``data``: its float64 inputs (``x``, ``w``, ``buf``, ``g``).
        dtype: ``"float32"`` or ``"float64"``.
        device: torch device of the program's tensors and random draws (``"cpu"``,
            ``"cuda"``); on CUDA the final CUDA generator state is observed too.

    Returns:
        ``(observations, invocation_count)``: outputs, gradients of both backward passes,
        final visible state (buffer, inputs) and final CPU RNG state as NumPy arrays; and
        how many times the segment body ran.

    Raises:
        StageError: the framework raised; ``.stage`` is ``forward``, ``backward_1``,
            ``backward_2`` or ``state``, ``.exc`` the exception, ``.invocation_count`` the
            segment executions up to the raise.
    """
    dt = getattr(torch, dtype)
    inplace, functional = TORCH_PROGRAMS[p.family]
    torch.manual_seed(p.seed)
    x = torch.tensor(data["x"], dtype=dt, device=device, requires_grad=True)
    w = torch.tensor(data["w"], dtype=dt, device=device, requires_grad=True)
    holder = _Holder(torch.tensor(data["buf"], dtype=dt, device=device))
    count = [0]
    stage = "forward"
    try:
        if method == "functional_reference":
            count[0] += 1
            out, new_state = functional(x, w, {"buf": holder.buf}, p)
            final_buf: Callable[[], Any] = lambda: new_state["buf"]
        else:
            def seg(x_, w_):
                count[0] += 1
                return inplace(x_, w_, {"buf": holder.buf}, p)
            out = TORCH_METHODS[method](seg, x, w, holder, p.family)
            final_buf = lambda: holder.buf
        obs: dict[str, np.ndarray] = {"out": _np(out)}
        g = torch.tensor(data["g"], dtype=dt, device=device)
        for i in (1, 2):
            stage = f"backward_{i}"
            x.grad = w.grad = None
            out.backward(g, retain_graph=True)
            for name, t in (("x", x), ("w", w)):
                obs[f"grad_{name}_{i}"] = (_np(t.grad) if t.grad is not None
                                           else np.full(t.shape, np.nan))
        stage = "state"
        if p.family in HIDDEN_FAMILIES:
            obs["state_buf"] = _np(final_buf())
        obs["state_x"], obs["state_w"] = _np(x), _np(w)
        obs["rng"] = torch.get_rng_state().numpy().copy()
        if x.device.type == "cuda":
            obs["rng_cuda"] = torch.cuda.get_rng_state(x.device).numpy().copy()
    except Exception as exc:  # every framework exception is an observation (outcome R)
        raise StageError(stage, exc, count[0]) from exc
    return obs, count[0]
