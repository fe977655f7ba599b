"""The public API's shape: one error hierarchy, and the 0.1 names that still work."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import segack
from segack.errors import SegackError

INSTALLED = Path(segack.__file__).parent
#: The checkout's sources, which the source checks read (the installed copy may lag behind).
SOURCE = Path(__file__).resolve().parents[1] / "src" / "segack"


def _modules():
    for info in pkgutil.walk_packages([str(INSTALLED)], prefix="segack."):
        if info.name.endswith("__main__"):
            continue
        yield importlib.import_module(info.name)


def _error_classes():
    found = {}
    for module in _modules():
        for value in vars(module).values():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__.startswith("segack")):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_error_class_derives_from_segack_error_and_ends_in_error():
    classes = _error_classes()
    assert len(classes) >= 10, sorted(classes)
    for name, error in classes.items():
        assert issubclass(error, SegackError), name
        assert error.__name__.endswith("Error"), name


@pytest.mark.parametrize("builtin", ["ValueError", "TypeError", "KeyError", "RuntimeError", "AssertionError"])
def test_library_code_raises_no_bare_builtin_error(builtin):
    pattern = re.compile(rf"\braise {builtin}\(")
    offenders = [f"{path.relative_to(SOURCE)}:{number}"
                 for path in sorted(SOURCE.rglob("*")) if path.suffix in (".py", ".pyx", ".pxi")
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if pattern.search(line) and "pragma: no cover" not in line]
    assert offenders == []


def test_library_code_checks_input_without_assert():
    # ``python -O`` drops asserts: outside the ``_check`` debugging aids they may only narrow
    # internal state for the type checker (``assert x is not None``).
    offenders = []
    for path in sorted(SOURCE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        checks = {node for function in ast.walk(tree)
                  if isinstance(function, ast.FunctionDef) and function.name == "_check"
                  for node in ast.walk(function)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assert) or node in checks:
                continue
            test = node.test
            narrowing = (isinstance(test, ast.Compare) and len(test.ops) == 1
                         and isinstance(test.ops[0], ast.IsNot)
                         and isinstance(test.comparators[0], ast.Constant)
                         and test.comparators[0].value is None)
            if not narrowing:
                offenders.append(f"{path.relative_to(SOURCE)}:{node.lineno}")
    assert offenders == []


def test_errors_refine_the_builtin_they_replace():
    assert issubclass(segack.SegackValueError, ValueError)
    assert issubclass(segack.SegackTypeError, TypeError)
    assert issubclass(segack.DuplicateAckError, ValueError)
    assert issubclass(segack.AckerFullError, RuntimeError)
    with pytest.raises(ValueError, match="must be"):
        segack.SegmentSet.balanced(0)
    with pytest.raises(SegackError):
        segack.java_hash(1.5)


def test_the_old_handler_failed_name_warns_and_is_the_new_class():
    from segack import spark_adapter
    from segack.spark_adapter import errors

    for module in (spark_adapter, errors):
        with pytest.warns(DeprecationWarning, match="HandlerFailedError"):
            assert module.HandlerFailed is spark_adapter.HandlerFailedError
    with pytest.raises(AttributeError):
        errors.NoSuchName  # noqa: B018


def test_the_compiled_modules_import_nothing_from_the_spec():
    """The twins share only segack._shared (formats, rules, wording): a bug in either shows up
    when they are compared, instead of hiding in code both run."""
    for source in sorted((SOURCE / "pyx").glob("*.pyx")):
        imports = [line for line in source.read_text().splitlines()
                   if re.match(r"\s*(from|import|cimport)\s+segack\.specs\b", line)]
        assert imports == [], f"{source.name}: {imports}"


def _public(module):
    return {name: getattr(module, name) for name in module.__all__}


def test_the_kernel_has_every_public_name_of_the_spec():
    import segack.kernel
    import segack.specs

    assert set(segack.specs.__all__) <= set(segack.kernel.__all__)
    assert set(segack.specs.__all__) <= set(segack.__all__)


def _signature_pairs():
    import segack.kernel
    import segack.specs

    kernel = _public(segack.kernel)
    for name, twin in _public(segack.specs).items():
        if inspect.isclass(twin) and not issubclass(twin, BaseException):
            for member, value in vars(twin).items():
                if callable(value) and not member.startswith("_"):
                    yield f"{name}.{member}", getattr(twin, member), getattr(kernel[name], member, None)
        elif callable(twin) and not inspect.isclass(twin):
            yield name, twin, kernel[name]


def _documented_pairs():
    """Every public function, method and property of the spec beside its kernel twin."""
    import segack.kernel
    import segack.specs

    kernel = _public(segack.kernel)
    for name, twin in _public(segack.specs).items():
        if inspect.isclass(twin) and twin is not kernel[name]:
            yield name, twin, kernel[name]
            for member, value in vars(twin).items():
                if (callable(value) or isinstance(value, (property, classmethod, staticmethod))) and (
                        not member.startswith("_")):
                    yield f"{name}.{member}", getattr(twin, member), getattr(kernel[name], member, None)
        elif callable(twin) and twin is not kernel[name]:
            yield name, twin, kernel[name]


def _docstring(value):
    """``value``'s docstring without the signature line Cython's ``embedsignature`` puts first."""
    text = inspect.cleandoc(value.__doc__ or "")
    first, _, rest = text.partition("\n")
    if re.fullmatch(r"[\w.]+\(.*\)( -> .*)?", first):
        text = inspect.cleandoc(rest)
    return text


@pytest.mark.parametrize(("name", "spec", "kernel"), list(_documented_pairs()),
                         ids=[name for name, _, _ in _documented_pairs()])
def test_kernel_docstrings_are_the_specs(name, spec, kernel):
    """As cytoolz does for toolz: one text for both twins, so neither drifts into "see the spec"."""
    assert kernel is not None, f"the kernel lacks {name}"
    assert _docstring(spec), f"the spec's {name} has no docstring"
    assert _docstring(kernel) == _docstring(spec)


_EXAMPLE_MODULES = [f"segack.{twin}.{name}" for twin in ("specs", "pyx")
                    for name in ("hashes", "segments", "partitioner", "acker")]


@pytest.mark.parametrize("name", _EXAMPLE_MODULES)
def test_docstring_examples_run_on_both_twins(name):
    """The docstrings are one text for both twins (above); their examples must hold for each."""
    import doctest

    module = importlib.import_module(name)
    # Names a compiled module only cimports come from its twin's package, as users see them.
    package = importlib.import_module("segack.specs" if ".specs." in name else "segack.kernel")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = doctest.DocTestFinder().find(module, globs={**vars(package), **vars(module)})
    assert sum(len(test.examples) for test in tests) > 0, f"{name} has no examples"
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def _shape(parameters):
    """Parameter names, kinds and defaults, without ``self``; annotations are the spec's alone."""
    return [(p.name, p.kind, p.default) for p in parameters if p.name != "self"]


@pytest.mark.parametrize(("name", "spec", "kernel"), list(_signature_pairs()),
                         ids=[name for name, _, _ in _signature_pairs()])
def test_kernel_signatures_are_the_specs(name, spec, kernel):
    assert kernel is not None, f"the kernel lacks {name}"
    assert _shape(inspect.signature(kernel).parameters.values()) == _shape(
        inspect.signature(spec).parameters.values())


def _stub_init(cls):
    """The ``__init__`` parameters of a compiled class, as its ``.pyi`` stub declares them
    (a cdef class's own ``__init__`` cannot be introspected)."""
    module = sys.modules[cls.__module__]
    stub = Path(inspect.getfile(module)).parent / (cls.__module__.rsplit(".", 1)[1] + ".pyi")
    tree = ast.parse(stub.read_text())
    [node] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == cls.__name__]
    [init] = [item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"]
    arguments = init.args
    defaults = [None] * (len(arguments.args) - len(arguments.defaults)) + list(arguments.defaults)
    shape = [(a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD,
              inspect.Parameter.empty if d is None else ast.literal_eval(d))
             for a, d in zip(arguments.args, defaults, strict=True)]
    shape += [(a.arg, inspect.Parameter.KEYWORD_ONLY,
               inspect.Parameter.empty if d is None else ast.literal_eval(d))
              for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)]
    return [item for item in shape if item[0] != "self"]


@pytest.mark.parametrize("name", ["OffsetAcker", "Segment", "SegmentSet", "SegmentPartitioner"])
def test_compiled_constructors_are_the_specs_as_stubbed(name):
    import segack.kernel
    import segack.specs

    spec = inspect.signature(getattr(segack.specs, name).__init__).parameters.values()
    assert _stub_init(getattr(segack.kernel, name)) == _shape(spec)
