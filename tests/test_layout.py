"""The shape of the package's Python code, kept as CONTRIBUTING.md draws it (no Spark, no import)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "segack"
#: Longest function body, in lines, docstring not counted.
LONGEST_BODY = 80
#: Most parameters of an internal function (``self`` and ``cls`` not counted).
MOST_PARAMETERS = 8
#: Longest Python module, in lines.
LONGEST_MODULE = 600
#: The adapter's subpackages by role, each importing only from those after it; its modules outside
#: them (the errors, options, handlers' and results' types users see) import from none of them.
ADAPTER_LAYERS = ("coordinator", "console", "sources", "spark", "worker", "store")
#: The public entry points whose keyword parameters are for users (their options come from
#: RunOptions and are not counted).
ENTRY_POINTS = {"replay", "foreach_batch", "stream", "stream_real_time"}


def _modules():
    return sorted(SOURCE.rglob("*.py"))


def _is_module(name):
    """Whether ``segack.x.y`` is a module of the package (a private module may be imported)."""
    parts = name.split(".")[1:]
    return SOURCE.joinpath(*parts).with_suffix(".py").is_file() or SOURCE.joinpath(*parts).is_dir()


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _body_lines(node):
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    if not body:
        return 0
    return body[-1].end_lineno - body[0].lineno + 1


def _parameters(node):
    arguments = node.args
    names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
    return [name for name in names if name not in ("self", "cls")]


@pytest.mark.parametrize("path", _modules(), ids=lambda path: str(path.relative_to(SOURCE)))
def test_functions_are_short_and_take_few_parameters(path):
    tree = ast.parse(path.read_text())
    long = [f"{node.name} ({_body_lines(node)} lines)" for node in _functions(tree)
            if _body_lines(node) > LONGEST_BODY]
    wide = [f"{node.name} ({len(_parameters(node))} parameters)" for node in _functions(tree)
            if len(_parameters(node)) > MOST_PARAMETERS and node.name not in ENTRY_POINTS
            and not node.name.startswith("__")]
    assert long == [] and wide == []


def test_no_private_name_is_imported_from_another_module():
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("segack"):
                offenders += [f"{path.relative_to(SOURCE)}: {node.module}.{alias.name}"
                              for alias in node.names
                              if alias.name.startswith("_") and not alias.name.startswith("__")
                              and not _is_module(f"{node.module}.{alias.name}")]
    assert offenders == []


def test_the_modules_stay_small():
    sizes = {str(path.relative_to(SOURCE)): len(path.read_text().splitlines()) for path in _modules()}
    assert {name: size for name, size in sizes.items() if size > LONGEST_MODULE} == {}


def _module_name(path):
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path):
    """The package's modules ``path`` imports: at its top, for type hints, or inside a function."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[:len(parts) - node.level + 1], base]).strip(".")
            # ``from package import module`` imports the module; ``from module import name``, the module.
            names = [f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base
                     for alias in node.names]
        else:
            continue
        found.update(name for name in names if name.startswith("segack") and _is_module(name))
    return found


def _graph(folder=SOURCE):
    """Each module of ``folder`` (a package of ``segack``), and the modules of it that it imports."""
    paths = sorted(folder.rglob("*.py"))
    modules = {_module_name(path) for path in paths}
    return {_module_name(path): {name for name in _imports(path) if name in modules} - {_module_name(path)}
            for path in paths}


def _adapter_graph():
    return _graph(SOURCE / "spark_adapter")


def _cycle(graph):
    """One import cycle of ``graph`` (a list of modules, the first repeated at the end), or ``[]``."""
    state = {}

    def visit(module, trail):
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return [*trail[trail.index(target):], target]
            if target not in state:
                found = visit(target, [*trail, target])
                if found:
                    return found
        state[module] = "done"
        return []

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return []


def test_the_package_has_no_import_cycle():
    # A package's __init__ re-exports its modules: importing it is not a module's dependency.
    graph = {module: {target for target in targets if not (SOURCE.parent / target.replace(".", "/")).is_dir()}
             for module, targets in _graph().items()}
    assert _cycle(graph) == []


def test_only_the_entry_point_imports_a_commands_module():
    # segack status must not pay for (or need) what replay imports: each command's module is
    # imported by main() when that command runs, and by nothing else.
    commands = {"runs", "plan", "status", "control", "ui", "demo"}
    importers = {module: sorted(target.rpartition(".")[2] for target in targets
                                if target.startswith("segack.cli.") and target.rpartition(".")[2] in commands)
                 for module, targets in _graph().items()}
    assert {module: found for module, found in importers.items() if found} == {
        "segack.cli.entry": sorted(commands)}


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def _layer(module):
    parts = module.split(".")
    if len(parts) > 3 and parts[2] in ADAPTER_LAYERS:
        return ADAPTER_LAYERS.index(parts[2])
    return len(ADAPTER_LAYERS)  # a module of the adapter's own folder: the lowest


def test_the_adapters_imports_go_down_its_roles():
    upward = [f"{module} -> {target}" for module, targets in _adapter_graph().items()
              if not module.endswith(("spark_adapter", *ADAPTER_LAYERS))  # the packages' own faces
              for target in targets if _layer(target) < _layer(module)]
    assert upward == []
    assert set(ADAPTER_LAYERS) == {path.name for path in (SOURCE / "spark_adapter").iterdir()
                                   if (path / "__init__.py").is_file()}


def test_the_connectors_pyspark_is_one_version_in_the_hint_the_extras_and_the_noxfile():
    import tomllib

    from segack.extras import install_hint
    from segack.spark_adapter.sources.kafka import CONNECTORS_SPARK, missing_connector

    root = SOURCE.parents[1]
    noxfile = (root / "noxfile.py").read_text()
    assert f'CONNECTORS_SPARK = "{CONNECTORS_SPARK}"' in noxfile
    major, minor, _ = CONNECTORS_SPARK.split(".")
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("kafka", "delta"):
        assert f"pyspark>={major}.{minor},<{major}.{int(minor) + 1}" in extras[extra]
    # The hint names the connector of the session's Spark, or says which PySpark to install.
    assert missing_connector(CONNECTORS_SPARK) == (
        f"this Spark session has no Kafka connector: add it with --conf spark.jars.packages="
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{CONNECTORS_SPARK} (or its jars with --conf "
        f"spark.jars=...)")
    newer = missing_connector(f"{major}.{int(minor) + 1}.0")
    assert newer.startswith(f"this Spark session has no Kafka connector, and Spark {major}.{int(minor) + 1}"
                            f".0 is newer than the newest whose connector segack was tested with")
    assert f"install PySpark {CONNECTORS_SPARK} ({install_hint('kafka')})" in newer
    assert missing_connector("4.1.1").endswith("spark-sql-kafka-0-10_2.13:4.1.1 (or its jars with --conf "
                                                "spark.jars=...)")


def _noxfile_constants() -> dict[str, object]:
    """The noxfile's plain constants (names to literal values, tuples of them and of each other), read
    without importing nox."""
    tree = ast.parse((SOURCE.parents[1] / "noxfile.py").read_text())
    found: dict[str, object] = {}

    def value(node: ast.expr) -> object:
        if isinstance(node, ast.Name):
            return found[node.id]
        if isinstance(node, ast.Tuple):
            return tuple(value(item) for item in node.elts)
        if isinstance(node, ast.Subscript):
            return value(node.value)[value(node.slice)]  # type: ignore[index]
        return ast.literal_eval(node)

    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id.isupper():
            try:
                found[statement.targets[0].id] = value(statement.value)
            except (ValueError, KeyError, TypeError):
                continue
    return found


def _readme_versions() -> list[list[str]]:
    text = (SOURCE.parents[1] / "README.md").read_text()
    table = text.split("## Supported versions\n\n", 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]
    return [row for row in rows[2:] if row]


def _docs_versions() -> list[list[str]]:
    text = (SOURCE.parents[1] / "docs" / "getting-started.rst").read_text()
    table = text.split(".. list-table::", 1)[1].split("\n\n", 2)[1]
    rows: list[list[str]] = []
    for line in table.splitlines():
        if line.startswith("   * - "):
            rows.append([line.removeprefix("   * - ")])
        elif line.startswith("     - "):
            rows[-1].append(line.removeprefix("     - "))
    return rows[1:]


def test_the_supported_versions_tables_are_the_versions_ci_runs():
    import tomllib

    nox = _noxfile_constants()
    pythons, pysparks, kafka = nox["PYTHONS"], nox["PYSPARKS"], nox["KAFKA_PYSPARKS"]
    default_python, default_pyspark = nox["DEFAULT_PAIR"]
    assert isinstance(pythons, tuple) and isinstance(pysparks, tuple) and isinstance(kafka, tuple)
    readme, docs = _readme_versions(), _docs_versions()
    assert readme == docs
    assert [row[0] for row in readme] == list(pysparks)
    for pyspark, python, streams, delta, ci in readme:
        assert python == ", ".join(pythons), pyspark
        assert (streams == "yes") == (pyspark in kafka), pyspark
        assert (delta == "yes") == (pyspark == nox["CONNECTORS_SPARK"]), pyspark
        everything = f"everything on {default_python}, the smoke tier on the others"
        assert ci == (everything if pyspark == default_pyspark else "the smoke tier"), pyspark
    project = tomllib.loads((SOURCE.parents[1] / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == f">={pythons[0]}"
    declared = [name.rsplit(" ", 1)[1] for name in project["classifiers"]
                if name.startswith("Programming Language :: Python :: 3.")]
    assert declared == list(pythons)
    major, minor, _ = pysparks[0].split(".")
    assert f"pyspark>={major}.{minor},<5" in project["optional-dependencies"]["spark"]


@pytest.mark.parametrize(("origin", "hint"), [
    ({"url": "file:///home/me/src/segack", "dir_info": {"editable": True}},
     "pip install '/home/me/src/segack[ui]'"),
    ({"url": "file:///tmp/a%20b/segack", "dir_info": {}}, "pip install '/tmp/a b/segack[ui]'"),
    ({"url": "file:///w/segack-0.2.0-cp311-cp311-linux_x86_64.whl", "archive_info": {}},
     "pip install 'segack[ui] @ file:///w/segack-0.2.0-cp311-cp311-linux_x86_64.whl'"),
    ({"url": "https://example.org/segack.tar.gz", "archive_info": {}}, "pip install 'segack[ui]'"),
    ({}, "pip install 'segack[ui]'"),
], ids=["checkout", "quoted", "wheel", "remote", "index"])
def test_a_missing_extra_is_hinted_as_segack_was_installed(origin, hint):
    from segack.extras import install_hint

    assert install_hint("ui", origin) == hint
