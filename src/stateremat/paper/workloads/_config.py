"""Workload parameters and the named scale presets (``h100`` = paper shapes, ``cpu`` = scaled,
``cpu-faithful`` = ``cpu`` with the paper's share of state copies in a step).

The ``cpu`` preset keeps every shape of the paper's H100 experiments and divides every byte
quantity by :data:`CPU_BYTES_FACTOR` = 1024: state buffers (1,024 MiB -> 1 MiB, 64 MiB -> 64 KiB),
activations (width and batch each divided by 32, so one ``(batch, width)`` float32 activation is
1 GiB / 1024 = 1 MiB in the large cell) and logical budgets (20/32/44 GiB -> 20/32/44 MiB).
Counts are not scaled: segments, live versions, write fractions, warmups. The region journal
keeps exactly the bytes each write changes (``granularity_bytes=None``, the library's default
since issue 15); ``granularity_bytes=4096`` gives the paper's 4,096-byte pages, which at the cpu
scale touch relatively more of the buffer than on the H100 (1 region of 256 per segment instead
of 256 of 262,144).

The ``cpu-faithful`` preset is ``cpu`` with the state buffers 16 times larger: state bytes are
the paper's divided by :data:`FAITHFUL_STATE_FACTOR` = 64 (1,024 MiB -> 16 MiB, 64 MiB -> 1 MiB),
while activations, budgets and counts are exactly ``cpu``'s. It exists for *time*. Dividing every
byte by 1,024 keeps the paper's memory ratios but not where a step's time goes: a 1 MiB state
copies in about 20 us (2.3-2.7 ms for a step's 128 copies, ``benchmarks/bench_region_floor.py``),
so in the ``workloads3`` cells the copies a whole snapshot makes are ~6 % of its step here,
against 68 / 34 / 44 % (queue / prototype / recurrence) on the H100 (issue 26),
and the per-segment host cost both replay methods pay (Python bookkeeping, which does not shrink
with bytes) decides regions/whole instead (about 1 at ``cpu``). At 16 MiB the copies again take
the paper's share of the step, so regions/whole shows the paper's regime (regions < whole).
Memory ratios of this preset are not the paper's (the state is 16x larger against the
activations and budgets than on the H100); read them from ``cpu``. In short: ``cpu`` for
memory and planner shapes (every ratio of bytes), ``cpu-faithful`` for the time of state
preservation.

The ``tiny`` preset divides bytes by 2^16 (width and batch by 256 each): every run of an
experiment takes seconds, which is what the test suite uses; its numbers are not the paper's.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

WORKLOADS = ("feature_queue", "prototype_memory", "unrolled_recurrence")
PRESETS = ("h100", "cpu", "cpu-faithful", "tiny")

#: cpu preset = h100 bytes / CPU_BYTES_FACTOR (width and batch each / CPU_DIM_FACTOR).
CPU_BYTES_FACTOR = 1024
CPU_DIM_FACTOR = 32
#: cpu-faithful preset: state bytes = h100 state bytes / FAITHFUL_STATE_FACTOR; the rest as cpu.
FAITHFUL_STATE_FACTOR = 64
#: tiny preset (the test suite's scale: seconds per run) = h100 bytes / TINY_BYTES_FACTOR.
TINY_BYTES_FACTOR = 2**16
TINY_DIM_FACTOR = 256
_MIB = 1024**2
_GIB = 1024**3


@dataclass(frozen=True)
class WorkloadConfig:
    """One stateful workload shape: a chain of segments over one declared state buffer.

    Args:
        workload: one of :data:`WORKLOADS`.
        state_bytes: size of the declared state buffer ``(rows, width)``, bytes.
        write_fraction: fraction of the buffer's rows each live segment writes per step (0, 1].
        live_versions: number of segments that write the buffer (the last ones of the chain);
            each write creates a version whose history must stay recoverable for replay.
        segments: number of segments in the chain (``>= live_versions``).
        width: feature width of activations and state rows.
        batch: rows of the input batch; activations are ``(batch, width)``.
        granularity_bytes: region journal rounding, bytes; ``None`` keeps exactly the written
            bytes (runs closer than 16 bytes merged).
        dtype: ``"float32"`` or ``"float64"``.
        dropout: dropout probability inside each segment (exercises RNG replay, R3).
        seed: seed for parameters, inputs and index choices.

    Raises:
        ValueError: on an unknown workload, non-positive sizes or a write fraction outside (0, 1].

    References:
        Paper §8 (factorial grid), §9 (activation-pressure cells).
    """

    workload: str = "feature_queue"
    state_bytes: int = _MIB
    write_fraction: float = 0.001
    live_versions: int = 16
    segments: int = 16
    width: int = 128
    batch: int = 2048
    granularity_bytes: int | None = None
    dtype: str = "float32"
    dropout: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"WorkloadConfig: workload {self.workload!r} is not one of {WORKLOADS}. "
                             "Tip: use feature_queue, prototype_memory or unrolled_recurrence.")
        if not 0 < self.write_fraction <= 1:
            raise ValueError(f"WorkloadConfig: write_fraction must be in (0, 1], got "
                             f"{self.write_fraction}. Tip: 0.001 is sparse, 1 is dense.")
        for name in ("state_bytes", "live_versions", "segments", "width", "batch", "granularity_bytes"):
            if name == "granularity_bytes" and self.granularity_bytes is None:
                continue
            if getattr(self, name) <= 0:
                raise ValueError(f"WorkloadConfig: {name} must be positive, got "
                                 f"{getattr(self, name)}. Tip: sizes are bytes, counts integers.")
        if self.live_versions > self.segments:
            raise ValueError(f"WorkloadConfig: live_versions ({self.live_versions}) exceeds segments "
                             f"({self.segments}). Tip: at most one version per segment.")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"WorkloadConfig: dtype must be float32 or float64, got {self.dtype!r}.")
        if self.state_rows < 1:
            raise ValueError(f"WorkloadConfig: state_bytes {self.state_bytes} holds no row of width "
                             f"{self.width}. Tip: state_bytes >= width * itemsize.")

    @property
    def hidden(self) -> int:
        """Hidden width of each segment's dense block: ``round(1.25 * width)`` (see ``_chain``)."""
        return max(self.width, round(1.25 * self.width))

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 8

    @property
    def state_rows(self) -> int:
        """Rows of the ``(rows, width)`` state buffer (float32 sizing; float64 doubles bytes)."""
        return self.state_bytes // (self.width * 4)

    @property
    def write_rows(self) -> int:
        """Rows each live segment writes per step (at least one)."""
        return max(1, min(self.state_rows, round(self.write_fraction * self.state_rows)))

    @property
    def estimated_peak_bytes(self) -> int:
        """A rough upper estimate of one training step's peak allocation, bytes.

        Parameters with gradients and momentum (3 × ``segments × (2 width hidden + hidden)``
        elements), every segment's eager activations (``batch × (width + hidden)`` elements
        each) and the state buffer with one whole snapshot per live version
        (``(2 + live_versions) × state_bytes``). Commands refuse a shape whose estimate exceeds
        the memory the device has, before allocating anything.
        """
        per_segment = 3 * (2 * self.width * self.hidden + self.hidden) \
            + self.batch * (self.width + self.hidden)
        return int(self.segments * per_segment * self.itemsize
                   + (2 + self.live_versions) * self.state_bytes)

    @property
    def segment_names(self) -> list[str]:
        """The chain's segment names in forward order (``seg0`` … ``seg{segments-1}``), as a
        profile card of this workload names its segments."""
        return [f"seg{i}" for i in range(self.segments)]

    def replace(self, **changes) -> "WorkloadConfig":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def scale(preset: str) -> dict:
    """Byte and dimension scale of ``preset`` relative to the paper's H100 shapes.

    Returns:
        ``{"bytes_factor": int, "dim_factor": int, "state_factor": int}``: H100 bytes / preset
        bytes (activations and budgets), H100 width (or batch) / preset width, and H100 state
        bytes / preset state bytes (``bytes_factor`` except for ``cpu-faithful``).

    Raises:
        ValueError: on an unknown preset.
    """
    if preset == "h100":
        return {"bytes_factor": 1, "dim_factor": 1, "state_factor": 1}
    if preset == "cpu":
        return {"bytes_factor": CPU_BYTES_FACTOR, "dim_factor": CPU_DIM_FACTOR,
                "state_factor": CPU_BYTES_FACTOR}
    if preset == "cpu-faithful":
        return {"bytes_factor": CPU_BYTES_FACTOR, "dim_factor": CPU_DIM_FACTOR,
                "state_factor": FAITHFUL_STATE_FACTOR}
    if preset == "tiny":
        return {"bytes_factor": TINY_BYTES_FACTOR, "dim_factor": TINY_DIM_FACTOR,
                "state_factor": TINY_BYTES_FACTOR}
    raise ValueError(f"preset {preset!r} is not one of {PRESETS}. Tip: use --preset cpu here "
                     "(cpu-faithful for the paper's share of state copies in a step), h100 on an "
                     "80+ GiB GPU.")


def scaled_bytes(h100_bytes: int, preset: str) -> int:
    """``h100_bytes`` (activations, budgets) at ``preset`` scale (exact division by the bytes
    factor)."""
    return h100_bytes // scale(preset)["bytes_factor"]


def scaled_state_bytes(h100_bytes: int, preset: str) -> int:
    """A state buffer of ``h100_bytes`` at ``preset`` scale (division by the state factor)."""
    return h100_bytes // scale(preset)["state_factor"]


def scaled_dim(h100_dim: int, preset: str) -> int:
    """A width or batch of the paper at ``preset`` scale (at least 1)."""
    return max(1, h100_dim // scale(preset)["dim_factor"])


def preset_config(preset: str, *, workload: str = "feature_queue", state_mib: int = 1024,
                  write_fraction: float = 0.001, live_versions: int = 16,
                  activations: str = "large", **overrides) -> WorkloadConfig:
    """A :class:`WorkloadConfig` given in the paper's H100 units, scaled to ``preset``.

    Args:
        preset: one of :data:`PRESETS` (``"tiny"``: tests).
        workload: one of :data:`WORKLOADS`.
        state_mib: the paper's state size in MiB (64 or 1,024), scaled by the preset's state
            factor (1,024 MiB -> 1 MiB at ``cpu``, 16 MiB at ``cpu-faithful``).
        write_fraction: 0.001 (sparse) or 1 (dense); not scaled.
        live_versions: live segments (1, 16 or 64); also the segment count.
        activations: ``"large"`` = width/batch 4,096/65,536, ``"small"`` = 256/256 (paper §9),
            scaled by the preset.
        overrides: any other :class:`WorkloadConfig` field.

    Returns:
        The validated config.

    Raises:
        ValueError: on an unknown preset or activation size.
    """
    if activations not in ("large", "small"):
        raise ValueError(f"preset_config: activations must be 'large' or 'small', got {activations!r}.")
    width, batch = (4096, 65536) if activations == "large" else (256, 256)
    fields = dict(workload=workload, state_bytes=scaled_state_bytes(state_mib * _MIB, preset),
                  write_fraction=write_fraction, live_versions=live_versions,
                  segments=live_versions, width=scaled_dim(width, preset),
                  batch=scaled_dim(batch, preset))
    fields.update(overrides)
    return WorkloadConfig(**fields)


def preset_budget(h100_gib: float, preset: str) -> int:
    """A logical budget of the paper (20, 32 or 44 GiB) at ``preset`` scale, bytes."""
    return int(h100_gib * _GIB) // scale(preset)["bytes_factor"]
