"""The two wings of DESIGN.md: import rules (an ``ast`` walk), import cost, the library without
the paper's extras, and each package's public surface (issue 12)."""
from __future__ import annotations

import __future__
import ast
import importlib
import inspect
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PAPER_EXTRAS = ("pandas", "pyarrow", "matplotlib", "dask", "distributed")
HEAVY = ("torch", "jax", "jaxlib") + PAPER_EXTRAS


# --------------------------------------------------------------------------- the ast rules
def _unit(module: str) -> str:
    """The package a module belongs to for the private-module rule: ``stateremat.<layer>`` in the
    library, ``stateremat.paper.<part>`` in the paper wing (subpackages share their layer's)."""
    parts = module.split(".")
    depth = 3 if parts[:2] == ["stateremat", "paper"] else 2
    keep = []
    for p in parts[:depth]:
        if p.startswith("_"):
            break
        keep.append(p)
    return ".".join(keep)


#: The one private package other packages may import (module by module): helpers the library's
#: command line and the paper wing share (argument checks, the progress bar; its docstring).
SHARED = "stateremat._shared"
#: Its numpy/standard-library module (atomic writes, hashes, provenance): the contract's card uses it.
SHARED_STDLIB = SHARED + ".io"


def _private(module: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in module.split(".")[1:])


#: A module name a dynamic import may spell (``importlib.import_module("stateremat.x")``).
_MODULE_NAME = re.compile(r"stateremat(\.\w+)*")


def _dynamic_import(call: ast.Call) -> bool:
    """Whether ``call`` imports by name: ``importlib.import_module(...)`` (however importlib or the
    function is bound) or ``__import__(...)``."""
    f = call.func
    return ((isinstance(f, ast.Name) and f.id in ("import_module", "__import__"))
            or (isinstance(f, ast.Attribute) and f.attr == "import_module"))


def _dynamic_targets(name: str, tree: ast.Module, call: ast.Call, is_package: bool) -> list[str]:
    """The modules a dynamic import may load: its literal name (a relative one, as
    ``import_module(".x", __package__)`` resolves it), else (a name computed at run time, e.g.
    looked up in a table) every stateremat module name the file spells out."""
    arg = call.args[0] if call.args else None
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        lit = arg.value
        if not lit.startswith("."):
            return [lit] if _MODULE_NAME.fullmatch(lit) else []
        level = len(lit) - len(lit.lstrip("."))
        base = name.split(".")[: len(name.split(".")) - level + is_package]
        return [".".join(base + ([lit.lstrip(".")] if lit.lstrip(".") else []))]
    return sorted({c.value for c in ast.walk(tree) if isinstance(c, ast.Constant)
                   and isinstance(c.value, str) and _MODULE_NAME.fullmatch(c.value)})


def _imports(name: str, source: str, is_package: bool, known: set[str]):
    """``(target module, inside a function, line)`` for every import of one module: import
    statements and dynamic imports (:func:`_dynamic_import`), those inside functions included."""
    out = []
    tree = ast.parse(source)

    def visit(node, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend((a.name, in_func, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = name.split(".")[: len(name.split(".")) - child.level + is_package]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module
                if mod == "__future__":
                    continue
                subs = [f"{mod}.{a.name}" for a in child.names if f"{mod}.{a.name}" in known]
                if len(subs) < len(child.names) or not child.names:  # a name of the package itself
                    out.append((mod, in_func, child.lineno))
                # `from package import _module` imports that module (its package is imported, but
                # reaching its __init__ needs no name of it)
                out.extend((s, in_func, child.lineno) for s in subs)
            elif isinstance(child, ast.Call) and _dynamic_import(child):
                out.extend((t, in_func, child.lineno)
                           for t in _dynamic_targets(name, tree, child, is_package))
            visit(child, in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return out


def violations(modules: dict[str, tuple[str, bool]]) -> list[str]:
    """Every breach of DESIGN.md's rules in ``modules`` (name -> (source, is_package))."""
    stdlib = set(sys.stdlib_module_names)
    known = set(modules)
    bad = []
    for name, (source, is_package) in sorted(modules.items()):
        for target, in_func, line in _imports(name, source, is_package, known):
            top = target.split(".")[0]
            where = f"{name}:{line} imports {target}"
            if target.startswith("stateremat.paper") and not name.startswith("stateremat.paper"):
                if not (name.startswith("stateremat.cli") and in_func):
                    bad.append(f"{where}: only the paper wing (and the CLI, inside a function) may")
            if name.startswith("stateremat.contract"):
                if not (top in stdlib or top == "numpy"
                        or target.startswith(("stateremat.contract", SHARED_STDLIB))):
                    bad.append(f"{where}: contract imports only numpy and the standard library")
            if name.startswith("stateremat.reference"):
                if not (top in stdlib or top == "numpy"
                        or target.startswith(("stateremat.reference", "stateremat.contract", SHARED_STDLIB))):
                    bad.append(f"{where}: the reference is NumPy only")
            if name.startswith("stateremat.planner"):
                if top == "scipy" and not in_func:
                    bad.append(f"{where}: the planner loads scipy lazily (MILP only)")
                elif not (top in stdlib or top in ("numpy", "scipy")
                          or target.startswith(("stateremat.planner", "stateremat.contract"))):
                    bad.append(f"{where}: the planner imports neither torch nor pandas")
            if name.startswith(SHARED) and top == "stateremat" and not target.startswith(
                    (SHARED, "stateremat.contract")):
                bad.append(f"{where}: the shared helpers import no stateremat package but the contract")
            if name.startswith((SHARED_STDLIB, SHARED + ".signals")) and not (top in stdlib or top == "numpy"):
                bad.append(f"{where}: shared io and signals import only numpy and the standard library")
            if (top == "stateremat" and _private(target) and _unit(target) != _unit(name)
                    and not target.startswith(SHARED + ".")):
                bad.append(f"{where}: a private module of another package")
    return bad


def _tree() -> dict[str, tuple[str, bool]]:
    out = {}
    for path in sorted((SRC / "stateremat").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path.read_text(), is_package)
    return out


def test_the_source_tree_keeps_designs_import_rules():
    tree = _tree()
    assert {"stateremat.contract", "stateremat.reference", "stateremat.planner",
            "stateremat.paper.bench._runner", "stateremat.cli._app"} <= set(tree)
    assert violations(tree) == []


def test_the_rule_checker_catches_each_kind_of_breach():
    fake = {
        "stateremat.planner._x": ("import torch\nfrom scipy import optimize\n", False),
        "stateremat.contract._y": ("import pandas\nfrom ..planner import plan\n", False),
        "stateremat.reference._z": ("import scipy\n", False),
        "stateremat.torch._w": ("from stateremat.paper.bench import run_experiment\n", False),
        "stateremat.cli._v": ("from stateremat.paper.cli import paper_app\n"
                              "def f():\n    from stateremat.paper.cli import paper_app\n", False),
        "stateremat.paper.bench._u": ("from ..profile._options import sync\nfrom .._progress import x\n"
                                      "from ...contract import _io\nfrom ._v import y\n", False),
        "stateremat.paper.profile._options": ("", False),
        "stateremat.paper._progress": ("", False),
        "stateremat.contract._io": ("", False),
        "stateremat.paper.bench._v": ("", False),
        "stateremat._shared.io": ("import numpy\nimport pandas\n", False),
        "stateremat._shared.checks": ("from ..torch import checkpoint\nfrom ..contract import rule\n", False),
        "stateremat.paper.cli._t": ("from stateremat._shared.checks import fail\n", False),
    }
    got = violations(fake)
    want = [
        "stateremat._shared.checks:1 imports stateremat.torch: the shared helpers import no",
        "stateremat._shared.io:2 imports pandas: shared io and signals import only numpy",
        "stateremat.cli._v:1 imports stateremat.paper.cli: only the paper wing",
        "stateremat.contract._y:1 imports pandas: contract imports only numpy",
        "stateremat.contract._y:2 imports stateremat.planner: contract imports only numpy",
        "stateremat.paper.bench._u:1 imports stateremat.paper.profile._options: a private module",
        "stateremat.paper.bench._u:2 imports stateremat.paper._progress: a private module",
        "stateremat.paper.bench._u:3 imports stateremat.contract._io: a private module",
        "stateremat.planner._x:1 imports torch: the planner imports neither torch nor pandas",
        "stateremat.planner._x:2 imports scipy: the planner loads scipy lazily",
        "stateremat.reference._z:1 imports scipy: the reference is NumPy only",
        "stateremat.torch._w:1 imports stateremat.paper.bench: only the paper wing",
    ]
    assert len(got) == len(want), got
    for g, w in zip(got, want):
        assert g.startswith(w), (g, w)


# --------------------------------------------------------------------------- import cycles
#: The one import edge a cycle may use: the ``stateremat`` command loads the paper commands
#: lazily (DESIGN.md, "CLI conventions"); the paper CLI imports nothing of ``stateremat.cli``.
LAZY_ENTRY = ("stateremat.cli._app", "stateremat.paper.cli")
CORE = "stateremat.torch"


def _package(module: str) -> str:
    """The node of the package graph: ``stateremat.<layer>`` / ``stateremat.paper.<part>`` (the
    paper's own root modules are ``stateremat.paper``); each shared helper module, the
    ``__main__`` entry point and the root package are nodes of their own."""
    parts = module.split(".")
    if module.startswith(SHARED + ".") or parts[-1] == "__main__":
        return module
    return _unit(module)


def _core_file(module: str) -> str | None:
    """The node of the core's file graph: a file of ``stateremat.torch`` (each file of a
    subpackage such as ``_preserve`` too, its ``__init__`` one of them), or None outside the core."""
    parts = module.split(".")
    if parts[:2] != ["stateremat", "torch"]:
        return None
    return module if len(parts) >= 3 else "stateremat.torch.__init__"  # the face is a node


def import_cycles(modules: dict[str, tuple[str, bool]], node) -> list[list[str]]:
    """Every cycle (a strongly connected set of two or more nodes, sorted) of the graph whose
    nodes are ``node(module)`` and whose edges are the imports between them, those inside
    functions included, minus :data:`LAZY_ENTRY`."""
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, (source, is_package) in modules.items():
        a = node(name)
        if a is None:
            continue
        for target, in_func, _ in _imports(name, source, is_package, known):
            if not target.startswith("stateremat") or (name, target) == LAZY_ENTRY and in_func:
                continue
            b = node(target)
            if b is not None and b != a:
                graph.setdefault(a, set()).add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_there_are_no_import_cycles_among_packages():
    assert import_cycles(_tree(), _package) == []


def test_there_are_no_import_cycles_among_the_cores_files():
    # the _mark -> _mode -> _preserve -> _runtime circle is broken by registration (issue 23)
    assert import_cycles(_tree(), _core_file) == []


def test_the_cycle_checker_catches_planted_cycles():
    fake = {
        "stateremat.paper.bench._a": ("def f():\n    from ..report import x\n", False),
        "stateremat.paper.report._b": ("from stateremat.paper.bench import y\n", False),
        "stateremat.cli._app": ("def f():\n    from stateremat.paper.cli import paper_app\n", False),
        "stateremat.cli._profile": ("def g():\n    from stateremat.paper.cli import progress_bar\n", False),
        "stateremat.paper.cli._c": ("from stateremat.cli import fail\n", False),
        "stateremat.torch._x": ("from . import _y\n", False),
        "stateremat.torch._y": ("def h():\n    from ._z import w\n", False),
        "stateremat.torch._z": ("from stateremat.torch._x import v\n", False),
        "stateremat.torch": ("from ._x import v\n", True),
    }
    assert import_cycles(fake, _package) == [
        ["stateremat.cli", "stateremat.paper.cli"], ["stateremat.paper.bench", "stateremat.paper.report"]]
    assert import_cycles(fake, _core_file) == [
        ["stateremat.torch._x", "stateremat.torch._y", "stateremat.torch._z"]]
    # inside a subpackage of the core: an engine importing its registry, which imports the engine
    sub = {"stateremat.torch._p": ("from .a import A\n", True),
           "stateremat.torch._p.a": ("def f():\n    from . import REGISTRY\n", False),
           "stateremat.torch._p.b": ("from .a import A\n", False)}
    assert import_cycles(sub, _core_file) == [["stateremat.torch._p", "stateremat.torch._p.a"]]
    # the entry point's lazy load alone is no cycle; a top-level one would be
    fake.pop("stateremat.cli._profile")
    assert ["stateremat.cli", "stateremat.paper.cli"] not in import_cycles(fake, _package)
    fake["stateremat.cli._app"] = ("from stateremat.paper.cli import paper_app\n", False)
    assert ["stateremat.cli", "stateremat.paper.cli"] in import_cycles(fake, _package)


def test_the_checkers_follow_dynamic_imports():
    # records' table_spec before issue 23: a declaring module's name looked up in a table and
    # imported on first use; the import statements alone showed no records <-> verify cycle
    old = {
        "stateremat.paper.records": ("from ._store import table_spec\n", True),
        "stateremat.paper.records._store": (
            "import importlib\n_DECLARED_IN = {'finite': 'stateremat.paper.verify._summary'}\n"
            "def table_spec(t):\n    importlib.import_module(_DECLARED_IN[t])\n", False),
        "stateremat.paper.verify._summary": ("from ..records import declare_table\n", False),
    }
    assert import_cycles(old, _package) == [["stateremat.paper.records", "stateremat.paper.verify"]]
    assert violations(old) == ["stateremat.paper.records._store:4 imports "
                               "stateremat.paper.verify._summary: a private module of another package"]
    # literal names: import_module however bound, __import__, a relative name
    lit = {
        "stateremat.paper.bench._a": ("from importlib import import_module\ndef f():\n"
                                      "    import_module('stateremat.paper.report')\n", False),
        "stateremat.paper.report._b": ("x = __import__('stateremat.paper.bench')\n", False),
        "stateremat.torch._c": ("import importlib as il\nil.import_module('stateremat.paper.bench')\n"
                                "def g():\n    from . import _d\n", False),
        "stateremat.torch._d": ("import importlib\nimportlib.import_module('._c', __package__)\n", False),
        # a user's module, named at run time: nothing of stateremat is spelled, no edge
        "stateremat.cli._t": ("import importlib\n_API = 'stateremat profile'\n"
                              "def load(m):\n    return importlib.import_module(m)\n", False),
    }
    assert import_cycles(lit, _package) == [["stateremat.paper.bench", "stateremat.paper.report"]]
    assert import_cycles(lit, _core_file) == [["stateremat.torch._c", "stateremat.torch._d"]]
    got = violations(lit)
    assert len(got) == 1 and got[0].startswith(
        "stateremat.torch._c:2 imports stateremat.paper.bench: only the paper wing"), got


# --------------------------------------------------------------------------- sizes
MAX_FUNCTION_LINES = 100
MAX_CORE_CLASS_LINES = 250


def _too_long(kinds, under: str, limit: int) -> set[str]:
    out = set()
    for path in sorted((SRC / under).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, kinds) and node.end_lineno - node.lineno + 1 > limit:
                out.add(f"{path.relative_to(SRC).as_posix()}:{node.name}")
    return out


def test_no_function_or_torch_class_is_too_long():
    assert _too_long((ast.FunctionDef, ast.AsyncFunctionDef), "stateremat", MAX_FUNCTION_LINES) == set()
    assert _too_long(ast.ClassDef, "stateremat/torch", MAX_CORE_CLASS_LINES) == set()


# --------------------------------------------------------------------------- import cost
def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=300)


def test_import_stateremat_is_light_and_fast():
    """No heavy module at ``import stateremat``, and its own import (after numpy, which it needs)
    costs at most 3x numpy's in the same interpreter: a ratio, so a loaded machine does not fail it
    (measured at idle: ~0.12 s against numpy's ~0.07 s; a planner or pandas import would be 10x)."""
    code = ("import sys, time\nt = time.perf_counter()\nimport numpy\nt_np = time.perf_counter() - t\n"
            "t = time.perf_counter()\nimport stateremat\ndt = time.perf_counter() - t\nimport json\n"
            "print(json.dumps([dt, t_np, sorted(m for m in %r if m in sys.modules)]))" % (HEAVY,))
    runs = []
    for _ in range(5):
        res = _run(code)
        assert res.returncode == 0, res.stderr
        runs.append(json.loads(res.stdout))
    assert all(loaded == [] for _, _, loaded in runs), runs
    assert min(dt / t_np for dt, t_np, _ in runs) < 3.0, runs


def test_import_stateremat_torch_loads_no_paper_extras():
    pytest.importorskip("torch")
    res = _run("import sys, stateremat.torch\n"
               "print(sorted(m for m in %r if m in sys.modules))" % (PAPER_EXTRAS,))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


#: Every table the paper's commands write (verify's three, bench, moco, the semantics cohort's
#: two, a process cohort's two).
WRITTEN_TABLES = ("finite", "engines", "alias", "bench", "moco", "semantics",
                  "semantics_stateremat_jax", "cohort_timing", "cohort_processes")
WINGS = ("stateremat.paper.verify", "stateremat.paper.bench", "stateremat.paper.moco",
         "stateremat.paper.semantics", "stateremat.paper.cohort")
SPEC_SUMMARY = textwrap.dedent('''
    import json, sys
    from stateremat.paper.records import table_spec

    def summary(s):
        return None if s is None else {
            "schema": [[f.name, str(f.type), f.nullable] for f in s.schema], "key": list(s.key),
            "optional": sorted(s.optional), "unique": s.unique, "distinct_by": list(s.distinct_by),
            "values": {c: r.what for c, r in s.values.items()},
            "config": {c: f.what for c, f in s.config.items()}}

    specs = {n: summary(table_spec(n)) for n in json.loads(sys.argv[1])}
    print(json.dumps({"specs": specs, "wings": sorted(m for m in sys.modules
                                                      if m.startswith(tuple(json.loads(sys.argv[2]))))}))
''')


def test_records_alone_knows_every_written_tables_spec():
    """A process that imported only ``stateremat.paper.records`` knows the spec of every table
    the wings write, without importing a wing (no spec depends on import order), and it is the
    spec a process that imported every wing sees."""
    pytest.importorskip("torch")  # the bench and moco wings import it
    res = _run(SPEC_SUMMARY, json.dumps(WRITTEN_TABLES), json.dumps(WINGS))
    assert res.returncode == 0, res.stderr
    alone = json.loads(res.stdout)
    assert alone["wings"] == []
    assert [n for n, s in alone["specs"].items() if s is None] == []
    wings = [importlib.import_module(w) for w in WINGS]
    verify, bench, moco, semantics, cohort = wings
    from stateremat.paper.records import tables

    assert tables.TABLES == WRITTEN_TABLES
    assert {bench.TABLE, moco.TABLE, semantics.SEMANTICS_TABLE, semantics.EXTENSION_TABLE,
            cohort.TIMING_TABLE, cohort.STATUS_TABLE} <= set(WRITTEN_TABLES)
    every = _run(SPEC_SUMMARY.replace("import json, sys\n", "import json, sys\n" + "".join(
        f"import {w}\n" for w in WINGS)), json.dumps(WRITTEN_TABLES), json.dumps([]))
    assert every.returncode == 0, every.stderr
    assert json.loads(every.stdout)["specs"] == alone["specs"]
    assert alone["specs"]["moco"]["key"] == list(moco.KEY) == ["seed", "method"]
    assert alone["specs"]["semantics"]["key"] == list(semantics.KEY)


# --------------------------------------------------------------------------- `pip install .[torch]`
LIBRARY_ONLY = textwrap.dedent('''
    import importlib.machinery, json, sys

    BLOCKED = {blocked!r}
    PathFinder = importlib.machinery.PathFinder

    class Uninstalled:
        """The path finder, minus the [paper] extra: as if it were not installed."""

        @classmethod
        def find_spec(cls, name, path=None, target=None):
            return None if name.split(".")[0] in BLOCKED else PathFinder.find_spec(name, path, target)

        @classmethod
        def invalidate_caches(cls):
            PathFinder.invalidate_caches()

    assert PathFinder in sys.meta_path
    sys.meta_path[:] = [Uninstalled if f is PathFinder else f for f in sys.meta_path]
    try:
        import pandas
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError("the finder did not hide pandas")

    import torch
    from stateremat.torch import checkpoint

    class Head(torch.nn.Module):  # enqueues in place inside the checkpointed segment
        def __init__(self):
            super().__init__()
            self.register_buffer("queue", torch.randn(16, 4, generator=torch.Generator().manual_seed(0)))

        def forward(self, q, k):
            loss = (q @ self.queue.clone().T).logsumexp(1).mean()
            self.queue[: len(k)] = k
            return loss

    torch.manual_seed(0)
    q, k = torch.randn(2, 4, requires_grad=True), torch.randn(2, 4)
    eager, ckpt = Head(), Head()
    g_ref = torch.autograd.grad(eager(q, k), q)[0]
    g = torch.autograd.grad(checkpoint(ckpt, q, k, state=[ckpt]), q)[0]
    assert torch.equal(g, g_ref) and torch.equal(ckpt.queue, eager.queue)

    from stateremat.contract import save_card
    from stateremat.planner import exhaustive, plan, random_card

    card = random_card(8, 3)
    floor = plan(card, 0).min_feasible_peak_bytes
    budget = floor + (floor // 4)
    res = plan(card, budget)
    assert res.feasible and res.predicted_time_s == exhaustive(card, budget).predicted_time_s

    card_path, plan_path = sys.argv[1], sys.argv[2]
    save_card(card, card_path)
    from stateremat.cli import main

    for argv in (["plan", "--help"], ["plan", card_path, "--budget", str(budget), "--json", plan_path]):
        sys.argv = ["stateremat", *argv]
        try:
            main()
        except SystemExit as exc:
            assert exc.code in (0, None), (argv, exc.code)
    doc = json.load(open(plan_path))
    assert doc["feasible"] and doc["options"] == res.options, doc
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED or m.startswith("stateremat.paper"))
    print("library ok", loaded)
''')


def test_checkpoint_planner_and_plan_command_work_without_the_paper_extras(tmp_path):
    pytest.importorskip("torch")
    res = _run(LIBRARY_ONLY.format(blocked=set(PAPER_EXTRAS)), str(tmp_path / "card.json"),
               str(tmp_path / "plan.json"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().splitlines()[-1] == "library ok []"


# --------------------------------------------------------------------------- public surfaces
EXPECTED_ALL = {
    "stateremat": ["OPTIONS", "Option", "Outcome", "PlanResult", "ProfileCard", "ProfileCardError",
                   "RULES", "ReplayDivergenceError", "ReplayError", "UndeclaredStateError",
                   "UnsupportedError", "__version__", "load_card", "plan", "save_card"],
    "stateremat.contract": [
        "OPTIONS", "Option", "OptionCost", "OptionRegistry", "Outcome", "ProfileCard",
        "ProfileCardError", "RECOMPUTE_ONLY", "RULES", "ReplayDivergenceError",
        "ReplayError", "SegmentCard", "UndeclaredStateError", "UnsupportedError", "card_options",
        "format_bytes", "internal_assert", "load_card", "parse_size", "rule",
        "save_card"],
    "stateremat.reference": [
        "DTYPES", "Node", "Op", "OpRecord", "Program", "RANDOM_KINDS", "Region", "Run", "View",
        "check_supported", "complex_step_grad", "execute", "forward_jacobian_grad",
        "forward_with_snapshot", "graph_output", "region_undo_replay", "reverse_grad",
        "same_state", "scalar_output", "snapshot_replay", "unsupported_reason", "wrong_rng_state"],
    "stateremat.reference.engines": [
        "ENGINES", "EagerEngine", "Engine", "GuardedEngine", "ReadSetEngine", "Recovery",
        "RegionEngine", "WholeEngine", "backward", "forward", "make_engine"],
    "stateremat.planner": [
        "CostTables", "FRONTIER_WARN_POINTS", "FrontierWarning", "PEAK_MODELS", "PLANNERS", "PLAN_KEYS", "PlanResult",
        "PlannerSpec", "SPECS", "activation_pressure_card", "all_eager", "all_region", "all_whole", "chain_peak_bytes",
        "cost_tables",
        "eager_fraction_budget", "eager_whole", "exhaustive", "joint", "milp", "plan",
        "random_card", "state_agnostic"],
    "stateremat.jax": ["checkpoint"],
    "stateremat.integrations": [],
    "stateremat.torch": [
        "Checkpointer", "PeakMemory", "PreservationStats", "ReplayDivergenceError", "ReplayError",
        "StatefulCheckpoint", "UndeclaredStateError", "UndeclaredStateWarning", "UnsupportedError",
        "apply_plan", "auto_checkpoint", "checkpoint", "checkpoint_sequential", "expected_peak_bytes",
        "is_replaying", "journal_writes", "memory_method", "preservation_stats", "profile",
        "refuse_python_state", "reset_preservation_stats", "resolve_segments", "storage_bytes"],
    "stateremat.cli": ["app", "main"],
    "stateremat.paper": ["METHOD_OPTION", "NO_PROGRESS", "Progress", "Task", "as_progress",
                         "method_label"],
    "stateremat.paper.records": ["PART_KEY", "RUN_ID", "RecordStore", "RecordsError", "Rule", "new_run_id", "TEMP_DIR", "all_of",
                                 "constant", "implies", "marker_alone", "step_index",
                                 "below_config", "config_device", "config_entry",
                                 "first_part_holding", "foreign_units_message", "refuse_units_outside", "units_outside",
                                 "check_not_writing", "check_resumable", "claim_folder",
                                 "config_value", "declare_table", "in_config", "int_list",
                                 "integer", "lock_run", "number", "one_of", "part_identity",
                                 "read_records", "read_sidecar", "set_text", "table_spec",
                                 "text", "text_list"],
    "stateremat.paper.records.tables": [
        "BENCH_METHODS", "BENCH_TABLE", "EXTENSION_TABLE", "JAX_METHODS", "MOCO_METHODS",
        "MOCO_TABLE", "SEMANTICS_DTYPES", "SEMANTICS_FAMILIES", "SEMANTICS_TABLE", "SEMANTIC_RTOL",
        "STATEREMAT_JAX_METHOD", "STATUS_TABLE", "TABLES", "TIMING_TABLE", "TORCH_METHOD_NAMES",
        "VERIFY_FAMILIES"],
    "stateremat.paper.verify": [
        "ALIAS_DIMS", "ALIAS_PATTERNS", "ENGINE_NAMES", "FAMILIES", "SUITE_CODES",
        "alias_failures", "alias_rows", "byte_program", "byte_segment", "check_recovery",
        "derivative_program", "engine_rows", "engines_failures", "family_program",
        "finite_failures", "finite_rows", "integer_write_variant", "run_alias", "run_engines",
        "run_finite", "run_units", "summarise_alias", "summarise_engines", "summarise_finite"],
    "stateremat.paper.bench": [
        "Cell", "EXPERIMENTS", "ExperimentSpec", "FAIR_EAGER_FRACTION", "FROZEN_PROFILE_ENV",
        "METHODS", "MethodRun", "SIX_METHODS", "TABLE", "bench_summary", "budget_rule", "build_method",
        "cell_card", "check_method", "experiment_spec", "method_plan", "policy_json",
        "render_bench", "resolve_budget", "resolve_spec", "run_cell_methods", "run_experiment",
        "summarize", "with_budget", "write_bench_tables"],
    "stateremat.paper.cohort": [
        "CohortStopped", "EXPERIMENTS", "PRESPECIFIED", "STATUS_TABLE", "TIMING_TABLE", "check_dask_address",
        "check_timing_attempts", "cohort_config", "freeze_profiles", "method_order", "prespecified_comparisons", "run_one_process",
        "run_process_cohort", "worker_main"],
    "stateremat.paper.moco": [
        "KEY", "METHODS", "MocoPreset", "PRESETS", "TABLE", "check_threads", "failed_runs",
        "launch_units", "refuse_foreign_rows", "resolve_device", "run_moco", "score_file_problem", "scores_path", "summarize",
        "write_summary"],
    "stateremat.paper.semantics": [
        "DTYPES", "EXTENSION_TABLE", "FAMILIES", "FLOAT32_RTOL", "HIDDEN_FAMILIES", "KEY",
        "ProgramParams", "RunReport", "SEMANTICS_TABLE", "TABLE_ORDER", "cohort_units", "compare",
        "program_data", "program_params", "resolve_device", "run_semantics", "summarize_frame",
        "summarize_semantics"],
    "stateremat.paper.stats": [
        "Comparison", "FAMILY_ALPHA", "N_RESAMPLES", "RatioEstimate", "bonferroni_level",
        "bootstrap_ratio", "compare", "comparisons_from", "family_size", "geometric_mean",
        "method_table", "paired_ratios", "process_means"],
    "stateremat.paper.report": [
        "OUTPUTS", "REPORTERS", "check_complete", "cohort_summary", "orphan_tables",
        "register_reporter",
        "report_alias", "report_bench", "report_engines", "report_finite", "report_moco",
        "stale_outputs", "report_semantics", "report_semantics_extension", "tables_in"],
    "stateremat.paper.workloads": [
        "BasicBlock", "CPU_BYTES_FACTOR", "CPU_DIM_FACTOR", "FASHION_MNIST_DIR", "ImageData",
        "MOCO_SEGMENTS", "MoCo", "PRESETS", "QueueHead", "ResNet18", "StateSegment",
        "StatefulChain", "WORKLOADS", "WorkloadConfig", "detect_dataset", "fit_validation_split",
        "load_dataset", "loss_fn", "make_batch", "preset_budget", "preset_config", "scale",
        "two_views", "write_indices"],
    "stateremat.paper.profile": [
        "RecomputeOnly", "journal_scope", "preserved_now", "profile_workload", "sync",
        "warm_chain", "workload_source_hash", "wrap_segment"],
    "stateremat.paper.cli": ["paper_app"],
}
NEEDS = {"stateremat.jax": "jax", "stateremat.torch": "torch", "stateremat.paper.bench": "torch", "stateremat.paper.moco": "torch",
         "stateremat.paper.workloads": "torch", "stateremat.paper.profile": "torch"}


@pytest.mark.parametrize("package", sorted(EXPECTED_ALL))
def test_public_names_are_exactly_the_listed_ones(package):
    if package in NEEDS:
        pytest.importorskip(NEEDS[package])
    mod = importlib.import_module(package)
    assert sorted(mod.__all__) == sorted(EXPECTED_ALL[package])
    assert len(mod.__all__) == len(set(mod.__all__))
    # every listed name exists, and every public, non-module attribute is listed
    assert all(hasattr(mod, n) for n in mod.__all__)
    public = {n for n, v in vars(mod).items() if not n.startswith("_") and not inspect.ismodule(v)
              and not isinstance(v, __future__._Feature)}
    assert public == {n for n in mod.__all__ if not n.startswith("_")}


def test_every_public_package_has_an_expected_surface():
    pkgs = {".".join(p.relative_to(SRC).parts[:-1]) for p in (SRC / "stateremat").rglob("__init__.py")}
    public = {p for p in pkgs if not _private(p)}
    assert public - set(EXPECTED_ALL) == set()
