"""Which rebindings belong to a parallelism framework, not to the user (issue 24).

The replay reads a module's bindings as of the forward (``_bindings.end_bindings_as_of``,
``Bindings``): a user's own rebinding between forward and backward (``m.q = m.q * 0.3``) must not
change what the replay differentiates, and one inside a segment's forward is refused or replayed
as of the forward's start. Parameters that a framework swaps between forward and backward are
the framework's, not user state: FSDP2's ``fully_shard`` binds each managed parameter to its
sharded ``DTensor`` between forward and backward (reshard) and to the gathered tensor while the
unit runs (unshard, again in its pre-backward hook); tensor parallelism binds ``DTensor``
parameters whose placement it redistributes. Binding the forward's sharded ``DTensor`` back would
mix it with the gathered inputs (``aten.addmm.default got mixed torch.Tensor and DTensor``).

The rule: a change of a module's **parameter** slot where the tensor bound before or after is a
``DTensor`` is the framework's. The replay then uses what the framework binds at backward, the
change is not reported as an undeclared rebinding, and it is not undone or replayed. Every other
change of a binding — buffers, tensor attributes, submodules, and parameters that are plain
tensors on both sides — is the user's and replays as of the forward, as before. The test is on
the values only: it needs no FSDP internals, holds whichever modules a segment reaches (the unit
itself or a layer inside it), and loads nothing (``torch.distributed.tensor`` is looked up only
once something imported it; without it no tensor can be a ``DTensor``).
"""
from __future__ import annotations

from typing import Any

from ._compat import is_dtensor as _is_dtensor


def framework_swap(table: str, before: Any, after: Any) -> bool:
    """True if rebinding slot ``table`` (``"_parameters"``, ``"_buffers"``, ``"__dict__"``, ...)
    from ``before`` to ``after`` (either may be ``None``: unbound) is a framework's parameter swap."""
    return table == "_parameters" and (_is_dtensor(before) or _is_dtensor(after))
