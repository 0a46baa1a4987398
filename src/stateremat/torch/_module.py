"""``StatefulCheckpoint``: an ``nn.Module`` wrapper that checkpoints a block transactionally."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._checkpoint import _validate, check_flag, run_segment
from ._compat import eager_only
from ._scan import Declared, check_state, resolve_state
from ._frame import RecomputeSink
from ._runtime import journaled


_PREFIX = "block."


def _strip_block_prefix(module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> dict:
    for key in list(state_dict):
        if key.startswith(prefix + _PREFIX):
            state_dict[prefix + key[len(prefix) + len(_PREFIX):]] = state_dict.pop(key)
    return state_dict


def _add_block_prefix(state_dict: dict, prefix: str, *args: Any) -> None:
    for key in list(state_dict):
        if key.startswith(prefix) and not key.startswith(prefix + _PREFIX):
            state_dict[prefix + _PREFIX + key[len(prefix):]] = state_dict.pop(key)


class StatefulCheckpoint(nn.Module):
    """Wrap ``block`` so its forward is checkpointed with declared state (see :func:`checkpoint`).

    Args:
        block: the module to checkpoint (registered as ``.block``; ``state_dict`` keys, attribute
            access and indexing are those of the unwrapped block).
        state: ``"auto"`` (default: the state the block writes, found without a declaration: see
            :func:`checkpoint`), ``"buffers"`` (all buffers of ``block``), ``None`` (nothing), or a
            tensor / module / list of them.
        preserve: ``"region"`` or ``"whole"`` (snapshots every byte of each declared storage).
        granularity_bytes: region journal rounding: ``None`` (default) keeps exactly the bytes
            each write changes (runs closer than 16 bytes merged); an int rounds every write out
            to multiples of that many bytes.
        on_undeclared: ``"raise"``, ``"warn"`` or ``"declare"``.
        verify: compare recomputed saved tensors with the forward's bit for bit.
        preserve_rng_state: replay with the forward's RNG state.
        name: segment name used in errors and undeclared-state messages (module path).

    Attributes:
        retained_by_option: bytes the last forward retained for its replay, by option name
            (``"whole"``: snapshots, ``"region"``: journal entries of its own writes).
        snapshot_bytes: bytes of ``retained_by_option`` under options that do not journal.
        journal_bytes: bytes of ``retained_by_option`` under options that journal.
        retained_state_bytes: ``snapshot_bytes + journal_bytes``.
        recompute_count: replays run so far (one per backward that needs this block).

    Raises:
        ValueError: on an unknown ``preserve``/``on_undeclared``/``state`` string or a bad
            ``granularity_bytes`` (at most 2**62); at run time the errors of :func:`checkpoint`.
        TypeError: ``verify`` not a bool; ``state="buffers"`` with a ``block`` that is not an
            ``nn.Module``.

    References:
        Paper §3.1, §5.
    """

    def __init__(self, block: nn.Module, state: Any = "auto", preserve: str = "region",
                 granularity_bytes: int | None = None, on_undeclared: str = "raise", verify: bool = False,
                 preserve_rng_state: bool = True, name: str | None = None) -> None:
        super().__init__()
        _validate(block, preserve, granularity_bytes, on_undeclared)
        check_flag("stateremat.torch.StatefulCheckpoint", "verify", verify)
        check_flag("stateremat.torch.StatefulCheckpoint", "preserve_rng_state", preserve_rng_state)
        if isinstance(state, str) and state == "buffers" and not isinstance(block, nn.Module):
            raise TypeError("stateremat.torch.StatefulCheckpoint: state='buffers' declares every buffer of "
                            f"block, so block must be an nn.Module, got {type(block).__name__}. Tip: wrap the "
                            "module itself, or declare the state, e.g. state=[model.bn].")
        check_state(state, "stateremat.torch.StatefulCheckpoint")
        self.block = block
        self.state = state
        self.preserve = preserve
        self.granularity_bytes = granularity_bytes
        self.on_undeclared = on_undeclared
        self.verify = verify
        self.preserve_rng_state = preserve_rng_state
        self.segment_name = name or type(block).__name__
        self._sink = RecomputeSink()
        self.retained_by_option: dict[str, int] = {}
        # state_dict keys stay those of the unwrapped block (like torch's CheckpointWrapper).
        self._register_state_dict_hook(_strip_block_prefix)
        self._register_load_state_dict_pre_hook(_add_block_prefix)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            block = self.__dict__.get("_modules", {}).get("block")
            if block is None:  # not initialized yet (unpickling)
                raise
            return getattr(block, name)

    def __getitem__(self, idx: Any) -> Any:
        return self._modules["block"].__getitem__(idx)

    def __setitem__(self, idx: Any, module: Any) -> None:
        self._modules["block"].__setitem__(idx, module)

    def __len__(self) -> int:
        return len(self._modules["block"])

    def __iter__(self) -> Any:
        return iter(self._modules["block"])

    @property
    def retained_state_bytes(self) -> int:
        return sum(self.retained_by_option.values())

    @property
    def journal_bytes(self) -> int:
        return journaled(self.retained_by_option)

    @property
    def snapshot_bytes(self) -> int:
        return self.retained_state_bytes - self.journal_bytes

    @property
    def recompute_count(self) -> int:
        return self._sink.recompute_count

    def _declared(self) -> Declared:
        prefix = self.segment_name if self.segment_name != type(self.block).__name__ else ""
        if self.state == "buffers":
            return resolve_state(self.block, self.block, prefix)
        return resolve_state(None if self.state == "auto" else self.state, self.block, prefix)

    @eager_only
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.block(*args, **kwargs)
        captured: dict[str, Any] = {}
        auto = self.state == "auto" and self.on_undeclared == "raise"  # found by the segment (_learn)
        out = run_segment(
            self.block, args, kwargs, state="auto" if auto else None, preserve=self.preserve,
            granularity_bytes=self.granularity_bytes, on_undeclared=self.on_undeclared,
            verify=self.verify, preserve_rng_state=self.preserve_rng_state, name=self.segment_name,
            module_prefix=self.segment_name if self.segment_name != type(self.block).__name__ else "",
            sink=self._sink, declared=None if auto else self._declared(), on_done=captured,
        )
        self.retained_by_option = captured.get("retained", {})
        return out

    def extra_repr(self) -> str:
        state = repr(self.state) if isinstance(self.state, str) else "..."
        return f"preserve={self.preserve!r}, state={state}"
