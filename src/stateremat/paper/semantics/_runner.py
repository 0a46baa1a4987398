"""Run the replay-semantics cohort: every (backend, method, family, seed, dtype) once.

Rows go to a :class:`~stateremat.contract.RecordStore` (table :data:`SEMANTICS_TABLE`, the
paper's 5,900 records for 50 seeds; the ``stateremat.jax.checkpoint`` rows go to
:data:`EXTENSION_TABLE` so the paper's counts stay as specified). A rerun with the same
``out_dir`` skips finished rows.
"""
from __future__ import annotations

import inspect
import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from ...contract import Outcome
from ..._shared.io import source_hash, utc_now
from .. import Progress, as_progress
from ..records import RecordStore, table_spec
from ..records.tables import EXTENSION_TABLE, SEMANTICS_TABLE
from ._compare import StageError, compare
from ._families import (DTYPES, FAMILIES, JAX_METHODS, STATEREMAT_JAX_METHOD, TORCH_METHOD_NAMES,
                        program_data, program_params)

#: The key of both tables (their rows are declared in ``records.tables``, below this wing).
KEY = table_spec(SEMANTICS_TABLE).key

_FLUSH_EVERY = 100  # rows, or
_FLUSH_S = 2.0  # seconds: a kill -9 loses at most this much finished work


@dataclass(frozen=True)
class Unit:
    """One execution: a method applied to one condition (program × dtype)."""

    table: str
    backend: str
    method: str
    family: str
    seed: int
    dtype: str

    @property
    def key(self) -> tuple:
        return (self.backend, self.method, self.family, self.seed, self.dtype)


def cohort_units(seeds: Sequence[int]) -> list[Unit]:
    """Every unit of the cohort for ``seeds``, ordered so each condition's methods are adjacent.

    With torch and jax importable, ``len(...)`` is ``118 * len(seeds)`` (5,900 + 500 for 50
    seeds). Backends whose framework is missing are left out (never faked).
    """
    units = []
    for family in FAMILIES:
        for seed in seeds:
            for dtype in DTYPES:
                for m in TORCH_METHOD_NAMES:
                    units.append(Unit(SEMANTICS_TABLE, "torch", m, family, seed, dtype))
                for m, fams in JAX_METHODS.items():
                    if fams is None or family in fams:
                        units.append(Unit(SEMANTICS_TABLE, "jax", m, family, seed, dtype))
                units.append(Unit(EXTENSION_TABLE, "jax", STATEREMAT_JAX_METHOD, family, seed,
                                  dtype))
    return units


def _program_hash(backend: str, family: str, params: dict) -> str:
    if backend == "torch":
        from . import _torch_programs as mod
        fns = [*mod.TORCH_PROGRAMS[family], mod._mask]
    else:
        from . import _jax_programs as mod
        fns = [*mod.JAX_PROGRAMS[family], mod._mask, mod.make_impure]
    return source_hash({"backend": backend, "params": params,
                        "source": [inspect.getsource(f) for f in fns]})


def _execute(unit: Unit, device: str) -> tuple[dict, int, list[str]]:
    p = program_params(unit.family, unit.seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # keep framework warnings as observations
        if unit.backend == "torch":
            from ._torch_methods import run_torch
            obs, count = run_torch(unit.method, p, program_data(p), unit.dtype, device)
        else:
            from ._jax_methods import run_jax
            obs, count = run_jax(unit.method, p, program_data(p), unit.dtype)
    return obs, count, [f"{w.category.__name__}: {str(w.message).splitlines()[0]}"
                        for w in caught]


def execute_unit(unit: Unit, reference: dict | None, versions: dict[str, str],
                 device: str = "cpu") -> dict:
    """Run ``unit`` and return its record (outcome against ``reference`` observations).

    Args:
        reference: observations of the functional reference for the unit's condition, or
            ``None`` if the reference itself raised (outcome ``unsupported`` then).
        versions: backend -> framework version string.
        device: torch device for torch units (JAX units always run on CPU).
    """
    p = program_params(unit.family, unit.seed)
    row: dict = {k: v for k, v in zip(KEY, unit.key)}
    row.update(outcome=None, max_abs_diff_out=None, max_abs_diff_grad=None,
               max_abs_diff_state=None, max_abs_diff_rng=None, max_rel_diff=None,
               exception_type=None, exception_message=None, exception_stage=None,
               invocation_count=None, warnings=None)
    t0 = time.perf_counter()
    try:
        obs, count, warned = _execute(unit, device)
        row["invocation_count"] = count
        row["warnings"] = json.dumps(warned) if warned else None
        if reference is None:
            row["outcome"] = Outcome.UNSUPPORTED.value
            row["exception_message"] = "the functional reference raised; nothing to compare"
        else:
            outcome, diffs = compare(reference, obs, unit.dtype)
            row["outcome"] = outcome.value
            row.update(diffs)
    except StageError as err:
        row["outcome"] = Outcome.R.value
        row["exception_type"] = f"{type(err.exc).__module__}.{type(err.exc).__qualname__}"
        row["exception_message"] = (str(err.exc).strip().splitlines() or [""])[0]
        row["exception_stage"] = err.stage
        row["invocation_count"] = err.invocation_count
    row.update(elapsed_s=time.perf_counter() - t0, framework_version=versions[unit.backend],
               device=device if unit.backend == "torch" else "cpu",
               program_hash=_program_hash(unit.backend, unit.family, p.as_dict()),
               params_json=json.dumps(p.as_dict(), sort_keys=True), created_utc=utc_now())
    return row


def _conditions(units: Iterable[Unit]) -> Iterator[tuple[tuple, list[Unit]]]:
    groups: dict[tuple, list[Unit]] = {}
    for u in units:
        groups.setdefault((u.backend, u.family, u.seed, u.dtype), []).append(u)
    yield from groups.items()


@dataclass
class RunReport:
    """What one call of :func:`run_semantics` did."""

    written: dict[str, int]
    skipped_done: int
    unavailable: dict[str, str]  # "backend/method" -> reason (rows not written, never faked)


def _versions() -> tuple[dict[str, str], dict[str, str]]:
    versions, missing = {}, {}
    try:
        import torch
        versions["torch"] = torch.__version__
    except ImportError as exc:
        missing["torch"] = f"torch is not importable ({exc})"
    try:
        import jax
        import jaxlib
        versions["jax"] = f"jax {jax.__version__}, jaxlib {jaxlib.__version__}"
    except ImportError as exc:
        missing["jax"] = f"jax is not importable ({exc})"
    return versions, missing


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when torch sees a GPU, else ``"cpu"``; others unchanged.

    Raises:
        ValueError: ``device`` is not ``auto``, ``cpu`` or ``cuda[:N]``, or CUDA is asked for
            but unavailable.
    """
    if device == "auto":
        try:
            import torch
            return "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            return "cpu"
    if device == "cpu":
        return device
    if device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"stateremat semantics: device {device!r} requested, but this torch "
                             f"({torch.__version__}) sees no CUDA device. Tip: use --device cpu "
                             "or auto.")
        return device
    raise ValueError(f"stateremat semantics: device {device!r} is not one of auto, cpu, "
                     "cuda, cuda:N. Tip: use auto.")


def run_semantics(seeds: Sequence[int], out_dir: str | Path, *, progress: Progress | None = None,
                  device: str = "auto") -> RunReport:
    """Run (or resume) the replay-semantics cohort for ``seeds`` into ``out_dir``.

    Args:
        seeds: seed keys, e.g. ``range(420000, 420050)`` (the paper's 50).
        out_dir: run folder; tables :data:`SEMANTICS_TABLE` and :data:`EXTENSION_TABLE`.
        progress: where to report units done (``stateremat._shared.progress.progress_bar``); None:
            nowhere.
        device: torch device (``auto``: CUDA when available); recorded in the run config,
            so a resumed run must use the same one. JAX always runs on CPU.

    Returns:
        A :class:`RunReport`; rows of unavailable methods are not written (a later run with
        the method available fills them in).

    Raises:
        RecordsError: ``out_dir`` holds a run with a different configuration.

    References:
        Paper §5 and Table 2.
    """
    seeds = [int(s) for s in seeds]
    device = resolve_device(device)
    versions, missing = _versions()
    units = [u for u in cohort_units(seeds) if u.backend in versions]
    unavailable = {f"{b}/*": why for b, why in missing.items()}
    if "torch" in versions:
        from ._torch_methods import torch_method_available
        for m in TORCH_METHOD_NAMES:
            why = torch_method_available(m)
            if why:
                unavailable[f"torch/{m}"] = why
                units = [u for u in units if not (u.backend == "torch" and u.method == m)]
    config = {"experiment": "semantics", "seeds": seeds, "families": list(FAMILIES),
              "dtypes": list(DTYPES), "torch_device": device}
    stores = {t: RecordStore(out_dir, t, key=KEY, meta=config)
              for t in (SEMANTICS_TABLE, EXTENSION_TABLE)}
    done = {t: s.done_keys() for t, s in stores.items()}
    pending = [u for u in units if u.key not in done[u.table]]
    buffers: dict[str, list[dict]] = {t: [] for t in stores}
    written = {t: 0 for t in stores}

    last = [time.monotonic()]

    def flush() -> None:
        for t, rows in buffers.items():
            batch = rows[:]
            rows.clear()  # before the write: a stop inside append must not make `finally` write them twice
            written[t] += stores[t].append(batch)  # (a stop before its atomic part: redone on resume)
        last[0] = time.monotonic()

    task = as_progress(progress, "run_semantics").task("semantics", total=len(pending))
    try:
        for (backend, family, seed, dtype), group in _conditions(pending):
            task.update(description=f"semantics {backend} {family} {seed} {dtype}")
            ctx = _x64() if backend == "jax" else _null()
            with ctx:
                ref_unit = Unit("", backend, "functional_reference", family, seed, dtype)
                try:
                    reference = _execute(ref_unit, device)[0]
                except Exception:  # noqa: BLE001 — recorded as 'unsupported' below
                    reference = None
                for u in group:
                    buffers[u.table].append(execute_unit(u, reference, versions, device))
                    task.advance()
            if (sum(map(len, buffers.values())) >= _FLUSH_EVERY
                    or time.monotonic() - last[0] >= _FLUSH_S):
                flush()
    finally:
        flush()  # finished rows are never lost on interruption
    return RunReport(written=written, skipped_done=len(units) - len(pending),
                     unavailable=unavailable)


class _x64:
    """JAX on CPU with 64-bit types, for this block only (thread-local, restored on exit)."""

    def __enter__(self):
        import contextlib

        import jax
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(jax.enable_x64(True))
        self._stack.enter_context(jax.default_device(jax.devices("cpu")[0]))
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
