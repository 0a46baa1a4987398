"""Helpers for tests that must exercise the region journal itself.

Under ``region`` a storage of at most ``SMALL_STORAGE_BYTES`` (16 KiB) is kept by a whole
snapshot, so a test with tiny buffers never builds a journal. :func:`journal_every_storage`
lowers the threshold to 0 for a block (every declared storage under ``region`` is journaled);
the ``journal_every_storage`` fixture of ``conftest.py`` does the same for one test.
"""
from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def journal_every_storage() -> Iterator[None]:
    """Journal every ``region`` storage in the block, however small (threshold 0)."""
    from stateremat.torch import _txn

    old = _txn.SMALL_STORAGE_BYTES
    _txn.SMALL_STORAGE_BYTES = 0
    try:
        yield
    finally:
        _txn.SMALL_STORAGE_BYTES = old


class JournalSpy:
    """Counts journals built and entries recorded (``Journal.record`` calls that kept bytes) in a block.

    ``journals``: journals built; ``entries``: the entries recorded; ``bytes``: the old bytes they kept.
    """

    def __init__(self) -> None:
        self.journals = 0  # journals built (one per declared storage preserved by region)
        self.entries = 0
        self.bytes = 0
        self._old = None

    def __enter__(self) -> "JournalSpy":
        from stateremat.torch._preserve import region

        self._old = old_record, old_init, old_elements = \
            region.Journal.record, region.Journal.__init__, region.Journal.record_elements

        def record(journal, runs):
            n = old_record(journal, runs)
            if n:
                self.entries += 1
                self.bytes += n
            return n

        def record_elements(journal, w):  # (the device path's indexed writes)
            n = old_elements(journal, w)
            if n:
                self.entries += 1
                self.bytes += n
            return n

        def init(journal, *args, **kwargs):
            self.journals += 1
            old_init(journal, *args, **kwargs)

        region.Journal.record, region.Journal.__init__, region.Journal.record_elements = record, init, record_elements
        return self

    def __exit__(self, *exc) -> None:
        from stateremat.torch._preserve import region

        region.Journal.record, region.Journal.__init__, region.Journal.record_elements = self._old
