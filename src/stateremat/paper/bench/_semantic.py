"""Semantic checks run before a method is timed: equal to the functional reference (§8, §10).

In float32 and float64, one forward+backward of the method must give the functional reference's
gradients, final state and generator state, and a second backward over the same graph
(``retain_graph=True``) must give identical gradients and leave the state unchanged. A failure
is returned (and recorded), never raised, so the run goes on and the table shows it.
"""
from __future__ import annotations

import torch

from ..records.tables import SEMANTIC_RTOL
from ..workloads import StatefulChain, WorkloadConfig, loss_fn, make_batch
from ._methods import build_method

#: max |difference| allowed, relative to max(1, max |reference|), per dtype. CPU replays run the
#: same kernels on the same bytes, so differences are expected to be exactly 0; the tolerance
#: leaves room for non-deterministic GPU reductions.
RTOL = SEMANTIC_RTOL  # per dtype; declared with the rows that record it
_SEED = 1234
_STEP = 1


def _rng_state(device: torch.device) -> list[torch.Tensor]:
    out = [torch.get_rng_state()]
    if device.type == "cuda":
        out.append(torch.cuda.get_rng_state(device))
    return out


def _max_rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    scale = max(1.0, float(ref.abs().max()))
    return float((a.double() - ref.double()).abs().max()) / scale


def check_method(method: str, cfg: WorkloadConfig, options: list[str] | None,
                 device: str | torch.device = "cpu") -> dict:
    """Run the semantic checks of ``method`` with ``options`` on ``cfg`` in float32 and float64.

    Args:
        method: method name.
        cfg: workload shape (its dtype is replaced by each checked dtype).
        options: per-segment policy (None for ``functional``).
        device: device to run on.

    Returns:
        ``{"semantic_checks": "pass"|"fail", "semantic_max_error": float,
        "semantic_detail": str}``; detail names each failed check and dtype.
    """
    device = torch.device(device)
    failures, worst = [], 0.0
    for dtype in ("float32", "float64"):
        c = cfg.replace(dtype=dtype)
        tol = RTOL[dtype]
        try:
            ref = StatefulChain(c, device)
            x = make_batch(c, device)
            torch.manual_seed(_SEED)
            y, ref_state = ref.functional(x, ref.state.clone(), _STEP)
            loss_fn(y).backward()
            ref_grads = [p.grad for p in ref.parameters()]
            ref_rng = _rng_state(device)

            run = build_method(method, c, options, device)
            torch.manual_seed(_SEED)
            _, state1 = run.forward_backward(_STEP, retain_graph=True)
            state1 = state1.clone()
            rng1 = _rng_state(device)
            grads1 = [p.grad.clone() for p in run.chain.parameters()]
            for p in run.chain.parameters():
                p.grad = None
        except Exception as exc:  # a raised replay error is a recorded failure, not a crash
            failures.append(f"{dtype}: {type(exc).__name__}: {exc}")
            continue
        errs = {"gradients": max(_max_rel_err(a, b) for a, b in zip(grads1, ref_grads)),
                "final_state": _max_rel_err(state1, ref_state)}
        worst = max(worst, *errs.values())
        for what, err in errs.items():
            if not err <= tol:
                failures.append(f"{dtype}: {what} differ from the functional reference "
                                f"(max rel err {err:.3g} > {tol:g})")
        if not all(torch.equal(a, b) for a, b in zip(rng1, ref_rng)):
            failures.append(f"{dtype}: generator state differs from the functional reference (R3)")
        failures += _repeat_backward(run, grads1, state1, dtype)
    return {"semantic_checks": "fail" if failures else "pass", "semantic_max_error": worst,
            "semantic_detail": "; ".join(failures)}


def _repeat_backward(run, grads1, state1, dtype) -> list[str]:
    """Second backward over the retained graph: identical gradients, state untouched (R5)."""
    loss = run.last_loss
    try:
        if loss is None:
            return [f"{dtype}: no retained graph to differentiate again"]
        loss.backward()
    except Exception as exc:
        return [f"{dtype}: repeated backward raised {type(exc).__name__}: {exc}"]
    out = []
    grads2 = [p.grad for p in run.chain.parameters()]
    if not all(torch.equal(a, b) for a, b in zip(grads1, grads2)):
        out.append(f"{dtype}: repeated backward gave different gradients")
    state2 = run.chain.state if run.method != "functional" else state1
    if not torch.equal(state2, state1):
        out.append(f"{dtype}: repeated backward changed the declared state (R5)")
    return out
