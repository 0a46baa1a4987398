"""Do the library's own tests catch deliberate bugs in the replay guards? (issue 13, "Done when")

Each mutant is one textual change to a copy of ``src/`` (the checkout is never touched); the
torch test files run against the copy (``PYTHONPATH``) and the mutant is *caught* when they
fail. A mutant whose text no longer matches the source is reported as ``stale`` (update it).

Usage: ``.venv/bin/python tools/check_mutants.py [--only NAME ...]``; prints one line per mutant
and exits 1 if any survives. Takes a few minutes (each mutant runs the torch tests until the
first failure).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = "src/stateremat/torch"

#: name -> (file, original text, mutated text)
MUTANTS: dict[str, tuple[str, str, str]] = {
    "rng_not_reinstated": (f"{TORCH}/_rng.py", "    finally:\n        restore(visible)", "    finally:\n        pass"),
    "journal_not_pruned": (f"{TORCH}/_preserve/region.py",
                           '        """Drop entries no consumer can need (older than ``oldest``, all when None)."""\n',
                           '        """Drop entries no consumer can need (older than ``oldest``, all when None)."""\n'
                           "        return\n"),
    "saved_count_unchecked": (f"{TORCH}/_frame.py", "if got != n and count:", "if False:"),
    "saved_metadata_unchecked": (f"{TORCH}/_frame.py", "if meta != self.metas[idx]:", "if False:"),
    "holder_unpacked_twice": (f"{TORCH}/_frame.py", "            holder.handles[gid] = None\n", ""),
    "journal_gap_ignored": (f"{TORCH}/_preserve/region.py", "if st.gap_seq >= self.start_seq:", "if False:"),
    "undeclared_writes_ignored": (f"{TORCH}/_watch.py", "        if not names:\n            return\n",
                                  "        return\n"),
    "foreign_recompute_ignored": (f"{TORCH}/_mode.py", "    if in_foreign_recompute():\n", "    if False:\n"),
    "saved_alias_not_copied": (f"{TORCH}/_txn.py", "            if k == key:\n                copied += copy()",
                               "            if False:\n                copied += copy()"),
    "replay_writes_not_undone": (f"{TORCH}/_txn.py", "                scatter(st.flat, runs, old)", "                pass"),
    "version_counters_not_reset": (f"{TORCH}/_txn.py", "        if versions:\n", "        if False:\n"),
    "outside_writes_not_journaled": (f"{TORCH}/_preserve/region.py", "        if j is None or not storage.consumers:",
                                     "        if True:"),
    "journal_first_writer_is_last": (f"{TORCH}/_storage.py", "    uniq, first = np.unique(ids, return_index=True)\n",
                                     "    uniq, first = np.unique(ids[::-1], return_index=True)\n"
                                     "    first = ids.size - 1 - first\n"),
    "journal_disjoint_chunks_misplaced": (f"{TORCH}/_preserve/region.py", "scatter_chunks(flat, ids, c, _cat(",
                                          "scatter_chunks(flat, uniq, c, _cat("),
    "rebinding_not_replayed": (f"{TORCH}/_bindings.py", "        if not (self.rebound or self.swapped or regeometried):",
                               "        if True:"),
}

TESTS = ["tests/test_torch_semantics.py", "tests/test_torch_review.py", "tests/test_torch_state.py",
         "tests/test_torch_correctness.py", "tests/test_torch_journal_properties.py", "tests/test_torch_journal_chunks.py",
         "tests/test_torch_families.py", "tests/test_torch_parity.py", "tests/test_torch_runtime.py"]


def run_mutant(name: str) -> str:
    path, old, new = MUTANTS[name]
    with tempfile.TemporaryDirectory(prefix=f"mutant-{name}-") as tmp:
        shutil.copytree(ROOT / "src", Path(tmp) / "src")
        target = Path(tmp) / path
        text = target.read_text()
        if text.count(old) != 1:
            return "stale"
        target.write_text(text.replace(old, new))
        env = dict(os.environ, PYTHONPATH=str(Path(tmp) / "src"), OMP_NUM_THREADS="2")
        res = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        if res.returncode == 0:
            return "SURVIVED"
        failed = [ln for ln in res.stdout.splitlines() if ln.startswith("FAILED")]
        return "caught by " + (failed[0].split(" ")[1] if failed else f"exit {res.returncode}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=list(MUTANTS), choices=list(MUTANTS))
    args = ap.parse_args()
    survived = 0
    for name in args.only:
        verdict = run_mutant(name)
        survived += verdict in ("SURVIVED", "stale")
        print(f"{name:32s} {verdict}", flush=True)
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
