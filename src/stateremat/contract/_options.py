"""The per-segment checkpoint options, one ordered registry (paper §4, Table 1).

An option says what a segment keeps between its forward and its backward: its activations
(``eager``), or nothing but what its replay needs — a whole snapshot of the declared state
(``whole``) or a journal of the written regions only (``region``). Planners, profile cards,
the profiler, ``explain`` and reports read this registry; nothing else lists option names.

Adding an option (say ``offload`` to host memory) is one :meth:`OptionRegistry.register`
call here, one Preserver file in ``stateremat/torch/_preserve/`` and, if the paper wing
compares it, one line in its methods table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class Option:
    """One per-segment checkpoint option.

    Args:
        name: identifier used in cards, plans and ``preserve=`` (``"eager"``, ``"whole"``...).
        replays: True if the segment's activations are dropped and recomputed in backward.
        preserves: what is kept for a correct replay, in words (``"activations"``,
            ``"declared state, every byte"``, ``"written regions of declared state"``).
        label: human-readable name for tables and figures.
        required: every profile-card segment must carry a cost for this option.
        journals: keeps the written regions in a journal shared by every segment that declares
            the storage (R6): its retained bytes include later segments' writes, and a segment
            without declared state gains nothing from it (the profiler skips it there).

    References:
        Paper §4 (per-segment options), Table 1 (preservation engines).
    """

    name: str
    replays: bool
    preserves: str
    label: str
    required: bool = False
    journals: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"Option: name must be an identifier string, got {self.name!r}. "
                             "Tip: use a short lower-case name such as 'offload'.")


class OptionRegistry:
    """Ordered, name-indexed registry of :class:`Option` (order breaks planner ties).

    Iterating yields options in registration order; ``len(OPTIONS)`` is the number of
    columns of every planner cost table.
    """

    def __init__(self, options: tuple[Option, ...]) -> None:
        self._options: list[Option] = []
        for o in options:
            self.register(o)

    def register(self, option: Option) -> Option:
        """Add ``option`` at the end of the order.

        Raises:
            TypeError: ``option`` is not an :class:`Option`.
            ValueError: an option of that name is already registered.
        """
        if not isinstance(option, Option):
            raise TypeError(f"OPTIONS.register: expected an Option, got {type(option).__name__}. "
                            "Tip: Option(name, replays, preserves, label).")
        if option.name in self.names:
            raise ValueError(f"OPTIONS.register: an option named {option.name!r} is already "
                             f"registered (have {list(self.names)}). Tip: pick another name.")
        self._options.append(option)
        return option

    def unregister(self, name: str) -> None:
        """Remove the option called ``name`` (tests register temporary options).

        Raises:
            ValueError: no such option, or it is one of the built-in options.
        """
        if name in _BUILTIN:
            raise ValueError(f"OPTIONS.unregister: {name!r} is built in and cannot be removed.")
        self._options.remove(self[name])

    @property
    def names(self) -> tuple[str, ...]:
        """Option names in registry order."""
        return tuple(o.name for o in self._options)

    def index(self, name: str) -> int:
        """Column of ``name`` in planner cost tables."""
        return self.names.index(self[name].name)

    def replays(self, name: str) -> bool:
        """True if ``name`` drops activations and replays in backward: a registered option's
        :attr:`Option.replays`, and the card-only ``recompute_only`` view (a plain replay).

        Raises:
            ValueError: ``name`` is neither a registered option nor ``recompute_only``.
        """
        return name == RECOMPUTE_ONLY or self[name].replays

    @property
    def baseline(self) -> str:
        """Name of the option that keeps its activations and never replays (``"eager"``): what a
        segment runs when no checkpoint applies (the first registered option with ``replays=False``)."""
        return next(o.name for o in self._options if not o.replays)

    @property
    def control(self) -> str:
        """Name of the required option that replays (``"whole"``, a whole snapshot): the paper's
        state-agnostic control (§3; the ``state_agnostic`` planner omits its preservation cost) and
        what a fixed method falls back to where a card lacks its option (the first registered
        option with ``required=True`` and ``replays=True``)."""
        return next(o.name for o in self._options if o.required and o.replays)

    def journals(self, name: str) -> bool:
        """True if ``name`` is a registered option whose preserver journals (``Option.journals``);
        False for ``recompute_only`` and unknown names."""
        return name in self and self[name].journals

    def __getitem__(self, key: int | str) -> Option:
        if isinstance(key, int):
            return self._options[key]
        for o in self._options:
            if o.name == key:
                return o
        raise ValueError(f"unknown checkpoint option {key!r} (expected one of {list(self.names)}). "
                         "Tip: options are registered in stateremat.contract.OPTIONS.")

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __iter__(self) -> Iterator[Option]:
        return iter(tuple(self._options))

    def __len__(self) -> int:
        return len(self._options)

    def __repr__(self) -> str:
        return f"OptionRegistry({list(self.names)})"


EAGER = Option("eager", replays=False, preserves="activations", label="Eager", required=True)
WHOLE = Option("whole", replays=True, preserves="declared state, every byte", label="Whole snapshots",
               required=True)
REGION = Option("region", replays=True, preserves="written regions of declared state", label="Fixed regions",
                journals=True)
_BUILTIN = ("eager", "whole", "region")

#: Every per-segment option, in canonical order (lower index wins planner ties).
OPTIONS = OptionRegistry((EAGER, WHOLE, REGION))

#: Card-only cost view read by the ``state_agnostic`` control: replay without preservation.
#: Never executed, so it is not an :class:`Option`.
RECOMPUTE_ONLY = "recompute_only"
