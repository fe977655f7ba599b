"""Sphinx configuration. Figures and the CLI page are generated from the installed package."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import segack  # noqa: E402

project = "segack"
author = "The segack developers"
copyright = "2026, the segack developers"
release = segack.__version__
version = release

extensions = ["sphinx.ext.autodoc", "sphinx.ext.doctest"]
autodoc_member_order = "bysource"
# The docstrings' examples use the package's names unqualified, as in the module they are written in.
doctest_global_setup = "from segack import *"
autodoc_typehints = "signature"
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = f"segack {release}"
html_static_path: list[str] = []
# Nitpicky checking is on; the names below are third-party types the docs mention but cannot link
# offline (Spark's and NumPy's), listed so every other reference must resolve.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(pyspark|numpy|npt|pyarrow|pa|np)\..*"),
    (r"py:.*", r"(Any|Callable|Iterator|Iterable|AsyncIterable|AsyncIterator|TextIO|Sequence)"),
    (r"py:.*", r"(Column|DataFrame|SparkSession|StructType|StreamingQuery)"),
    (r"py:.*", r"(collections\.abc|typing)\..*"),
    (r"py:class", r"segack\.(specs\.snapshot|spark_adapter\.coordinator\.replay)\..*"),
    # Private types in signatures: what an error reads of a claim, what a run calls per event.
    (r"py:class", r"(segack\.spark_adapter\.errors\._Claim|Handler)"),
    (r"py:.*", r"(int|str|bytes|float|bool|object|list|tuple|dict|None|BaseException|ValueError)"),
    # Words numpydoc puts where a type goes: "handler : callable", "progress : callable, optional".
    (r"py:class", r"(callable|optional|mapping)"),
    (r"py:.*", r"(argparse|sqlite3)\..*"),
    # Unqualified names in the spec's docstrings: documented once, under segack.
    (r"py:class", r"(DuplicateAckError|AckerFullError|SegmentSet)"),
]


def numpydoc_sections(app, what, name, obj, options, lines):  # type: ignore[no-untyped-def]
    """Render the numpydoc sections ("Parameters", "Other Parameters", "Returns", "Raises") of
    functions and classes, as napoleon does; attribute docstrings ("The fencing number: ...") are
    prose, which napoleon would read as "type: description"."""
    if what not in ("function", "method", "class"):
        return
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import NumpyDocstring

    config = Config(napoleon_use_param=True, napoleon_use_rtype=True)
    lines[:] = NumpyDocstring(lines, config, app, what, name, obj, options).lines()


def setup(app):  # type: ignore[no-untyped-def]
    import figures

    app.connect("autodoc-process-docstring", numpydoc_sections)
    figures.build_all(HERE / "_generated")
