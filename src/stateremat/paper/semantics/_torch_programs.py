"""Torch versions of the five program families: an in-place program and its functional twin.

``inplace(x, w, state, p)`` writes in place (local tensors, views, or the hidden buffer
``state["buf"]``) and returns the output; ``functional(x, w, state, p)`` computes the same
program out of place and returns ``(out, new_state)``. Both draw the dropout mask from the
global generator of the tensors' device, so checkpoint RNG preservation applies to them (R3).

Never adjust a program to obtain an expected outcome: the cohort records what each
framework does with these exact programs (paper §5).
"""
from __future__ import annotations

from typing import Callable

import torch

from ._families import ProgramParams


def _mask(p: ProgramParams, like: torch.Tensor) -> torch.Tensor:
    # Inverted dropout drawn inside the segment: a replay must see the same draw (R3).
    keep = torch.rand(p.shape, dtype=like.dtype, device=like.device) >= p.drop
    return keep.to(like.dtype) / (1.0 - p.drop)


# --- local strided writes: a strided region of a local activation is rewritten ------------
def local_strided_inplace(x, w, state, p: ProgramParams):
    h = x * w * _mask(p, x)
    h[:, p.offset::p.stride] = h[:, p.offset::p.stride] * p.decay + p.bias
    return torch.tanh(h)


def local_strided_functional(x, w, state, p: ProgramParams):
    h = x * w * _mask(p, x)
    cols = torch.arange(p.offset, p.cols, p.stride, device=x.device)
    h = h.index_copy(1, cols, h.index_select(1, cols) * p.decay + p.bias)
    return torch.tanh(h), dict(state)


# --- local overlapping views: a write through one view is read through another -----------
def local_overlap_inplace(x, w, state, p: ProgramParams):
    h = x * w * _mask(p, x)
    a, b = h[: p.n - p.shift], h[p.shift:]
    a.mul_(p.decay)
    return torch.tanh(b) + a


def local_overlap_functional(x, w, state, p: ProgramParams):
    h = x * w * _mask(p, x)
    h = torch.cat([h[: p.n - p.shift] * p.decay, h[p.n - p.shift:]])
    return torch.tanh(h[p.shift:]) + h[: p.n - p.shift], dict(state)


# --- hidden-buffer strided writes: a running average at a strided region of a buffer -----
def hidden_strided_inplace(x, w, state, p: ProgramParams):
    buf = state["buf"]
    h = x * w * _mask(p, x)
    z = torch.tanh(h + buf)  # reads the pre-write buffer
    with torch.no_grad():  # a statistics update, as BatchNorm running stats
        region = buf[:, p.offset::p.stride]
        region.mul_(p.decay).add_(h[:, p.offset::p.stride] * (1.0 - p.decay))
    return z


def hidden_strided_functional(x, w, state, p: ProgramParams):
    buf = state["buf"]
    h = x * w * _mask(p, x)
    z = torch.tanh(h + buf)
    cols = torch.arange(p.offset, p.cols, p.stride, device=x.device)
    upd = buf.index_select(1, cols) * p.decay + h.detach().index_select(1, cols) * (1.0 - p.decay)
    return z, {**state, "buf": buf.index_copy(1, cols, upd)}


# --- hidden-buffer overlapping views: write through one view of a buffer, read another ----
def hidden_overlap_inplace(x, w, state, p: ProgramParams):
    buf = state["buf"]
    h = x * w * _mask(p, x)
    a, b = buf[: p.n - p.shift], buf[p.shift:]
    with torch.no_grad():
        a.mul_(p.decay).add_(h[: p.n - p.shift] * (1.0 - p.decay))
    return torch.tanh(h[p.shift:] + b)  # b aliases the written region of a


def hidden_overlap_functional(x, w, state, p: ProgramParams):
    buf = state["buf"]
    h = x * w * _mask(p, x)
    m = p.n - p.shift
    new = torch.cat([buf[:m] * p.decay + h.detach()[:m] * (1.0 - p.decay), buf[m:]])
    return torch.tanh(h[p.shift:] + new[p.shift:]), {**state, "buf": new}


# --- raw overlapping copy: copy between overlapping views of a tensor requiring grad -----
def raw_overlap_copy_inplace(x, w, state, p: ProgramParams):
    h = x * w * _mask(p, x)
    h[p.shift:].copy_(h[: p.n - p.shift])
    return torch.tanh(h)


def raw_overlap_copy_functional(x, w, state, p: ProgramParams):
    h = x * w * _mask(p, x)
    # R1: the copy reads the versions current before the write.
    h = torch.cat([h[: p.shift], h[: p.n - p.shift]])
    return torch.tanh(h), dict(state)


Program = Callable
#: family -> (in-place program, functional program)
TORCH_PROGRAMS: dict[str, tuple[Program, Program]] = {
    "local_strided": (local_strided_inplace, local_strided_functional),
    "local_overlap": (local_overlap_inplace, local_overlap_functional),
    "hidden_strided": (hidden_strided_inplace, hidden_strided_functional),
    "hidden_overlap": (hidden_overlap_inplace, hidden_overlap_functional),
    "raw_overlap_copy": (raw_overlap_copy_inplace, raw_overlap_copy_functional),
}
