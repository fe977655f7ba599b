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
#: Longest module of the adapter, in lines.
LONGEST_MODULE = 600
#: The public entry points whose keyword parameters are for users (their options come from
#: RunOptions and are not counted).
ENTRY_POINTS = {"replay", "foreach_batch"}


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


def test_the_adapters_modules_stay_small():
    modules = (SOURCE / "spark_adapter").glob("*.py")
    sizes = {path.name: len(path.read_text().splitlines()) for path in modules}
    assert {name: size for name, size in sizes.items() if size > LONGEST_MODULE} == {}
