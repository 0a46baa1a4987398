"""JAX versions of the five program families: functional, native in-place, impure holder.

``functional(x, w, state, p) -> (out, new_state)`` threads ``state = {"key", "buf"}`` (the
PRNG key and the hidden buffer) out of place with ``.at[]``. ``inplace(x, w, state, p)`` is
the same program written with NumPy-style item assignment, as the Torch program writes in
place. ``impure(x, w, holder, p)`` reads the key and buffer from a Python object and
reassigns them there (a side effect JAX transformations cannot see).

Never adjust a program to obtain an expected outcome (paper §5).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from ._families import ProgramParams

sg = jax.lax.stop_gradient


def _mask(key, p: ProgramParams, dtype):
    # Inverted dropout drawn from the threaded key; the new key is returned as state (R3/R4).
    key, sub = jax.random.split(key)
    keep = jax.random.uniform(sub, p.shape, dtype=dtype) >= p.drop
    return keep.astype(dtype) / (1.0 - p.drop), key


# --- functional programs --------------------------------------------------------------------
def local_strided_functional(x, w, state, p: ProgramParams):
    m, key = _mask(state["key"], p, x.dtype)
    h = x * w * m
    h = h.at[:, p.offset::p.stride].set(h[:, p.offset::p.stride] * p.decay + p.bias)
    return jnp.tanh(h), {**state, "key": key}


def local_overlap_functional(x, w, state, p: ProgramParams):
    m, key = _mask(state["key"], p, x.dtype)
    h = x * w * m
    h = h.at[: p.n - p.shift].set(h[: p.n - p.shift] * p.decay)
    return jnp.tanh(h[p.shift:]) + h[: p.n - p.shift], {**state, "key": key}


def hidden_strided_functional(x, w, state, p: ProgramParams):
    buf = state["buf"]
    m, key = _mask(state["key"], p, x.dtype)
    h = x * w * m
    z = jnp.tanh(h + buf)
    region = (slice(None), slice(p.offset, None, p.stride))
    buf = buf.at[region].set(buf[region] * p.decay + sg(h[region]) * (1.0 - p.decay))
    return z, {**state, "key": key, "buf": buf}


def hidden_overlap_functional(x, w, state, p: ProgramParams):
    buf = state["buf"]
    m, key = _mask(state["key"], p, x.dtype)
    h = x * w * m
    k = p.n - p.shift
    buf = buf.at[:k].set(buf[:k] * p.decay + sg(h[:k]) * (1.0 - p.decay))
    return jnp.tanh(h[p.shift:] + buf[p.shift:]), {**state, "key": key, "buf": buf}


def raw_overlap_copy_functional(x, w, state, p: ProgramParams):
    m, key = _mask(state["key"], p, x.dtype)
    h = x * w * m
    h = h.at[p.shift:].set(h[: p.n - p.shift])  # R1: reads the versions before the write
    return jnp.tanh(h), {**state, "key": key}


# --- native in-place programs (item assignment, as the Torch programs write) ---------------
def local_strided_inplace(x, w, state, p: ProgramParams):
    m, key = _mask(state["key"], p, x.dtype)
    h = x * w * m
    h[:, p.offset::p.stride] = h[:, p.offset::p.stride] * p.decay + p.bias
    return jnp.tanh(h)


def local_overlap_inplace(x, w, state, p: ProgramParams):
    m, key = _mask(state["key"], p, x.dtype)
    h = x * w * m
    h[: p.n - p.shift] = h[: p.n - p.shift] * p.decay
    return jnp.tanh(h[p.shift:]) + h[: p.n - p.shift]


def hidden_strided_inplace(x, w, state, p: ProgramParams):
    buf = state["buf"]
    m, key = _mask(state["key"], p, x.dtype)
    h = x * w * m
    z = jnp.tanh(h + buf)
    buf[:, p.offset::p.stride] = (buf[:, p.offset::p.stride] * p.decay
                                  + sg(h[:, p.offset::p.stride]) * (1.0 - p.decay))
    return z


def hidden_overlap_inplace(x, w, state, p: ProgramParams):
    buf = state["buf"]
    m, key = _mask(state["key"], p, x.dtype)
    h = x * w * m
    k = p.n - p.shift
    buf[:k] = buf[:k] * p.decay + sg(h[:k]) * (1.0 - p.decay)
    return jnp.tanh(h[p.shift:] + buf[p.shift:])


def raw_overlap_copy_inplace(x, w, state, p: ProgramParams):
    m, key = _mask(state["key"], p, x.dtype)
    h = x * w * m
    h[p.shift:] = h[: p.n - p.shift]
    return jnp.tanh(h)


# --- impure holder (hidden-buffer families) -------------------------------------------------
class Holder:
    """A Python object holding the PRNG key and hidden buffer that a program reassigns."""

    def __init__(self, key: Any, buf: Any):
        self.key = key
        self.buf = buf


def make_impure(functional: Callable) -> Callable:
    """The impure-holder form of a functional program: reads and reassigns ``holder``."""

    def impure(x, w, holder: Holder, p: ProgramParams):
        out, new = functional(x, w, {"key": holder.key, "buf": holder.buf}, p)
        holder.key, holder.buf = new["key"], new["buf"]  # side effect invisible to JAX
        return out

    impure.__name__ = functional.__name__.replace("_functional", "_impure")
    return impure


#: family -> (functional program, native in-place program)
JAX_PROGRAMS: dict[str, tuple[Callable, Callable]] = {
    "local_strided": (local_strided_functional, local_strided_inplace),
    "local_overlap": (local_overlap_functional, local_overlap_inplace),
    "hidden_strided": (hidden_strided_functional, hidden_strided_inplace),
    "hidden_overlap": (hidden_overlap_functional, hidden_overlap_inplace),
    "raw_overlap_copy": (raw_overlap_copy_functional, raw_overlap_copy_inplace),
}
