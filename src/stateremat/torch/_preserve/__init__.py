"""Preservers: one implementation per replaying option of ``stateremat.contract.OPTIONS``.

To add an option: register it in ``contract/_options.py``, write ``<name>.py`` here with a
:class:`Preserver` subclass whose ``name`` is the option's, and add it to :data:`PRESERVERS`.
A transaction begins, restores and reinstates all its preservers at once (:func:`begin_all`,
:func:`restore_all`, :func:`reinstate_all`: small whole snapshots are copied in batches).
"""
from ._base import Preserver as Preserver, Restored as Restored
from .region import RegionPreserver as RegionPreserver
from .whole import WholePreserver as WholePreserver
from .whole import begin_all as begin_all, reinstate_all as reinstate_all, restore_all as restore_all

#: Option name -> Preserver class, for every option that replays.
PRESERVERS: dict[str, type[Preserver]] = {p.name: p for p in (WholePreserver, RegionPreserver)}

#: The engine of a storage the transaction keeps whole whatever the segment's option (a small
#: storage, or one a kernel writes past every write handler): it needs no write to be seen.
KEPT_WHOLE: type[Preserver] = WholePreserver

__all__ = ["KEPT_WHOLE", "PRESERVERS", "Preserver", "Restored", "RegionPreserver", "WholePreserver",
           "begin_all", "reinstate_all", "restore_all"]
