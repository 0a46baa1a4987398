"""The torch core's rooms (issue 23): no import cycle among its modules, counting imports inside
functions, and no class or function grown past one screenful of rooms (an ``ast`` walk)."""
from __future__ import annotations

import ast
from pathlib import Path

TORCH = Path(__file__).resolve().parents[1] / "src" / "stateremat" / "torch"
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 100


def _modules() -> dict[str, Path]:
    """``stateremat.torch`` module name (``_txn``, ``_preserve``, ``_preserve.region``) -> file."""
    out = {}
    for p in sorted(TORCH.rglob("*.py")):
        parts = list(p.relative_to(TORCH).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the core modules it imports anywhere (top level or inside a function)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        package = [p for p in package if p]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = base + (node.module.split(".") if node.module else [])
                # `from . import _rng` imports the module _rng, not (for this check) the package
                targets = ([".".join(mod)] if node.module else []) + [".".join(mod + [a.name]) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stateremat.torch."):
                mod = node.module.split(".")[2:]
                targets = [".".join(mod)] + [".".join(mod + [a.name]) for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name[len("stateremat.torch."):] for a in node.names
                           if a.name.startswith("stateremat.torch.")]
            deps.update(t for t in targets if t in mods and t != name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (each holds a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_torch_core_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_sees_a_function_level_circle():
    graph = {"_a": {"_b"}, "_b": {"_c"}, "_c": {"_a"}, "_d": {"_a"}}
    assert cycles(graph) == [["_a", "_b", "_c"]]
    # the registration that broke _mark → _mode → _preserve → _runtime → _mark
    assert "_mark" not in import_graph()["_runtime"]


def test_no_torch_class_or_function_outgrows_its_room():
    long = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            n = (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
            if isinstance(node, ast.ClassDef) and n > MAX_CLASS_LINES:
                long.append(f"class {path.name}:{node.name} has {n} lines")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and n > MAX_FUNCTION_LINES:
                long.append(f"function {path.name}:{node.name} has {n} lines")
    assert long == []


def test_the_replay_rooms_are_where_the_design_puts_them():
    from stateremat.torch import _bindings, _frame, _txn, _watch

    assert _frame.Frame and _watch.Watch and _txn.Transaction and _bindings.Bindings
    # the transaction's docstring is its order; every room says how data flows through it
    order = ["parameter versions", "module bindings", "training flags", "declared bytes", "RNG",
             "Nested adoption"]
    doc = _txn.__doc__[_txn.__doc__.index("1. "):]
    assert [doc.index(o) for o in order] == sorted(doc.index(o) for o in order)
    for mod in (_frame, _watch, _txn, _bindings):
        assert "forward" in mod.__doc__
