"""Thread-local bookkeeping: segments whose forward is running, replays in progress.

Replays can run on autograd worker threads (CUDA); each thread sees its own stacks, which
is what nesting needs: a checkpoint met *during* a replay runs on the replaying thread.
"""
from __future__ import annotations

import threading
from typing import Any


class _Local(threading.local):
    def __init__(self) -> None:
        self.forward: list[Any] = []  # segments whose original forward is running, innermost last
        self.replay: list[Any] = []  # replay transactions running, innermost last
        self.mode_depth = 0  # journaling dispatch mode pushed (forward role) on this thread


LOCAL = _Local()


def replaying() -> bool:
    """True while a checkpointed segment is being replayed (recomputed) on this thread.

    Public as ``stateremat.torch.is_replaying()``: code with Python side effects (a forward
    hook that logs, counts or appends to a list) can skip them during the replay, so they
    happen once per step as in eager execution::

        def hook(module, inputs, output):
            if not stateremat.torch.is_replaying():
                seen.append(output.detach())

    Returns:
        bool.
    """
    return bool(LOCAL.replay)
