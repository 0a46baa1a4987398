"""Preservers: one implementation per replaying option of ``stateremat.contract.OPTIONS``.

To add an option: register it in ``contract/_options.py``, write ``<name>.py`` here with a
:class:`Preserver` subclass whose ``name`` is the option's, and add it to :data:`PRESERVERS`.
"""
from ._base import Preserver as Preserver, Restored as Restored
from .region import RegionPreserver as RegionPreserver
from .whole import WholePreserver as WholePreserver

#: Option name -> Preserver class, for every option that replays.
PRESERVERS: dict[str, type[Preserver]] = {p.name: p for p in (WholePreserver, RegionPreserver)}

__all__ = ["PRESERVERS", "Preserver", "Restored", "RegionPreserver", "WholePreserver"]
