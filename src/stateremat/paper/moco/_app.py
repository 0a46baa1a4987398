"""Dense-queue application (paper §12, Table 9, Figure 3C): seven methods, one seed at a time.

For each ``(seed, method)``: build the MoCo model from the seed, wrap its seven segments for the
method, train the encoder with deterministic algorithms and seeded data order / augmentation,
unwrap, fit the frozen-encoder linear probe, and write the per-image test scores. One raw row per
``(seed, method)`` goes to the ``moco`` records table; :func:`summarize` recomputes
``summary.json`` from those rows only.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..._shared.io import atomic_write_bytes, loadavg
from .. import Progress, as_progress
from ..records import RecordStore
from ._summary import (KEY, METHODS, TABLE, refuse_foreign_rows, score_file_problem, summarize,
                       write_summary)

__all__ = ["METHODS", "MocoPreset", "PRESETS", "TABLE", "check_threads", "resolve_device",
           "run_moco", "train_one", "summarize", "write_summary"]


@dataclass(frozen=True)
class MocoPreset:
    """Every knob of one dense-queue configuration (written into the records' sidecar).

    Sizes are counts. The planners' logical selection budget (eq. 3) constrains the static
    model, not the allocator: ``budget_bytes`` when set, else ``budget_eager_fraction`` × the
    measured card's predicted all-eager peak (the paper's frozen 1,024 MiB is 0.737 × its eager
    allocated peak of 1,389.35 MiB; the scaled presets keep that ratio).
    """

    name: str
    dataset: str
    width: int
    dim: int
    hidden_dim: int
    queue_size: int
    batch_size: int
    temperature: float
    momentum: float
    lr: float
    weight_decay: float
    encoder_epochs: int
    fit_images: int | None
    validation_images: int | None
    test_images: int | None
    probe_fit_images: int | None
    probe_epochs: int
    probe_batch_size: int
    probe_lr: float
    budget_bytes: int | None
    budget_eager_fraction: float | None = None
    peak_steps: tuple[int, ...] = (1, 2)   # steps observed by the peak tracker (0 = warm-up)
    n_validation: int = 10_000
    profile_steps: int = 3
    threads: int | None = None   # torch intra-op threads; 1 avoids oversubscription on shared cores


PRESETS: dict[str, MocoPreset] = {
    # The paper's scale (GPU + CIFAR-100): 64 MiB queue (131,072 × 128 FP32), 100 + 25 epochs,
    # 40,000 fitting images, the frozen 1,024 MiB selection budget.
    "paper": MocoPreset("paper", "cifar-100", width=64, dim=128, hidden_dim=512, queue_size=131_072,
                        batch_size=256, temperature=0.2, momentum=0.99, lr=0.06, weight_decay=5e-4,
                        encoder_epochs=100, fit_images=None, validation_images=None, test_images=None,
                        probe_fit_images=None, probe_epochs=25, probe_batch_size=256, probe_lr=0.1,
                        budget_bytes=1024 * 2**20),
    # Fits 2 shared cores: narrow trunk, Fashion-MNIST subset, a 1 MiB queue (4,096 × 64).
    "cpu": MocoPreset("cpu", "fashion-mnist", width=8, dim=64, hidden_dim=128, queue_size=4096,
                      batch_size=128, temperature=0.2, momentum=0.99, lr=0.06, weight_decay=5e-4,
                      encoder_epochs=3, fit_images=4096, validation_images=2000, test_images=None,
                      probe_fit_images=5000, probe_epochs=20, probe_batch_size=256, probe_lr=0.1,
                      budget_bytes=None, budget_eager_fraction=1024 / 1389.35, threads=1),
    # Test-suite scale: seconds per method.
    "tiny": MocoPreset("tiny", "fashion-mnist", width=4, dim=16, hidden_dim=32, queue_size=128,
                       batch_size=32, temperature=0.2, momentum=0.99, lr=0.06, weight_decay=5e-4,
                       encoder_epochs=1, fit_images=192, validation_images=256, test_images=1000,
                       probe_fit_images=1000, probe_epochs=5, probe_batch_size=128, probe_lr=0.1,
                       budget_bytes=None, budget_eager_fraction=1024 / 1389.35, peak_steps=(1,),
                       profile_steps=2, threads=1),
}


def resolve_device(name: str | None):
    """The torch device for ``--device``, refused before anything is written if unusable.

    Args:
        name: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; None picks CUDA when present, else CPU.

    Returns:
        ``torch.device``.

    Raises:
        ValueError: not a cpu/cuda device name, or CUDA requested but unavailable (or ``N`` past
            the visible device count).
    """
    import torch

    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"stateremat app moco: --device {name!r} is not a device name "
                         f"({exc}); expected cpu or cuda[:N]. Tip: omit --device to pick CUDA "
                         "when present.") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"stateremat app moco: --device {name!r} has type {dev.type!r}; "
                         "expected cpu or cuda[:N]. Tip: omit --device to pick CUDA when "
                         "present.")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"stateremat app moco: --device {name!r} but "
                             f"torch.cuda.is_available() is False (torch {torch.__version__}). "
                             "Tip: use --device cpu, or a CUDA build of torch on a GPU machine.")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"stateremat app moco: --device {name!r} but only "
                             f"{torch.cuda.device_count()} CUDA device(s) are visible. Tip: use "
                             "cuda:0.")
    return dev


def check_threads(threads: int | None) -> None:
    """Refuse a torch intra-op thread count below 1 (``torch.set_num_threads`` would raise).

    Raises:
        ValueError: ``threads`` is not None and below 1.
    """
    if threads is not None and threads < 1:
        raise ValueError(f"stateremat app moco: --threads must be at least 1, got {threads}. "
                         "Tip: 1 is fastest on a shared, oversubscribed machine; omit it for "
                         "the preset's.")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _state_sha256(modules) -> str:
    h = hashlib.sha256()
    for m in modules:
        for name, t in sorted(m.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def train_one(preset: MocoPreset, split, seed: int, method: str, device, plan: Any = None,
              on_step: Callable[[], None] | None = None) -> dict[str, Any]:
    """Train the encoder with ``method`` and fit the probe; returns the raw row and the scores.

    Args:
        preset: configuration.
        split: a :class:`~stateremat.paper.moco._probe.Split`.
        seed: seeds parameters, queue, data order, augmentation and the probe.
        method: one of :data:`~stateremat.paper.moco.METHODS`.
        device: torch device.
        plan: planner result for ``state_agnostic``/``joint``.
        on_step: called after every encoder step (progress).

    Returns:
        dict with the row fields and ``"scores"`` (float32 ``(n_test, classes)``).

    References:
        Paper §12: strict in-forward enqueue; deferred eager enqueues after backward and update.
    """
    import torch

    from ...torch import PeakMemory, memory_method
    from ..workloads import MoCo, two_views
    from ._methods import apply_method, unwrap
    from ._probe import extract_features, linear_probe

    torch.manual_seed(seed)
    model = MoCo(preset.width, split.fit_x.shape[1], preset.dim, preset.hidden_dim,
                 preset.queue_size, preset.temperature, preset.momentum,
                 generator=torch.Generator().manual_seed(seed),
                 mode="deferred" if method == "deferred" else "strict").to(device)
    originals, policy = apply_method(model, method, plan)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=preset.lr, momentum=0.9, weight_decay=preset.weight_decay)
    g_order = torch.Generator().manual_seed(seed)
    g_aug = torch.Generator().manual_seed(seed + 1_000_003)
    n = len(split.fit_x)
    steps_per_epoch = n // preset.batch_size
    targets = torch.zeros(preset.batch_size, dtype=torch.long, device=device)
    peak_bytes, losses, step = 0, [], 0
    _sync(device)
    t0 = time.perf_counter()
    for _epoch in range(preset.encoder_epochs):
        perm = torch.randperm(n, generator=g_order)
        for s in range(steps_per_epoch):
            idx = perm[s * preset.batch_size:(s + 1) * preset.batch_size]
            xq, xk = two_views(split.fit_x[idx], g_aug)
            xq, xk = xq.to(device), xk.to(device)
            opt.zero_grad(set_to_none=True)
            tracker = None
            if step in preset.peak_steps:
                roots = [*model.parameters(), *model.buffers(), xq, xk,
                         *(t for st in opt.state.values() for t in st.values()
                           if isinstance(t, torch.Tensor))]
                tracker = PeakMemory(device, roots=roots)
                tracker.__enter__()
            model.momentum_update()
            logits, k = model(xq, xk)
            loss = torch.nn.functional.cross_entropy(logits, targets)
            loss.backward()
            opt.step()
            if method == "deferred":
                model.queue.enqueue(k)   # the legal control: after backward and update
            if tracker is not None:
                tracker.__exit__(None, None, None)
                peak_bytes = max(peak_bytes, tracker.peak_bytes)
            losses.append(loss.detach())
            step += 1
            if on_step is not None:
                on_step()
    _sync(device)
    encoder_time_s = time.perf_counter() - t0
    unwrap(model, originals)
    loss_bytes = torch.stack(losses).cpu().numpy().tobytes()
    encoder_sha256 = _state_sha256([model.encoder_q, model.head_q, model.queue])

    nf = preset.probe_fit_images
    feats = [extract_features(model.encoder_q, x, 512, device)
             for x in (split.fit_x[:nf], split.val_x, split.test_x)]
    probe = linear_probe(feats[0], split.fit_y[:nf], feats[1], split.val_y, feats[2], split.test_y,
                         split.num_classes, preset.probe_epochs, preset.probe_batch_size,
                         preset.probe_lr, seed)
    return {"seed": seed, "method": method, "dataset": split.dataset, "preset": preset.name,
            "device": str(device), "threads": torch.get_num_threads(),
            "memory_method": memory_method(device),
            "peak_bytes": int(peak_bytes), "encoder_time_s": encoder_time_s, "steps": step,
            "test_accuracy": probe.test_accuracy, "test_cross_entropy": probe.test_cross_entropy,
            "validation_accuracy": probe.validation_accuracy, "final_loss": float(losses[-1]),
            "loss_sha256": hashlib.sha256(loss_bytes).hexdigest(), "encoder_sha256": encoder_sha256,
            "policy": json.dumps(policy), "scores": probe.test_scores}


def _scores_bytes(scores) -> bytes:
    buf = io.BytesIO()
    np.save(buf, scores.detach().cpu().numpy().astype("<f4"), allow_pickle=False)
    return buf.getvalue()


def scores_path(out_dir: str | os.PathLike, seed: int, method: str) -> Path:
    """Where the per-image test-score file of ``(seed, method)`` lives (``.npy``, float32)."""
    return Path(out_dir) / "scores" / f"seed-{seed}" / f"{method}.npy"


def _done(store: RecordStore) -> tuple[set[tuple], set[tuple]]:
    """Units finished with an intact score file, and units whose latest finished row's score
    file is missing or changed (redone, their stale rows replaced)."""
    df = store.read()
    if df.empty:
        return set(), set()
    done, damaged = set(), set()
    ok = df[df["outcome"] == "ok"]
    for key, g in ok.groupby(list(KEY), sort=False):
        key = tuple(k.item() if hasattr(k, "item") else k for k in key)
        (damaged if score_file_problem(store.out_dir, g.iloc[-1]) else done).add(key)
    return done, damaged


def _next_attempts(store: RecordStore) -> dict[tuple, int]:
    """``(seed, method) -> attempt`` number the unit's next row gets: one past its rows' highest
    (a row of an older part without the column counts as one attempt)."""
    df = store.read()
    if df.empty:
        return {}
    out = {}
    for key, g in df.groupby(list(KEY), sort=False):
        key = tuple(k.item() if hasattr(k, "item") else k for k in key)
        known = g["attempt"].dropna() if "attempt" in g else []
        out[key] = max(len(g), int(known.max()) + 1) if len(known) else len(g)
    return out


def run_moco(preset: MocoPreset, seeds: list[int], out_dir: str | os.PathLike,
             data: str | os.PathLike | None = None, device: str | None = None,
             methods: tuple[str, ...] = METHODS, progress: Progress | None = None,
             threads: int | None = None) -> dict[str, Any]:
    """Run every ``(seed, method)`` not yet recorded under ``out_dir``, then write the summary.

    Args:
        preset: configuration (``PRESETS[name]``).
        seeds: training seeds (paper: 2701–2706).
        out_dir: run folder: records table ``moco``, ``scores/``, ``cards/``, ``summary.json``.
        data: dataset path (CIFAR-100 folder, or a Fashion-MNIST folder); None = package default.
        device: ``"cpu"``/``"cuda"``; None picks CUDA when present.
        methods: subset of :data:`METHODS` (all seven by default).
        progress: where to report runs and encoder steps and the dataset note
            (``stateremat._shared.progress.progress_bar``); None: nowhere (the note is in the sidecar).
        threads: torch intra-op threads for the run (None: the preset's, else torch's setting);
            recorded, because reductions split differently across thread counts.

    Returns:
        The summary dict (also written to ``out_dir/summary.json``).

    Raises:
        RecordsError: ``out_dir`` holds a run with a different configuration.
        ValueError: unknown method, unusable ``device`` or ``threads`` below 1 (before anything
            is written).

    Danger:
        Byte identity across methods assumes deterministic kernels on one device and thread
        count; ``torch.use_deterministic_algorithms(True)`` is enabled for the run and restored.
    """
    import torch

    from ..workloads import load_dataset
    from ._probe import make_split

    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"run_moco: unknown methods {bad}; expected a subset of {METHODS}. "
                         "Tip: omit --methods to run all seven.")
    dev = resolve_device(device)
    threads = threads if threads is not None else preset.threads
    check_threads(threads)
    progress = as_progress(progress, "run_moco")
    images = load_dataset(preset.dataset, data)
    if images.note:   # e.g. the digits fallback: said now, and recorded in the sidecar
        progress.note(images.note)
    old_threads = torch.get_num_threads()
    was_det = torch.are_deterministic_algorithms_enabled()
    try:   # thread count and determinism are restored however the run ends
        if threads is not None:
            torch.set_num_threads(threads)
        split = make_split(images, preset.n_validation, preset.fit_images,
                           preset.validation_images, preset.test_images)
        config = {"preset": asdict(preset), "dataset": images.name, "data_source": images.source,
                  "device": str(dev), "torch": torch.__version__,
                  "threads": torch.get_num_threads()}
        if images.note:
            config["data_note"] = images.note
        refuse_foreign_rows(out_dir)  # rows no earlier launch asked for are never kept
        store = RecordStore(out_dir, TABLE, key=list(KEY), meta=config,
                            launch={"seeds": [int(x) for x in seeds], "methods": list(methods)})
        done, damaged = _done(store)
        attempts = _next_attempts(store)
        todo = [(s, m) for s in seeds for m in methods if (s, m) not in done]
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        steps = preset.encoder_epochs * (len(split.fit_x) // preset.batch_size)
        runs = progress.task("moco runs", total=len(todo))
        stepbar = progress.task("encoder steps", total=steps)
        for seed, method in todo:
            stepbar.update(completed=0, description=f"seed {seed} {method}")
            row = _run_row(preset, split, seed, method, dev, out_dir, stepbar.advance)
            row["attempt"] = attempts.get((seed, method), 0)
            attempts[(seed, method)] = row["attempt"] + 1
            store.append([row])
            if (seed, method) in damaged and row["outcome"] == "ok":
                # the unit's earlier finished rows point at a missing or changed score file:
                # the new row replaces them (each part rewritten atomically)
                store.drop_rows(lambda df, k=(seed, method): (
                    (df["seed"] == k[0]) & (df["method"] == k[1]) & (df["outcome"] == "ok")),
                    keep_last_part=True)
            runs.advance()
    finally:
        torch.use_deterministic_algorithms(was_det)
        torch.set_num_threads(old_threads)
    return write_summary(out_dir)


def _run_row(preset: MocoPreset, split, seed: int, method: str, dev, out_dir,
             on_step: Callable[[], None]) -> dict[str, Any]:
    load = loadavg()   # the machine is shared: encoder times are read next to its load
    plan_fields: dict[str, Any] = {"budget_bytes": None, "feasible": None,
                                   "predicted_peak_bytes": None, "predicted_time_s": None}
    try:
        plan = None
        if method in ("state_agnostic", "joint"):
            from ._card import plan_for

            plan = plan_for(preset, split, seed, method, dev, out_dir)
            plan_fields = {"budget_bytes": int(plan.budget_bytes), "feasible": bool(plan.feasible),
                           "predicted_peak_bytes": plan.predicted_peak_bytes,
                           "predicted_time_s": plan.predicted_time_s}
            if not plan.feasible:
                raise RuntimeError(
                    f"stateremat app moco: the {method} planner found no policy within the "
                    f"{plan.budget_bytes} B budget (minimum predicted peak "
                    f"{plan.min_feasible_peak_bytes} B). Tip: raise the preset's budget.")
        row = train_one(preset, split, seed, method, dev, plan, on_step)
    except Exception as exc:  # recorded, never hidden: the row says what failed
        return {"seed": seed, "method": method, "dataset": split.dataset, "preset": preset.name,
                "device": str(dev), "outcome": "error", "error_type": type(exc).__name__,
                "error": str(exc)[:2000], "loadavg": load, **plan_fields}
    data = _scores_bytes(row.pop("scores"))
    path = scores_path(out_dir, seed, method)
    atomic_write_bytes(path, data)
    return {**row, **plan_fields, "outcome": "ok", "error_type": None, "error": None,
            "loadavg": load,
            "scores_file": str(path.relative_to(out_dir)),
            "scores_sha256": hashlib.sha256(data).hexdigest()}
