"""The seven executable methods as policies over a profile card, and one training step of each.

Fixed methods are one-line policies (STYLE §2); planner methods run ``stateremat.planner.plan``
on the cell's profile card. Every method returns the same :class:`~stateremat.planner.PlanResult`
(``functional`` has none: it threads state out-of-place and is not a checkpoint policy).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from ...contract import OPTIONS, ProfileCard
from .. import METHOD_OPTION
from ..profile import journal_scope, wrap_segment
from ..workloads import StatefulChain, WorkloadConfig, loss_fn, make_batch

#: method name -> planner name of ``stateremat.planner.plan`` (None: functional, no policy); a
#: fixed method's planner is its option (:data:`stateremat.paper.METHOD_OPTION`).
PLANNER_OF = {**METHOD_OPTION, "functional": None,
              "state_agnostic": "state_agnostic", "eager_whole": "eager_whole", "joint": "joint"}
LEARNING_RATE = 1e-3


def method_plan(method: str, card: ProfileCard, budget_bytes: int, plans: dict | None = None):
    """The :class:`~stateremat.planner.PlanResult` ``method`` chooses on ``card`` (None: functional).

    Args:
        method: a key of :data:`PLANNER_OF`.
        card: the cell's profile card.
        budget_bytes: logical budget ``M``, bytes.
        plans: planner name -> result already computed for this card and budget; filled in, so
            each planner runs once however many methods and columns ask for it.

    Returns:
        The plan, or None for ``functional`` (no checkpoint policy).

    Raises:
        ValueError: unknown method name.
    """
    if method not in PLANNER_OF:
        raise ValueError(f"method_plan: unknown method {method!r}; expected one of "
                         f"{list(PLANNER_OF)}. Tip: names use underscores (eager_whole).")
    planner = PLANNER_OF[method]
    if planner is None:
        return None
    if plans is not None and planner in plans:
        return plans[planner]
    from ...planner import plan

    res = plan(card, budget_bytes, planner)
    if plans is not None:
        plans[planner] = res
    return res


def policy_json(res) -> str | None:
    """The per-segment policy as a JSON list string (None when infeasible or functional)."""
    if res is None or res.options is None:
        return None
    return json.dumps(list(res.options))


@dataclass
class MethodRun:
    """A chain built for one method, ready to run training steps.

    Attributes:
        method: method name.
        chain: the workload chain, segments wrapped per the policy.
        x: input batch ``(batch, width)``.
        options: per-segment options applied (None for functional).
    """

    method: str
    chain: StatefulChain
    x: torch.Tensor
    options: list[str] | None
    last_loss: torch.Tensor | None = None  # kept after backward(retain_graph=True)

    @property
    def roots(self) -> list[torch.Tensor]:
        """Persistent tensors of this run (parameters, gradients, state, input)."""
        ps = list(self.chain.parameters())
        return ps + [p.grad for p in ps if p.grad is not None] + [self.chain.state, self.x]

    def forward_backward(self, step: int, *, retain_graph: bool = False):
        """Forward, loss and backward of one step; returns ``(loss, final_state)``."""
        if self.method == "functional":
            y, new_state = self.chain.functional(self.x, self.chain.state, step, checkpoint=True)
            loss = loss_fn(y)
            loss.backward(retain_graph=retain_graph)
            self.last_loss = loss if retain_graph else None
            return loss, new_state.detach()
        with journal_scope(self.options is not None and any(OPTIONS.journals(o) for o in self.options)):
            loss = loss_fn(self.chain(self.x, step))
        loss.backward(retain_graph=retain_graph)
        self.last_loss = loss if retain_graph else None
        return loss, self.chain.state

    def train_step(self, step: int) -> None:
        """One training step: zero grads, forward, backward, SGD update (state written once)."""
        for p in self.chain.parameters():
            if p.grad is not None:
                p.grad.zero_()
        loss, new_state = self.forward_backward(step)
        if self.method == "functional":
            self.chain.set_state(new_state)
        with torch.no_grad():
            ps = [p for p in self.chain.parameters() if p.grad is not None]
            torch._foreach_add_(ps, [p.grad for p in ps], alpha=-LEARNING_RATE)
        del loss


def build_method(method: str, cfg: WorkloadConfig, options: list[str] | None,
                 device: str | torch.device = "cpu") -> MethodRun:
    """Build ``cfg``'s chain on ``device`` and wrap its segments with ``options``.

    Args:
        method: method name (``functional`` ignores ``options``).
        cfg: workload shape (dtype included).
        options: option per segment (``eager``/``whole``/``region``) in segment order.
        device: where to build.

    Returns:
        A :class:`MethodRun` whose parameters and state equal every other method's at build.

    Raises:
        ValueError: ``options`` length differs from the segment count.
    """
    chain = StatefulChain(cfg, device)
    x = make_batch(cfg, device)
    if method != "functional" and options is not None:
        if len(options) != len(chain.segment_names):
            raise ValueError(f"build_method: {len(options)} options for "
                             f"{len(chain.segment_names)} segments. Tip: plan on this cell's card.")
        if set(options) <= set(OPTIONS.names):
            from ...torch import apply_plan

            apply_plan(chain, {"options": list(options), "segment_names": list(chain.segment_names)},
                       granularity_bytes=cfg.granularity_bytes, state="buffers")  # as profiled (§4)
        else:  # negative controls (recompute_only = plain torch.utils.checkpoint), tests only
            for name, opt in zip(chain.segment_names, options):
                setattr(chain, name, wrap_segment(getattr(chain, name), opt, name=name))
    return MethodRun(method, chain, x, None if method == "functional" else options)
