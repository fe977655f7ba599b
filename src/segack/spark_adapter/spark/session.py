"""Sessions: an embedded local Spark, a cluster master or Spark Connect, and what a run ships to them.

Nothing here touches ``SparkContext``, so every function works the same over
Spark Connect (``sc://HOST:PORT``) as in a classic session.
"""

from __future__ import annotations

import hashlib
import importlib
import ipaddress
import logging
import os
import site
import socket
import sys
import sysconfig
import tempfile
import weakref
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from segack.spark_adapter.errors import OptionError, SessionError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

__all__ = [
    "default_segment_count",
    "executors_share_local_disk",
    "is_connect",
    "server_parallelism",
    "setting",
    "local_session",
    "ship_module",
    "ship_py_files",
    "spark_session",
]

#: Settings fit for ordered processing; ``conf`` given by the user overrides them.
_DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    "spark.speculation": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.log.level": "ERROR",
    # Spark's own pattern, and a Kafka client's key material and JAAS lines (a reader option's
    # value is hidden in plans, the UI and event logs when its name or its value matches).
    "spark.redaction.regex": r"(?i)secret|password|token|access[.]?key|jaas|ssl\.keystore\.key|ssl\.key\.pem"
                             r"|private key",
}
#: The driver's logging setup for ``spark_session(quiet=True)``: fatal errors only.
QUIET_LOGGING = Path(__file__).with_name("log4j2-quiet.properties")
_LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.memory": "2g",
}


def spark_session(
    master: str | None = "local[2]",
    remote: str | None = None,
    conf: Mapping[str, str] | None = None,
    app_name: str = "segack",
    quiet: bool = False,
) -> SparkSession:
    """A session fit for ordered processing, on a master or a Spark Connect server.

    Speculative execution is off (two attempts of one segment must never run at once), Python
    workers use this interpreter unless ``PYSPARK_PYTHON`` or ``spark.pyspark.python`` names
    another (a packed environment's, say), and on a local master the UI is off and shuffles are
    small.

    Parameters
    ----------
    master : str or None, default ``'local[2]'``
        A classic session's master: ``local[N]``, ``local-cluster[...]``, ``spark://...``,
        ``yarn``, ``k8s://...``.
    remote : str, optional
        A Spark Connect server, ``sc://HOST:PORT``, instead of a master.
    conf : mapping, optional
        Settings, as ``spark-submit --conf`` takes them; they add to or override the above.
    app_name : str, default ``'segack'``
        The application's name.
    quiet : bool, default ``False``
        Start the driver JVM with a logging setup that prints fatal errors only, without Spark's
        start-up banner lines (only when this call starts the JVM).

    Raises
    ------
    OptionError
        Both ``master`` and ``remote``.
    SessionError
        Spark's JVM exited as it started (a package it could not resolve, say).
    """
    from pyspark.sql import SparkSession

    if remote is not None and master is not None:
        raise OptionError("give a master or a Spark Connect remote, not both")
    settings = dict(_DEFAULTS)
    if remote is None:
        if conf and "spark.pyspark.python" in conf:
            # spark-submit hands this setting to PySpark as PYSPARK_PYTHON; here PySpark is running.
            os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if master is None or _is_local_master(master):
            settings.update(_LOCAL_DEFAULTS)
        builder = SparkSession.builder.master(master or "local[2]")
    else:
        # A Connect client sets only session settings; the server owns the rest.
        settings = {"spark.sql.execution.arrow.pyspark.enabled": "true"}
        builder = SparkSession.builder.remote(remote)
    settings.update(conf or {})
    if quiet and remote is None:
        if "spark.log.level" not in (conf or {}):
            settings.pop("spark.log.level")  # the file sets it, without Spark saying so
        options = [f"-Dlog4j2.configurationFile={QUIET_LOGGING.as_uri()}",
                   settings.get("spark.driver.extraJavaOptions", "")]
        settings["spark.driver.extraJavaOptions"] = " ".join(filter(None, options))
    builder = builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        if remote is None:
            _own_session_gateway(master or "local[2]", app_name, settings)
        return builder.getOrCreate()
    except Exception as error:
        if "JAVA_GATEWAY_EXITED" not in str(error):
            raise
        packages = settings.get("spark.jars.packages")
        why = (f"a --conf spark.jars.packages it could not resolve ({packages})?" if packages
               else "--verbose shows its output")
        raise SessionError(f"Spark's JVM exited as it started: {why}") from None


def _own_session_gateway(master: str, app_name: str, settings: Mapping[str, str]) -> None:
    """Start the driver's JVM, unless this process has one, in a session of its own, with the
    settings the builder would start it with: a signal to this process's group (``kill -TERM
    -PGID``, systemd's ``KillMode=control-group``) is then this process's to handle, as Ctrl-C
    already is, not the JVM's to die of mid-batch. It still ends with this process: PySpark's JVM
    exits when its standard input, this process's pipe, closes."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    conf = SparkConf(loadDefaults=False).setMaster(master).setAppName(app_name).setAll(list(settings.items()))
    gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True})  # type: ignore[no-untyped-call]
    SparkContext._ensure_initialized(gateway=gateway)


def local_session(app_name: str = "segack", master: str = "local[2]", *, quiet: bool = True,
                  **conf: Any) -> SparkSession:
    """A classic ``SparkSession`` on an embedded local master (see :func:`spark_session`).

    Parameters
    ----------
    app_name : str, default ``'segack'``
        The application's name.
    master : str, default ``'local[2]'``
        ``local``, ``local[N]`` or ``local-cluster[...]``.
    quiet : bool, default ``True``
        As the ``segack`` command: the driver logs fatal errors only, without Spark's start-up banner
        (``False``: Spark's own logging, warnings included).
    **conf
        Settings (``spark_sql_shuffle_partitions`` is not a name: pass
        ``**{"spark.sql.shuffle.partitions": 4}``).
    """
    return spark_session(master=master, conf={key: str(value) for key, value in conf.items()},
                         app_name=app_name, quiet=quiet)


def setting(spark: SparkSession, key: str, fallback: str) -> str:
    """The session's effective value of ``key``, or ``fallback`` where it has none.

    Over Spark Connect, ``conf.get(key, default)`` answers ``default`` for a key
    the session has not set explicitly, hiding the server's own value; so ask
    without a default and fall back only when the key is unknown.
    """
    try:
        value = spark.conf.get(key)
    except Exception as error:
        log.debug("%s is not set (%s): taking %r", key, type(error).__name__, fallback)
        return fallback
    return fallback if value is None else str(value)


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _is_local_master(master: str) -> bool:
    return master == "local" or master.startswith(("local[", "local-cluster["))


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError) as error:
        log.debug("%s does not resolve (%s): taking it as another machine", host, error)
        return False


def executors_share_local_disk(spark: SparkSession) -> bool:
    """Whether every executor (and this process) sees this machine's local files.

    True for the local masters (``local``, ``local[...]``, ``local-cluster[...]``),
    over Spark Connect only when the server also runs here (a loopback address).
    Any other master may place executors on other machines.
    """
    master = setting(spark, "spark.master", "local")
    if not _is_local_master(master):
        return False
    return not is_connect(spark) or _is_loopback(getattr(spark, "client").host)  # noqa: B009


def default_segment_count(spark: SparkSession) -> int:
    """The session's shuffle parallelism (``spark.sql.shuffle.partitions``), which Connect exposes too."""
    return max(1, int(setting(spark, "spark.sql.shuffle.partitions", "200")))


def server_parallelism(spark: SparkSession) -> int:
    """The tasks a Spark Connect server runs at once, for a session that cannot read its
    ``defaultParallelism`` (a Connect client has no ``sparkContext``, and the server need not set
    ``spark.default.parallelism``): a range with no number of partitions is cut into the server's
    default parallelism, so one small job counts them."""
    from pyspark.sql import functions as F

    # The partition's id in a projection: Spark refuses it inside an aggregate (not deterministic).
    ids = spark.range(0, 1 << 12).select(F.spark_partition_id().alias("partition"))
    [row] = ids.agg(F.max("partition").alias("last")).collect()
    return int(row["last"]) + 1


def _installed_roots() -> list[str]:
    paths = sysconfig.get_paths()
    roots = [paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    roots += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        roots.append(site.getusersitepackages())
    return [os.path.realpath(root) for root in roots if root]


def _within(path: str, roots: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root + os.sep) for root in roots)


#: What each session was sent, by the module's top-level name: the digest of its files. Spark refuses
#: an artifact of a name it has (a second run's handler, in the same process and session).
_shipped: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def _digest(paths: list[str]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            digest.update(path.encode() + b"\0" + handle.read() + b"\0")
    return digest.hexdigest()


def ship_module(spark: SparkSession, module_name: str) -> str | None:
    """Send the top-level module or package of ``module_name`` to the executors.

    A single-file module goes as it is; a package is zipped (its ``.py`` files). Modules
    installed in this interpreter (the standard library, site-packages) are not sent: the
    executors are expected to have them, as they have segack. Uses
    ``addArtifacts(..., pyfile=True)``, which classic sessions and Spark Connect both take.

    Parameters
    ----------
    spark : SparkSession
        The session whose executors need the module.
    module_name : str
        A module's dotted name (a handler's, say); its top-level package is what goes.

    Returns
    -------
    str or None
        The path sent, or ``None`` when nothing was (nor needed to be: the session has this module
        as it is now from an earlier call).

    Raises
    ------
    SessionError
        The session was sent another version of the module before: its executors would keep that
        one (start a new session, or a new process).
    """
    top = module_name.split(".")[0]
    module = importlib.import_module(top)
    origin: str | None = getattr(module, "__file__", None)
    # segack itself is on the executors already (a zip of its .py files would lack its kernel).
    if origin is None or top == __name__.split(".")[0] or _within(origin, _installed_roots()):
        return None
    if hasattr(module, "__path__"):
        package_dir = os.path.dirname(origin)
        sources = []
        for folder, directories, files in os.walk(package_dir):
            directories[:] = sorted(name for name in directories if name != "__pycache__")
            sources += [os.path.join(folder, name) for name in sorted(files) if name.endswith(".py")]
    else:
        sources = [origin]
    digest, sent = _digest(sources), _shipped.setdefault(spark, {})
    if sent.get(top) == digest:
        return None
    if top in sent:
        raise SessionError(f"this Spark session was sent another version of module {top!r} before, which "
                           f"its executors keep: start a new session (or process) to run the changed one")
    if hasattr(module, "__path__"):
        shipped = os.path.join(tempfile.mkdtemp(prefix="segack-ship-"), f"{top}.zip")
        with zipfile.ZipFile(shipped, "w", zipfile.ZIP_DEFLATED) as bundle:
            for path in sources:
                bundle.write(path, os.path.join(top, os.path.relpath(path, package_dir)))
    else:
        shipped = origin
    spark.addArtifacts(shipped, pyfile=True)
    sent[top] = digest
    return shipped


def ship_py_files(spark: SparkSession, paths: list[str]) -> None:
    """Send ``.py``, ``.zip`` or ``.egg`` files to the executors, as ``spark-submit --py-files`` does.

    Parameters
    ----------
    spark : SparkSession
        The session whose executors need the files.
    paths : list of str
        The files.

    Raises
    ------
    OptionError
        A missing file, named, before anything is sent.
    """
    for path in paths:
        if not os.path.isfile(path):
            raise OptionError(f"--py-files: no such file {path!r}")
    for path in paths:
        spark.addArtifacts(os.path.abspath(path), pyfile=True)
