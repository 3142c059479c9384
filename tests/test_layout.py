"""The architecture, checked from the source: no import cycle between packages, the login/compute contract in one module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hpctrain.ledger.schema import MIGRATIONS

PACKAGE = Path(__file__).resolve().parent.parent / "hpctrain"


def modules() -> dict[str, ast.Module]:
    """Every module of hpctrain, parsed: {'jobs.poll': tree, 'contract': tree, ...}."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return out


def unit(module: str) -> str:
    """The package a module belongs to ('jobs.poll' -> 'jobs'), or the top-level module itself."""
    return module.split(".")[0]


def imported(tree: ast.Module) -> set[str]:
    """hpctrain modules a module imports anywhere (lazy imports inside functions count too), without the prefix."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "hpctrain" else [node.module]
        else:
            continue
        found |= {n.removeprefix("hpctrain.") for n in names if n.startswith("hpctrain.")}
    return found


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, tree in modules().items():
        graph.setdefault(unit(name), set()).update(unit(m) for m in imported(tree) if unit(m) != unit(name))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_packages():
    graph = package_graph()
    assert {"jobs", "cli", "submit", "ledger", "contract"} <= set(graph)  # the walk sees the packages
    assert cycles(graph) == []


# The package root holds the leaves every package shares; each concern lives in a package of its own.
ROOT_MODULES = {"__init__", "__main__", "contract", "errors", "files", "lazy", "bundled"}


def test_the_package_root_holds_the_shared_leaves_only():
    root = {name for name in modules() if "." not in name and not (PACKAGE / name).is_dir()}
    assert root == ROOT_MODULES
    leaves = ROOT_MODULES - {"__init__", "__main__"}
    assert {m for m in leaves if imported(modules()[m]) - {"__version__"}} == set(), "a shared leaf imports hpctrain"


@pytest.mark.parametrize("lower, upper", [
    ("ledger", "jobs"), ("ledger", "submit"), ("ledger", "slurm"), ("slurm", "ledger"), ("contract", "config"),
    ("config", "submit"), ("sweep", "report"), ("data", "train"), ("checkpoint", "train"),
])
def test_layers_do_not_reach_up(lower, upper):
    """The leaves stay leaves: the ledger knows no Slurm or lifecycle, Slurm access knows no ledger, ..."""
    assert upper not in package_graph()[lower]


def string_literals(tree: ast.Module) -> list[ast.Constant]:
    """String constants that are not docstrings (documentation may name a variable; code may not)."""
    docstrings = {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


def test_hpctrain_variables_are_named_only_in_the_contract():
    offenders = [f"{name}:{node.lineno}: {node.value[:60]!r}" for name, tree in modules().items()
                 if name != "contract" for node in string_literals(tree) if "HPCTRAIN_" in node.value]
    assert offenders == []


def test_slurm_variables_a_job_reads_are_read_only_in_the_contract():
    """The slurm package names SLURM_CONF for the commands it runs, and reads SLURM_VERSION from scontrol's output."""
    offenders = [f"{name}:{node.lineno}: {node.value!r}" for name, tree in modules().items()
                 if name != "contract" and unit(name) != "slurm" for node in string_literals(tree)
                 if re.fullmatch(r"SLURM[A-Z_]*", node.value)]
    assert offenders == []


def test_the_literal_check_sees_code_but_not_docstrings():
    tree = ast.parse('"""Reads $HPCTRAIN_X."""\nNAME = "HPCTRAIN_X"\n')
    assert [n.value for n in string_literals(tree)] == ["HPCTRAIN_X"]


SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|WHERE|JOIN|PRAGMA|CREATE)\b|\w+ (=|IN|IS) \(?\?")


def database_uses(name: str, tree: ast.Module) -> list[str]:
    """Where a module outside the ledger reaches past its typed API: the database object, raw row queries, SQL."""
    found = [f"{name}:{n.lineno}: .{n.attr}" for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and n.attr in ("db", "conn")]
    found += [f"{name}:{n.lineno}: .{n.func.attr}()" for n in ast.walk(tree) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Attribute) and n.func.attr in ("rows", "query", "execute", "executemany")]
    found += [f"{name}:{n.lineno}: {n.value[:60]!r}" for n in string_literals(tree) if SQL.search(n.value)]
    return found


def test_only_the_ledger_touches_the_database_or_writes_sql():
    offenders = [use for name, tree in modules().items() if unit(name) != "ledger"
                 for use in database_uses(name, tree)]
    assert offenders == []


def test_the_database_check_sees_sql_and_the_database_object():
    tree = ast.parse('ledger.db.execute("SELECT 1")\nledger.rows("jobs", "site = ?", [s])\nledger.jobs.active(s)\n'
                     'table.rows.append(row)\n')
    assert len(database_uses("m", tree)) == 5


TABLES = set(re.findall(r"CREATE TABLE (\w+)", "\n".join(s for migration in MIGRATIONS for s in migration)))


def is_ledger(node: ast.expr) -> bool:
    """A ledger by the name every module gives it: ``ledger``, ``self.ledger``."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name == "ledger"


def reaches_ledger(call: ast.Call) -> bool:
    """A call of a ledger's method (``ledger.x(...)``, ``self.ledger.jobs.x(...)``), or one given a ledger."""
    receiver = call.func
    while isinstance(receiver, ast.Attribute):
        receiver = receiver.value
        if is_ledger(receiver):
            return True
    return any(is_ledger(a) for a in [*call.args, *(k.value for k in call.keywords)])


def table_names(name: str, tree: ast.Module) -> list[str]:
    """Where a module outside the ledger names a table to it, past its table classes: a table's name (a string that is
    exactly one) passed to a call that reaches a ledger, or the generic row access imported. The same words elsewhere
    name other things (a journal record's kind, a manifest's key, a command's argument, a printed table's title)."""
    found = [f"{name}:{a.lineno}: {a.value!r}" for n in ast.walk(tree) if isinstance(n, ast.Call) and reaches_ledger(n)
             for a in [*n.args, *(k.value for k in n.keywords)] if isinstance(a, ast.Constant) and a.value in TABLES]
    found += [f"{name}: imports hpctrain.{m}" for m in imported(tree) if m.split(".")[:2] == ["ledger", "table"]]
    return found


def test_only_the_ledger_names_its_tables():
    assert {"jobs", "attempts", "events", "site_cache", "journal_ingested"} <= TABLES  # the schema's, all of them
    offenders = [use for name, tree in modules().items() if unit(name) != "ledger" for use in table_names(name, tree)]
    assert offenders == []


def test_the_table_check_sees_table_names_given_to_a_ledger_only():
    tree = ast.parse('ledger.update("jobs", 1, {})\nself.ledger.get("site_cache", key)\nledger.jobs.of("attempts")\n'
                     'Table(ledger, "events")\ncount(self.ledger, table="trials")\n'
                     'from hpctrain.ledger.table import Table\n'
                     'journal.write("metrics", step=1)\nm.data.get("metrics", {})\nclick.argument("sweeps")\n'
                     'Table(title="attempts")\nrow["jobs"]\nledger.jobs.get(1)\n')
    assert [use.split(": ", 1)[1] for use in table_names("m", tree)] == [
        "'jobs'", "'site_cache'", "'attempts'", "'events'", "'trials'", "imports hpctrain.ledger.table"]
