"""The architecture, checked from the source: no import cycle between packages, the login/compute contract in one module.
And the tests' own layout: they mirror the package, the cluster tests apart (tests/README.md)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from hpctrain.ledger.schema import MIGRATIONS

from helpers.paths import REPO, TESTS

PACKAGE = REPO / "hpctrain"


@functools.cache
def modules() -> dict[str, ast.Module]:
    """Every module of hpctrain, parsed (once: the checks only read the trees): {'jobs.poll': tree, 'contract': tree, ...}."""
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
    ("ledger", "registry"), ("checkpoint", "registry"), ("evaluate", "registry"), ("registry", "cli"),
    ("ledger", "trackers"), ("registry", "trackers"), ("trackers", "cli"),
    ("ledger", "interactive"), ("submit", "interactive"), ("jobs", "interactive"), ("interactive", "cli"),
])
def test_layers_do_not_reach_up(lower, upper):
    """The leaves stay leaves: the ledger knows no Slurm or lifecycle, Slurm access knows no ledger, ..."""
    assert upper not in package_graph()[lower]


def test_the_kernels_notice_extension_needs_no_hpctrain():
    """A session's kernels load interactive/notice.py into the user's namespace's process: nothing else of hpctrain."""
    assert imported(modules()["interactive.notice"]) == set()


def test_the_exported_model_definition_needs_no_hpctrain():
    """`hpctrain model export` copies registry/standalone_gpt.py into the export as the model's definition."""
    tree = modules()["registry.standalone_gpt"]
    tops = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    tops |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert tops <= {"__future__", "json", "pathlib", "torch", "safetensors"}


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


MARKUP = re.compile(r"\[/[^\]]*\]")  # a closing tag of rich markup: "[/]", "[/bold]"


def rich_text_uses(name: str, tree: ast.Module) -> list[str]:
    """Where a command module could print user text as rich markup or raw escapes, past cli.output's literal console:
    a console or text made of its own, a markup function, a string with markup tags."""
    found = [f"{name}:{n.lineno}: from {n.module} import" for n in ast.walk(tree)
             if isinstance(n, ast.ImportFrom) and n.module in ("rich.console", "rich.markup")]
    found += [f"{name}:{n.lineno}: {ast.unparse(n.func)}()" for n in ast.walk(tree) if isinstance(n, ast.Call)
              and ast.unparse(n.func).split(".")[0] in ("Console", "Text")]
    found += [f"{name}:{n.lineno}: {n.value[:60]!r}" for n in string_literals(tree) if MARKUP.search(n.value)]
    return found


def test_the_cli_prints_through_its_literal_console_only():
    """Ledger and user text is never read as markup nor printed with raw escapes: commands print with
    cli.output.make_console (markup off, control characters shown) and style with its ``styled``."""
    offenders = [use for name, tree in modules().items() if name.startswith("cli.") and name != "cli.output"
                 for use in rich_text_uses(name, tree)]
    assert offenders == []


def test_the_rich_text_check_sees_consoles_texts_and_markup():
    tree = ast.parse('from rich.console import Console\nConsole().print(f"[bold]{x}[/]")\nText.assemble(x)\n'
                     'Text(x)\nprint("a[1]")\n')
    assert sorted(u.split(": ", 1)[1] for u in rich_text_uses("m", tree)) == [
        "'[/]'", "Console()", "Text()", "Text.assemble()", "from rich.console import"]


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


TABLES = set(re.findall(r"CREATE TABLE (\w+)", "\n".join(s for migration in MIGRATIONS for s in migration if isinstance(s, str))))


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


# The tests' layout: tests/unit/<package>/ for the tests that need no cluster (tests/unit/project/ for the whole
# project's), tests/cluster/ for those that need the dev cluster, tests/helpers/ for what they share besides
# fixtures (tests/conftest.py), tests/assets/ for their data.
PROJECT = "project"


def suite_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


@functools.cache
def python_files() -> dict[Path, ast.Module]:
    """Every Python file under tests/, parsed: test modules, conftest.py, helpers, assets' scripts."""
    return {path: ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in sorted(TESTS.rglob("*.py"))}


def is_mark(node: ast.AST, name: str) -> bool:
    """``pytest.mark.<name>``."""
    return (isinstance(node, ast.Attribute) and node.attr == name
            and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"
            and isinstance(node.value.value, ast.Name) and node.value.value.id == "pytest")


def module_marks(tree: ast.Module) -> set[str]:
    """The marks of a module's ``pytestmark`` (one mark or a list of them), by name."""
    return {n.attr for node in tree.body if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
            for n in ast.walk(node.value) if isinstance(n, ast.Attribute) and is_mark(n, n.attr)}


def uses_mark(tree: ast.Module, name: str) -> bool:
    return any(is_mark(node, name) for node in ast.walk(tree))


def test_the_mark_checks_see_module_marks_and_marks_anywhere():
    marked = ast.parse("import pytest\npytestmark = [pytest.mark.slurm, pytest.mark.slow]\n")
    assert module_marks(marked) == {"slurm", "slow"} and uses_mark(marked, "slurm")
    per_test = ast.parse("import pytest\n@pytest.mark.slurm\ndef test_x():\n    pass\n")
    assert module_marks(per_test) == set() and uses_mark(per_test, "slurm")
    assert module_marks(ast.parse("pytestmark = pytest.mark.timeout(180)\n")) == {"timeout"}


def test_the_tests_lie_in_unit_and_cluster_only():
    assert suite_files(), "no test files found"
    assert [p for p in suite_files() if p.relative_to(TESTS).parts[0] not in ("unit", "cluster")] == []
    unit = [p.relative_to(TESTS / "unit") for p in suite_files() if p.relative_to(TESTS).parts[0] == "unit"]
    assert [p for p in unit if len(p.parts) != 2] == []  # tests/unit/<folder>/test_*.py


def test_every_unit_folder_names_a_package_of_hpctrain():
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    folders = {p.name for p in (TESTS / "unit").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert PROJECT not in packages
    assert folders - packages - {PROJECT} == set()


def test_cluster_tests_are_marked_slurm_and_only_they_use_the_mark():
    """The folder and the marker agree: `pytest tests/cluster` and `pytest -m slurm` run the same tests."""
    cluster = TESTS / "cluster"
    trees = python_files()
    assert [p.name for p in suite_files() if p.parent == cluster and "slurm" not in module_marks(trees[p])] == []
    assert [str(p.relative_to(TESTS)) for p, tree in trees.items()
            if not p.is_relative_to(cluster) and uses_mark(tree, "slurm")] == []


def test_test_file_names_are_unique():
    """pytest imports a test module by its file name (its folder on sys.path): two of one name would clash."""
    names = [p.name for p in suite_files()]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_no_module_imports_conftest_or_a_test_module():
    """What tests share is a fixture (conftest.py) or a helper (the helpers package), never another test file."""
    def top_names(tree: ast.Module) -> set[str]:
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
        return found

    offenders = [f"{p.relative_to(TESTS)}: {name}" for p, tree in python_files().items()
                 for name in sorted(top_names(tree)) if name == "conftest" or name.startswith("test_")]
    assert offenders == []
