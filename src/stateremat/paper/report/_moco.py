"""Dense-queue application report: Table 9-style markdown and a Figure 3C-style plot (§12).

Every number is recomputed from the raw ``moco`` rows and the score files by
:func:`stateremat.paper.moco.summarize`; nothing is read from ``summary.json``,
which the reporter rewrites from the same recomputation (so a changed score file shows in both).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..._shared.io import atomic_write_bytes
from ._figures import new_figure, save_figure
from ._registry import Expected, register_reporter
from ._tables import byte_unit, markdown_table

LABELS = {"eager": "Eager", "whole": "Whole", "regions": "Regions", "functional": "Functional",
          "deferred": "Deferred", "state_agnostic": "Agnostic", "joint": "Joint"}
METHOD_ORDER = tuple(LABELS)
MARKERS = {"eager": "o", "whole": "s", "regions": "D", "functional": "^", "deferred": "v",
           "state_agnostic": "P", "joint": "*"}


def moco_markdown(summary: dict) -> str:
    """Table 9-style markdown: per method peak, encoder seconds (mean, min–max), probe quality."""
    entries = compared_entries(summary)
    peaks = [e["peak_bytes"] for e in entries if e["peak_bytes"] is not None]
    unit, div = byte_unit(max(peaks) if peaks else 0)
    rows = []
    for m in LABELS:
        es = [e for e in entries if e["method"] == m]
        if not es:
            continue
        ok = [e for e in es if e["scores_sha256"] is not None]
        pk = [e["peak_bytes"] for e in ok]
        ts = [e["encoder_time_s"] for e in ok]
        acc = [e["test_accuracy"] for e in ok]
        ce = [e["test_cross_entropy"] for e in ok]
        by_seed = {e["seed"]: _policy(e["policy"]) for e in ok}
        if len(set(by_seed.values())) > 1:   # plans differ by seed: each seed's, named
            pol = "differs by seed: " + "; ".join(f"seed {sd}: {p}" for sd, p in by_seed.items())
        else:
            pol = next(iter(by_seed.values()), "—")
        rows.append([
            LABELS[m], f"{len(ok)}/{len(es)}",
            f"{max(pk) / div:.2f}" if pk else "—",
            f"{np.mean(ts):.2f}" if ts else "—",
            f"{min(ts):.2f}–{max(ts):.2f}" if ts else "—",
            f"{100 * np.mean(acc):.2f}" if acc else "—",
            f"{np.mean(ce):.6f}" if ce else "—", pol])
    head = ["Method", "Runs ok", f"Peak {unit} (max)", "Mean encoder s", "Min–max s",
            "Test acc. % (mean)", "Test CE (mean)", "Policy per segment"]
    table = markdown_table(head, rows).split("\n")
    table[1] = table[1].rsplit("|", 2)[0] + "| :-- |"   # the policy column is text: left-align
    identical = summary["identical_within_seed"]
    damaged = [f"scores/seed-{e['seed']}/{e['method']}.npy" for e in entries
               if e["status"] == "score file mismatch"]
    if identical is None and damaged:
        verdict = ("**not assessed**: score files missing or differing from their rows' hashes "
                   f"({', '.join(damaged)}), a storage problem, not a result; rerun the run's "
                   "command with the same --out to redo them")
    elif identical is None:
        verdict = "**not assessed** (a subset of the seven methods; see the per-seed counts)"
    else:
        verdict = f"**{identical}**"
    outside = summary.get("not_compared") or {}
    if outside:
        head_seeds = (f"seeds {summary['seeds_compared']} (the seeds every method ran; "
                      f"{', '.join(map(str, summary['seeds']))} have rows)")
    else:
        head_seeds = f"seeds {summary['seeds']}"
    lines = [f"# Dense-queue application — {summary['dataset']}, {head_seeds}\n\n",
             "\n".join(table),
             f"\nPer-image test-score files byte-identical within every seed"
             f"{' compared' if outside else ''}: {verdict}.\n"]
    if outside:
        lines.append("\nNot in the comparison (every number above is over the seeds all "
                     "methods ran):\n")
        for m, ss in outside.items():
            lines.append(f"- {m}: seed{'s' if len(ss) > 1 else ''} {', '.join(map(str, ss))} "
                         f"not in the comparison: other methods lack {'them' if len(ss) > 1 else 'it'}\n")
        lines.append("\n")
    compared = summary.get("methods_compared", {})
    for s in summary["seeds"]:
        es = [e for e in summary["methods"] if e["seed"] == s]
        distinct = sorted({e["scores_sha256"] for e in es if e["scores_sha256"]})
        n_cmp = compared.get(str(s), len(distinct))
        lines.append(f"- seed {s}: {len(distinct)} distinct hash(es) over {n_cmp} of "
                     f"{len(METHOD_ORDER)} methods compared"
                     + (f" ({distinct[0][:16]}…)" if len(distinct) == 1 else ""))
        for label in ("failed", "score file mismatch"):
            names = [e["method"] for e in es if e["status"] == label]
            if names:
                lines.append(f"; {label}: " + ", ".join(names))
        if outside and s not in summary["seeds_compared"]:
            lines.append(" (not in the comparison)")
        lines.append("\n")
    lines.append("\nPeak: allocated bytes over the preset's observed training steps (CUDA allocator, "
                 "or the CPU live-tensor-storage tracker; rows name the method). Encoder time: "
                 "complete encoder training, tracker steps included, one sequential run per "
                 "(seed, method) on a possibly shared machine — runs are not interleaved, so no "
                 "timing comparison between methods is claimed (each raw row records "
                 "/proc/loadavg). Test accuracy and cross-entropy are means over seeds; the linear "
                 "probe is fitted on the fitting split only. Identity is not assessed unless all "
                 "seven methods ran for every seed.\n")
    return "".join(lines)


def _policy(policy) -> str:
    """One run's plan, one policy per segment (a single name when all segments agree)."""
    if not policy:
        return "—"
    return ", ".join(policy) if len(set(policy)) > 1 else policy[0]


def compared_entries(summary: dict) -> list[dict]:
    """The summary's (seed, method) entries over the seeds every method ran (all when even)."""
    if not summary.get("not_compared"):
        return summary["methods"]
    keep = set(summary["seeds_compared"])
    return [e for e in summary["methods"] if e["seed"] in keep]


def moco_figure(summary: dict, stem: Path) -> list[Path]:
    """Figure 3C-style scatter: every compared (seed, method) at (encoder time, peak), one
    marker per method."""
    fig, (ax,) = new_figure(1, width_in=6.0, panel_height_in=4.0)
    entries = [e for e in compared_entries(summary) if e["scores_sha256"] is not None]
    peaks = [e["peak_bytes"] for e in entries] or [0]
    unit, div = byte_unit(max(peaks))
    long_run = max([e["encoder_time_s"] for e in entries] or [0]) >= 120
    t_div, t_unit = (60.0, "min") if long_run else (1.0, "s")
    for m, label in LABELS.items():
        es = [e for e in entries if e["method"] == m]
        if es:
            ax.scatter([e["encoder_time_s"] / t_div for e in es], [e["peak_bytes"] / div for e in es],
                       marker=MARKERS[m], s=70 if m == "joint" else 40,
                       color="#e66101" if m == "joint" else None, label=label, alpha=0.8)
    ax.set_xlabel(f"Complete encoder time ({t_unit})")
    ax.set_ylabel(f"Peak allocated ({unit})")
    n_seeds = len(summary.get("seeds_compared", summary["seeds"]))
    ax.set_title(f"Dense queue, {n_seeds} training seed(s) — {summary['dataset']}")
    ax.legend(fontsize=8, ncol=2)
    return save_figure(fig, stem)


def expected_moco(doc: dict, out_dir: Path) -> Expected | None:
    """Every (seed, method) some launch asked for (the sidecar's ``launches``); a unit is
    complete once a row of it finished (a failed run is retried on resume) and the score file
    of its latest finished row matches that row's hash (a missing or changed file leaves the
    unit incomplete, named with the file). None for runs written before launches were
    recorded."""
    from ..moco import launch_units, score_file_problem

    units = launch_units(doc)
    if units is None:
        return None
    problems: dict[tuple, str] = {}

    def done(g) -> bool:
        ok = g[g["outcome"] == "ok"]
        if ok.empty:
            return False
        bad = score_file_problem(out_dir, ok.iloc[-1])
        if bad is not None:
            problems[(int(ok.iloc[-1]["seed"]), str(ok.iloc[-1]["method"]))] = bad
        return bad is None

    return Expected(("seed", "method"), units, done, "(seed, method)", why=problems.get)


@register_reporter("moco", outputs=("summary.json", "moco_table9.md", "moco_fig3c.png",
                                    "moco_fig3c.svg"), expected=expected_moco)
def report_moco(out_dir: Path, dest: Path | None = None) -> list[Path]:
    """Rewrite ``summary.json`` from the raw rows and score files, then write ``moco_table9.md``
    and ``moco_fig3c.{png,svg}`` under ``out_dir``."""
    from ..moco import write_summary

    out_dir = Path(out_dir)
    dest = Path(dest or out_dir)
    summary = write_summary(out_dir, dest)
    md = atomic_write_bytes(dest / "moco_table9.md", moco_markdown(summary).encode())
    return [dest / "summary.json", md, *moco_figure(summary, dest / "moco_fig3c")]
