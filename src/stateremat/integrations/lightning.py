"""stateremat checkpointing for PyTorch Lightning: a ``Callback`` that checkpoints a
LightningModule's blocks state-aware for the run of a ``Trainer``.

Lightning has no activation-checkpointing switch of its own for single-device and DDP training
(its FSDP strategy takes torch's ``checkpoint_wrapper`` policy); a user checkpoints inside
``LightningModule.forward``. :class:`StateAwareCheckpointing` does it from the outside, the way
Lightning extends a run: at ``setup`` it checkpoints the module's repeated blocks (or the given
segments) in place with :func:`stateremat.torch.apply_plan` — each block's buffers declared,
BatchNorm statistics updated once per step, dropout masks replayed — and at ``teardown`` puts
the blocks back. Names and ``state_dict`` keys are unchanged, so Lightning's checkpoints load into
the plain module.

This module imports Lightning (``lightning.pytorch``, else ``pytorch_lightning``): a callback must
subclass its ``Callback``.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from stateremat.contract import OPTIONS
from stateremat.torch import Checkpointer, apply_plan, resolve_segments

try:  # the unified package first, then the standalone one (the same Callback API)
    from lightning.pytorch import Callback as _Callback
except ImportError:  # pragma: no cover - depends on which package is installed
    from pytorch_lightning import Callback as _Callback

_API = "stateremat.integrations.lightning.StateAwareCheckpointing"


class StateAwareCheckpointing(_Callback):
    """Checkpoint a LightningModule's blocks with stateremat while a ``Trainer`` runs.

    ``Trainer(callbacks=[StateAwareCheckpointing()])`` checkpoints the module's repeated block
    (a ResNet's ``layer{1..4}.{j}``, a transformer's ``layers.{i}``); ``segments=`` names others.

    Args:
        segments: ``None`` (the module's repeated block), a pattern such as ``"net.blocks.*"``, or
            module paths (see :func:`stateremat.torch.resolve_segments`).
        preserve: ``"region"`` (default) or ``"whole"``.
        state: ``"auto"`` (default: the state each block writes, found without a declaration),
            ``"buffers"`` (each block's buffers) or tensors/modules declared in every block.
        granularity_bytes, on_undeclared, verify: as in :func:`stateremat.torch.checkpoint`.

    Raises:
        ValueError / TypeError: a bad option, at construction; no blocks or bad segment paths,
            at ``setup`` (before the module changes).

    References:
        Paper §3.1, §5.
    """

    def __init__(self, segments: Any = None, *, preserve: str = "region", state: Any = "auto",
                 granularity_bytes: int | None = None, on_undeclared: str = "raise", verify: bool = False) -> None:
        super().__init__()
        # every option checked now, not at the first training step
        Checkpointer(state=None if state == "buffers" else state, preserve=preserve,
                     granularity_bytes=granularity_bytes, on_undeclared=on_undeclared, verify=verify)
        self.segments = segments
        self.options = {"state": state, "granularity_bytes": granularity_bytes, "on_undeclared": on_undeclared,
                        "verify": verify}
        self.preserve = preserve
        self.segment_names: list[str] = []

    def setup(self, trainer: Any, pl_module: nn.Module, stage: str) -> None:
        """Checkpoint the blocks (Lightning calls this once the module is on its device)."""
        if self.segment_names:
            return  # fit then validate/test in one run: already in place
        names = resolve_segments(pl_module, self.segments)
        apply_plan(pl_module, {"options": [self.preserve] * len(names), "segment_names": names}, **self.options)
        self.segment_names = names

    def teardown(self, trainer: Any, pl_module: nn.Module, stage: str) -> None:
        """Put the blocks back as they were (no checkpointing)."""
        if self.segment_names:
            apply_plan(pl_module, {"options": [OPTIONS.baseline] * len(self.segment_names),
                                   "segment_names": self.segment_names})
            self.segment_names = []

    def __repr__(self) -> str:
        return f"StateAwareCheckpointing(segments={self.segments!r}, preserve={self.preserve!r}, {self.options})"
