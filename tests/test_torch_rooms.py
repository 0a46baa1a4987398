"""The torch core's rooms (issue 23): no import cycle among its modules, counting imports inside
functions, and no class or function grown past one screenful of rooms (an ``ast`` walk)."""
from __future__ import annotations

import ast
from pathlib import Path

from test_layout import _core_file, _imports, _tree, import_cycles

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


def test_the_torch_core_has_no_import_cycle():
    assert import_cycles(_tree(), _core_file) == []  # test_layout's finder, function-level imports counted


def test_the_cycle_finder_sees_a_function_level_circle():
    fake = {"stateremat.torch._a": ("def f():\n    from ._b import x\n", False),
            "stateremat.torch._b": ("from ._c import y\n", False),
            "stateremat.torch._c": ("from stateremat.torch._a import z\n", False),
            "stateremat.torch._d": ("from ._a import z\n", False)}
    assert import_cycles(fake, _core_file) == [["stateremat.torch._a", "stateremat.torch._b", "stateremat.torch._c"]]
    # the registration that broke _mark → _mode → _preserve → _runtime → _mark
    tree = _tree()
    runtime = "stateremat.torch._runtime"
    assert not any(t.startswith("stateremat.torch._mark") for t, _, _ in _imports(runtime, tree[runtime][0], False, set(tree)))


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


#: What the frame, the watch and the write handler may ask of the transaction's module state.
_MODULE_STATE_QUERIES = {"declares", "replayed_slots", "binds_plain", "slots_at_end"}
#: ... and the records they must not read (a local ``mods`` is the module state, as in the watch).
_MODULE_STATE_RECORDS = {"held_keys", "declared_modules", "bindings", "end_bindings", "plain", "modes",
                         "views", "adopted", "_ends"}


def _reads_outside_the_transaction(src: str) -> list[str]:
    """``txn.items`` / ``txn.modules.<record>`` reads in ``src``: what a replay puts back is read
    only through the transaction's query methods (its module and _bindings own the records)."""
    hits = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if node.attr == "items" and isinstance(base, ast.Attribute) and base.attr == "txn":
            hits.append("txn.items")
        if isinstance(base, ast.Attribute) and base.attr == "modules" and isinstance(base.value, ast.Attribute) \
                and base.value.attr == "txn" and node.attr not in _MODULE_STATE_QUERIES:
            hits.append(f"txn.modules.{node.attr}")
        if isinstance(base, ast.Name) and base.id == "mods" and node.attr in _MODULE_STATE_RECORDS:
            hits.append(f"mods.{node.attr}")
        if node.attr == "add_witness" or (node.attr == "unmarkable" and isinstance(node.ctx, ast.Store)):
            hits.append(node.attr)  # who watches a declared storage is the transaction's to decide
    return hits


def test_only_the_transaction_reads_what_a_replay_puts_back():
    """Changing what a replay puts back touches the transaction's module (``_txn``, ``_bindings``,
    ``_plain``) only: the other rooms ask it through a few query methods (issue 23)."""
    own = {"_txn", "_bindings", "_plain", "_runtime", "_mark", "_mode", "_learn"} | {m for m in _modules() if m.startswith("_preserve")}
    hits = {name: h for name, p in _modules().items() if name not in own
            and (h := _reads_outside_the_transaction(p.read_text()))}
    assert hits == {}
    # the check sees the reads it forbids
    planted = ("def f(self):\n    a = self.txn.items\n    b = self.txn.modules.end_bindings\n    mods.held_keys\n"
               "    p.storage.add_witness(x, 'n')\n    st.unmarkable = True\n")
    assert sorted(_reads_outside_the_transaction(planted)) == sorted(
        ["txn.items", "txn.modules.end_bindings", "mods.held_keys", "add_witness", "unmarkable"])


def test_run_segment_hands_the_transaction_nothing_of_the_watch():
    """The transaction keeps what a replay puts back from its own records (issue 23, "Done when":
    changing what a replay puts back touches the transaction's module only): no call of a
    ``txn`` method in ``run_segment`` passes the watch or anything read from it."""
    tree = ast.parse((TORCH / "_checkpoint.py").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "run_segment")
    leaks = []
    for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
        f = call.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "txn":
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                if any(isinstance(x, ast.Name) and x.id == "watch" for x in ast.walk(arg)):
                    leaks.append(f"txn.{f.attr}({ast.unparse(arg)})")
    assert leaks == []
