"""Shared fixtures."""
from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _runtime_per_test():
    """Each test starts in a new ``stateremat.torch`` runtime, as a new process would: what an
    earlier test left (live graphs' retained bytes, learned state, ``unreached_writes``) cannot
    change its result whatever order the tests run in (``pytest -n``)."""
    mod = sys.modules.get("stateremat.torch._runtime")
    if mod is None:  # not imported yet: the first use creates a fresh one anyway
        yield
        return
    old = mod._LOCAL.rt
    mod._LOCAL.rt = mod.Runtime()
    try:
        yield
    finally:
        mod._LOCAL.rt = old


@pytest.fixture
def fresh_runtime():
    """A new ``stateremat.torch`` runtime for this test's thread (zeroed preservation statistics).

    Other tests' graphs may still be alive (a test's exception keeps its frames), so tests that
    assert absolute statistics run in a runtime of their own; the runtime is thread-local state,
    swapped back afterwards.
    """
    from stateremat.torch import _runtime

    old = _runtime._LOCAL.rt
    _runtime._LOCAL.rt = rt = _runtime.Runtime()
    try:
        yield rt
    finally:
        _runtime._LOCAL.rt = old


@pytest.fixture
def journal_every_storage():
    """Under ``region``, journal every declared storage of this test, however small (the
    whole-snapshot threshold ``SMALL_STORAGE_BYTES`` lowered to 0 for the test)."""
    from _journal import journal_every_storage as lowered

    with lowered():
        yield
