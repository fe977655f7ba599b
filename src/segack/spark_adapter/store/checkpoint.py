"""Durable checkpoints: per-key-group tokens plus the settings of the run that wrote them.

A checkpoint is a directory: a local path, an object store's prefix (``s3://``, ``gs://``,
``az://``) or any other URI :mod:`pyarrow.fs` opens (``hdfs://``, ``file://``)::

    CHECKPOINT/checkpoint-N.json         the committed state, rewritten atomically (N: the claim)
    CHECKPOINT/progress/RUN-sN-aN.sgku   what each running task has finished (its updates)
    CHECKPOINT/progress/RUN.stop         asks the run's tasks to stop at their next flush
    CHECKPOINT/claims/N.json             who runs on the checkpoint (store/claims.py)
    CHECKPOINT/dead-letters/*.parquet    events set aside (coordinator/dead_letters.py)
    CHECKPOINT/segments-request.json     segments asked of the live run (store/rescale.py)
    CHECKPOINT/stream/                   Spark's own checkpoint of a query segack runs (coordinator/query.py)

The state file is named after the claim number of the run that wrote it
(:mod:`~segack.spark_adapter.store.claims`); the newest is the checkpoint, and older ones are deleted
once it is written, so a run fenced by a newer claim cannot bring its state back by saving late.
It is one JSON object: ``format``, ``version``, ``segack`` (the
version that wrote it), ``settings`` (the input's key, order, hash, column types,
key-group resolution, segments, flush policy, status), ``tokens`` (the
:class:`~segack.spark_adapter.store.tokens.KeyGroupTokens`, sealed and base64) and
``crc32`` of the canonical JSON of everything else. Its size depends on the
number of key groups, never on the number of events.

Every write is atomic (:mod:`~segack.spark_adapter.store.storage`): a reader sees the old file or the
new one, never a torn one. A damaged checkpoint is refused with
:class:`~segack.spark_adapter.CheckpointError` and never overwritten.

The same files have two views, as Flink's checkpoint storage has: the run's coordinator on the
driver holds a :class:`CheckpointStore` (the state, claims, segment requests, dead letters and
progress of every run); each task holds a :class:`TaskStore`, which may only write its own
progress and dead letters, look for a stop request and for a newer claim, and read what earlier
attempts of its segment recorded.
"""

from __future__ import annotations

import base64
import json
import posixpath
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from segack._version import __version__
from segack.spark_adapter.errors import CheckpointError, CheckpointLocationError, TokenError
from segack.spark_adapter.store.crash_points import durable_write
from segack.spark_adapter.store.dead_letter_files import (
    DEAD_LETTERS_DIR,
    dead_letter_keys_of,
    dead_letter_paths,
    dead_letter_places_of,
    read_dead_letter_file,
)
from segack.spark_adapter.store.driver_watch import DriverProcess
from segack.spark_adapter.store.kafka_sink_files import SINK_POSITIONS_FILE, SINK_PRODUCERS_DIR
from segack.spark_adapter.store.partitions import PartitionStates
from segack.spark_adapter.store.query_log import QueryLog
from segack.spark_adapter.store.storage import Files, LocalFiles, open_files, resolve_location
from segack.spark_adapter.store.stream_view import STREAM_VIEW
from segack.spark_adapter.store.tokens import KeyGroupTokens, decode_updates, encode_updates

__all__ = ["Checkpoint", "CheckpointError", "CheckpointStore", "TaskLoad", "TaskStore"]

FORMAT = "segack-checkpoint"
VERSION = 2
#: The segack release that wrote each older format, for a clear refusal.
_WRITTEN_BY = {1: "0.1.0"}
#: The state file is ``checkpoint-N.json``, N the claim number of the run that wrote it.
STATE_PREFIX = "checkpoint-"
STATE_SUFFIX = ".json"
PROGRESS_DIR = "progress"
PROGRESS_SUFFIX = ".sgku"
STOP_SUFFIX = ".stop"
#: Where runs claim the checkpoint (:mod:`segack.spark_adapter.store.claims`).
CLAIMS_DIR = "claims"
#: A change of segments asked of the run that holds the checkpoint
#: (:mod:`segack.spark_adapter.store.rescale`).
SEGMENTS_REQUEST = "segments-request.json"
#: Spark's own checkpoint of a query segack runs (:func:`segack.spark_adapter.stream`).
STREAM_DIR = "stream"
#: The setting in which a replay records its input's events as its Parquet footers count them.
FOOTER_TOTAL = "footer_total"
DEAD_ERROR = "__segack_error"
DEAD_ATTEMPTS = "__segack_attempts"
DEAD_KEY_GROUP = "__segack_key_group"
DEAD_POSITION = "__segack_position"
# A progress file's schema metadata: its task's load (TaskLoad's fields), as decimal text.
_LOAD_METADATA = {"in_flight": b"segack.in_flight", "pending": b"segack.pending",
                  "retries": b"segack.retries"}


@dataclass(frozen=True)
class TaskLoad:
    """What a task's progress file reports beside its updates, for the progress line and the
    metrics: its handler calls running, its rows read but not committed, and the handler calls it
    made again after a call raised (retries and a list's narrowed parts), since it began."""

    in_flight: int = 0
    pending: int = 0
    retries: int = 0

    def __add__(self, other: TaskLoad) -> TaskLoad:
        return TaskLoad(self.in_flight + other.in_flight, self.pending + other.pending,
                        self.retries + other.retries)


@dataclass
class Checkpoint:
    """The committed state of a replay: its settings and, once it has counted its input, its tokens."""

    settings: dict[str, Any] = field(default_factory=dict)
    tokens: KeyGroupTokens | None = None

    @property
    def input_events(self) -> int | None:
        """Events in the replay's input: counted, once a run has read it all; before that, what its
        Parquet footers said at the run's start (:mod:`~segack.spark_adapter.sources.footers`), if
        they were read; else ``None``."""
        if self.tokens is not None and self.tokens.counted:
            return self.tokens.total
        rows = self.settings.get(FOOTER_TOTAL)
        return rows if isinstance(rows, int) and not isinstance(rows, bool) else None

    def to_bytes(self) -> bytes:
        tokens = None if self.tokens is None else base64.b64encode(self.tokens.to_bytes()).decode("ascii")
        body = {"format": FORMAT, "version": VERSION, "segack": __version__, "settings": self.settings,
                "tokens": tokens}
        body["crc32"] = zlib.crc32(_canonical(body))
        return json.dumps(body, indent=1, sort_keys=True).encode("utf-8") + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "checkpoint") -> Checkpoint:
        """Parse a checkpoint; a damaged, foreign or other-version one is a
        :class:`~segack.spark_adapter.CheckpointError`."""
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{where} is damaged: not JSON ({error})") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise CheckpointError(f"{where} is not a segack checkpoint")
        version = body.get("version")
        if version != VERSION:
            writer = _WRITTEN_BY.get(version) if isinstance(version, int) else None
            origin = f"was written by segack {writer} (format {version})" if writer else (
                f"has format version {version!r}")
            raise CheckpointError(f"{where} {origin}; segack {__version__} reads format {VERSION} only. "
                                  f"Replay into a new checkpoint location; this one is left as it is")
        crc = body.pop("crc32", None)
        if crc != zlib.crc32(_canonical(body)):
            raise CheckpointError(f"{where} is damaged: its checksum does not match")
        settings, encoded = body.get("settings"), body.get("tokens")
        if not isinstance(settings, dict) or not (encoded is None or isinstance(encoded, str)):
            raise CheckpointError(f"{where} is damaged: settings or tokens missing")
        tokens = None
        if encoded is not None:
            bits = settings.get("key_group_bits")
            if not isinstance(bits, int) or isinstance(bits, bool):
                raise CheckpointError(f"{where} is damaged: its key-group resolution is missing")
            try:
                tokens = KeyGroupTokens.from_bytes(base64.b64decode(encoded, validate=True), bits,
                                                   what=f"the tokens of {where}")
            except (ValueError, TokenError) as error:
                raise CheckpointError(str(error) if isinstance(error, TokenError)
                                      else f"{where} is damaged: {error}") from None
        return cls(settings, tokens)


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _checkpoint_entry(name: str) -> bool:
    """Whether a checkpoint may hold a file or directory of this name: its own, one of its writes
    that did not finish (``NAME.<hex>.tmp``), or a hidden file (NFS and desktops make them)."""
    if name.endswith(".tmp"):
        name = name.rsplit(".", 2)[0]
    return (name.startswith(".") or name in (PROGRESS_DIR, DEAD_LETTERS_DIR, CLAIMS_DIR, SEGMENTS_REQUEST,
                                             STREAM_DIR, STREAM_VIEW, SINK_PRODUCERS_DIR,
                                             SINK_POSITIONS_FILE)
            or (name.startswith(STATE_PREFIX) and name.endswith(STATE_SUFFIX)))


def _claim_numbers(files: Files) -> list[int]:
    """The numbers of the claim files present now, ascending."""
    numbers = []
    for path, _ in files.list(files.path(CLAIMS_DIR)):
        name = posixpath.basename(path)
        number = name.removesuffix(".json")
        if number != name and number.isdigit():
            numbers.append(int(number))
    return sorted(numbers)


def _progress_files(files: Files, prefix: str) -> list[str]:
    start = files.path(PROGRESS_DIR, prefix)
    return sorted(path for path, _ in files.list(files.path(PROGRESS_DIR))
                  if path.endswith(PROGRESS_SUFFIX) and path.startswith(start))


def _read_progress(files: Files, paths: list[str]) -> Iterator[tuple[str, pa.Table]]:
    for path in paths:
        data = files.read(path)
        if data is None:
            continue
        try:
            yield path, decode_updates(data, what=f"progress file {path}")
        except TokenError as error:
            raise CheckpointError(str(error)) from None


def _stop_path(files: Files, run_id: str) -> str:
    return files.path(PROGRESS_DIR, f"{run_id}{STOP_SUFFIX}")


class CheckpointStore:
    """A checkpoint directory on local disk or on any filesystem :mod:`pyarrow.fs` opens: what a
    run's coordinator, on the driver, and the ``segack`` command do with it.

    The location is resolved at once (:func:`~segack.spark_adapter.store.storage.resolve_location`),
    so the store means the same directory wherever it is unpickled. Tasks get a :class:`TaskStore`
    (:meth:`for_tasks`).
    """

    def __init__(self, location: str) -> None:
        self.location = resolve_location(location)
        self.files = open_files(self.location)
        #: A real-time stream's progress per Kafka partition.
        self.partitions = PartitionStates(self.files, self.location)
        #: Whether this store's first claim made the location (then a withdrawn claim removes it).
        self._made_location = False

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["location"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"CheckpointStore({self.location!r})"

    @property
    def is_local(self) -> bool:
        """Whether the checkpoint is a path on this machine's file system (or a mount)."""
        return isinstance(self.files, LocalFiles)

    def child_location(self, name: str) -> str:
        """The location of entry ``name`` of the checkpoint, for another writer (Spark's query
        checkpoint, ``stream``)."""
        return f"{self.location.rstrip('/')}/{name}"

    def query_log(self) -> QueryLog:
        """Spark's own checkpoint of the query segack runs here (``stream``), as it reads it."""
        return QueryLog(self.files, self.files.path(STREAM_DIR), self.child_location(STREAM_DIR))

    def for_tasks(self, run_id: str, claim_number: int) -> TaskStore:
        """The view of the tasks of ``run_id``, which holds claim ``claim_number`` and whose driver
        is the calling process."""
        return TaskStore(self.location, run_id, claim_number, DriverProcess.this())

    # ---------------------------------------------------------- the state

    def _state_files(self) -> list[tuple[int, str, int]]:
        """``(claim number, path, size)`` of each state file present now, newest last."""
        found = []
        for path, size in self.files.list(self.files.path()):
            name = posixpath.basename(path)
            number = name.removeprefix(STATE_PREFIX).removesuffix(STATE_SUFFIX)
            if name == f"{STATE_PREFIX}{number}{STATE_SUFFIX}" and number.isdigit():
                found.append((int(number), path, size))
        return sorted(found)

    def state_file(self) -> str | None:
        """The path of the newest state file (the one :meth:`load` reads), ``None`` if there is none."""
        files = self._state_files()
        return files[-1][1] if files else None

    def exists(self) -> bool:
        """Whether a checkpoint has been written here."""
        return self.state_file() is not None

    def load(self) -> Checkpoint | None:
        """The stored checkpoint, ``None`` if there is none; damage is a
        :class:`~segack.spark_adapter.CheckpointError`.

        That is the newest state file: the one written under the highest claim number, so a run
        fenced by a newer claim cannot bring back its older state by saving late.
        """
        for _ in range(10):
            path = self.state_file()
            if path is None:
                self._check_new_location()
                return None
            data = self.files.read(path)
            if data is not None:
                return Checkpoint.from_bytes(data, where=f"checkpoint {self.location}")
            # Pruned after a newer one was written: look again.
        raise CheckpointError(f"checkpoint {self.location}: its state files keep changing under the reader")

    def load_existing(self) -> Checkpoint:
        """The stored checkpoint, for a command that needs one:
        :class:`~segack.spark_adapter.CheckpointLocationError` where there is none."""
        state = self.load()
        if state is None:
            raise CheckpointLocationError(f"no checkpoint at {self.location}")
        return state

    def _check_new_location(self) -> None:
        """Refuse (:class:`~segack.spark_adapter.CheckpointLocationError`) a location without a
        state file that a run could not make a checkpoint of: a file, or a directory holding other
        files than a checkpoint's (the input's directory given by mistake, say)."""
        names = self.files.entries(self.files.path())
        if names is None:
            raise CheckpointLocationError(f"{self.location} is a file, not a checkpoint's directory")
        others = sorted(name for name in names if not _checkpoint_entry(name))
        if others:
            more = f" and {len(others) - 1:,} more" if len(others) > 1 else ""
            raise CheckpointLocationError(
                f"{self.location} is not a checkpoint: it holds {others[0]!r}{more}, which no checkpoint "
                f"holds (a new checkpoint needs a new or empty directory)")

    def save(self, checkpoint: Checkpoint, claim_number: int | None = None) -> None:
        """Write ``checkpoint`` atomically and durably, as the state of claim ``claim_number``
        (``None``: in place of the newest state file, for tools that edit a checkpoint no run
        holds); older claims' states go."""
        if claim_number is None:
            files = self._state_files()
            claim_number = files[-1][0] if files else 0
        with durable_write("state"):
            self.files.write(self.files.path(f"{STATE_PREFIX}{claim_number:012d}{STATE_SUFFIX}"),
                             checkpoint.to_bytes())
            for number, older, _ in self._state_files():
                if number < claim_number:
                    self.files.delete(older)

    def size_bytes(self) -> int:
        """Bytes the checkpoint takes now: its state file and the progress files."""
        files = self._state_files()
        progress = self.files.list(self.files.path(PROGRESS_DIR))
        return (files[-1][2] if files else 0) + sum(size for _, size in progress)

    # ------------------------------------------------------- dead letters

    def dead_letter_files(self, prefix: str = "") -> list[str]:
        """The dead-letter files present now whose names start with ``prefix``, sorted."""
        return dead_letter_paths(self.files, prefix)

    def read_dead_letter_file(self, path: str, columns: list[str] | None = None) -> pa.Table | None:
        """One dead-letter file (only ``columns``, if given); ``None`` if it has gone. A file
        that is not Parquet, or lacks a column, is a :class:`~segack.spark_adapter.CheckpointError`."""
        table: pa.Table | None = read_dead_letter_file(self.files, path, columns, schema_only=False)
        return table

    def dead_letter_schema(self, path: str) -> pa.Schema | None:
        """The schema of one dead-letter file, read from its footer; ``None`` if it has gone."""
        schema: pa.Schema | None = read_dead_letter_file(self.files, path, None, schema_only=True)
        return schema

    def read_dead_letters(self, columns: list[str] | None = None) -> pa.Table | None:
        """Every dead letter recorded, one row per event (an event written again, by a retried
        task attempt or an interrupted retry, counts once), or ``None`` when there are none.
        ``columns``: read only these (and the event's key group and position, which tell the
        events apart), not the events' other columns."""
        wanted = None if columns is None else list(dict.fromkeys([*columns, DEAD_KEY_GROUP, DEAD_POSITION]))
        tables = [table for table in (self.read_dead_letter_file(path, wanted)
                                      for path in self.dead_letter_files()) if table is not None]
        if not tables:
            return None
        letters = pa.concat_tables(tables, promote_options="permissive")
        places = letters.select([DEAD_KEY_GROUP, DEAD_POSITION]).to_pylist()
        first = {tuple(place.values()): row for row, place in reversed(list(enumerate(places)))}
        return letters.take(sorted(first.values()))

    def count_dead_letters(self) -> int:
        """How many events the dead letters hold, each once (as :meth:`read_dead_letters` rows),
        read from two columns of each file."""
        columns = [DEAD_KEY_GROUP, DEAD_POSITION]
        places = [table for table in (self.read_dead_letter_file(path, columns=columns)
                                      for path in self.dead_letter_files()) if table is not None]
        if not places:
            return 0
        distinct = pa.concat_tables(places).group_by([DEAD_KEY_GROUP, DEAD_POSITION]).aggregate([])
        return int(distinct.num_rows)

    def dead_letter_keys(self, key: str) -> frozenset[Any]:
        """The keys that have dead letters (their later events wait behind them)."""
        return dead_letter_keys_of(self.files, key)

    def delete_dead_letters(self, paths: list[str]) -> None:
        """Remove dead-letter files whose events are handled, or recorded again elsewhere."""
        with durable_write("dead-letters-delete"):
            for path in paths:
                self.files.delete(path)

    # ------------------------------------------------------------- claims

    @property
    def claims_are_atomic(self) -> bool:
        """Whether two runs claiming at once cannot both win: true on local disks (and NFS), object
        stores (conditional writes) and HDFS, whose rename refuses to replace a file; elsewhere a
        claim is made by looking first."""
        return self.files.exclusive_create

    def claim_numbers(self) -> list[int]:
        """The numbers of the claim files present now, ascending."""
        return _claim_numbers(self.files)

    def _claim_path(self, number: int) -> str:
        return self.files.path(CLAIMS_DIR, f"{number:012d}.json")

    def read_claim_file(self, number: int) -> bytes | None:
        """The bytes of claim ``number``, or ``None`` if it has gone."""
        return self.files.read(self._claim_path(number))

    def create_claim_file(self, number: int, data: bytes) -> bool:
        """Create claim ``number`` unless it exists: ``False`` if it did (another run won)."""
        self._made_location = self._made_location or not self.files.exists(self.files.path())
        with durable_write("claim"):
            return self.files.create(self._claim_path(number), data)

    def write_claim_file(self, number: int, data: bytes) -> None:
        """Rewrite claim ``number`` (its owner extends or releases it)."""
        with durable_write("claim"):
            self.files.write(self._claim_path(number), data)

    def delete_claim_files(self, numbers: list[int]) -> None:
        with durable_write("claim-delete"):
            for number in numbers:
                self.files.delete(self._claim_path(number))

    def withdraw_claim(self, number: int) -> None:
        """Delete claim ``number`` of a run that saved nothing, and the directories it made: a run
        refused on a new location leaves nothing behind, and on an existing one, what was there."""
        self.delete_claim_files([number])
        with durable_write("claim-delete"):
            self.files.remove_empty_directory(self.files.path(CLAIMS_DIR))
            if self._made_location:
                self.files.remove_empty_directory(self.files.path())

    # ---------------------------------------------------- segment requests

    def read_segments_request(self) -> bytes | None:
        """The pending change of segments, or ``None``."""
        return self.files.read(self.files.path(SEGMENTS_REQUEST))

    def write_segments_request(self, data: bytes) -> None:
        """Record, atomically, a change of segments for the run that holds the checkpoint."""
        with durable_write("segments-request"):
            self.files.write(self.files.path(SEGMENTS_REQUEST), data)

    def delete_segments_request(self) -> None:
        """Remove the pending change of segments, once applied."""
        with durable_write("segments-request"):
            self.files.delete(self.files.path(SEGMENTS_REQUEST))

    # ------------------------------------------------------- task progress

    def progress_files(self, prefix: str = "") -> list[str]:
        """The progress files present now whose names start with ``prefix``, sorted."""
        return _progress_files(self.files, prefix)

    def read_progress(self, paths: list[str]) -> Iterator[tuple[str, pa.Table]]:
        """Each readable progress file's updates; a damaged one is a
        :class:`~segack.spark_adapter.CheckpointError`."""
        return _read_progress(self.files, paths)

    @staticmethod
    def task_load(updates: pa.Table) -> TaskLoad:
        """The load a progress file reported (0 for a count it did not report, or not as one)."""
        metadata = updates.schema.metadata or {}
        counts = {}
        for field_name, name in _LOAD_METADATA.items():
            text = metadata.get(name, b"0")
            counts[field_name] = int(text) if text.isdigit() and len(text) < 19 else 0
        return TaskLoad(**counts)

    def delete_progress(self, paths: list[str]) -> None:
        """Remove progress files already merged into a durable checkpoint."""
        with durable_write("progress-delete"):
            for path in paths:
                self.files.delete(path)

    # ------------------------------------------------------------ stopping

    def request_stop(self, run_id: str, reason: str) -> None:
        """Ask the tasks of ``run_id`` to stop at their next flush."""
        with durable_write("stop-request"):
            self.files.write(_stop_path(self.files, run_id), reason.encode("utf-8"))

    def stop_reason(self, run_id: str) -> str | None:
        """Why the tasks of ``run_id`` were asked to stop, ``None`` if they were not."""
        data = self.files.read(_stop_path(self.files, run_id))
        return None if data is None else data.decode("utf-8", errors="replace")

    def clear_stop(self, run_id: str) -> None:
        """Remove the stop request of a run that has ended."""
        with durable_write("stop-clear"):
            self.files.delete(_stop_path(self.files, run_id))


class TaskStore:
    """What the tasks of run ``run_id`` may do with its checkpoint (the worker view): write their
    progress and dead letters, read what earlier attempts of their segment recorded, and look for
    a stop request and for a claim newer than theirs, ``claim_number``.

    It pickles as its location, run, claim and ``driver`` (the run's driver process, which tasks
    on its machine watch: :mod:`~segack.spark_adapter.store.driver_watch`): a task carries nothing else
    of the checkpoint.
    """

    def __init__(self, location: str, run_id: str, claim_number: int,
                 driver: DriverProcess | None = None) -> None:
        self.location, self.run_id, self.claim_number = location, run_id, claim_number
        self.driver = driver
        self.files = open_files(location)
        #: A real-time stream's progress per Kafka partition.
        self.partitions = PartitionStates(self.files, location)

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "run_id": self.run_id, "claim_number": self.claim_number,
                "driver": self.driver}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"TaskStore({self.location!r}, {self.run_id!r}, {self.claim_number})"

    @property
    def cheap_looks(self) -> bool:
        """Whether a look for a stop request costs no request: then tasks look between flushes."""
        return self.files.cheap_looks

    def progress_name(self, segment: int, attempt: int) -> str:
        """The progress file name of one task attempt."""
        return f"{self.run_id}-s{segment:05d}-a{attempt}"

    def write_progress(self, name: str, updates: pa.Table, load: TaskLoad = TaskLoad()) -> None:
        """Record, atomically, what one task attempt has finished so far (its update table), and
        its load (for the progress line and the metrics)."""
        metadata = {name: str(getattr(load, field_name)).encode("ascii")
                    for field_name, name in _LOAD_METADATA.items()}
        data = encode_updates(updates.replace_schema_metadata(metadata))
        with durable_write("progress"):
            self.files.write(self.files.path(PROGRESS_DIR, f"{name}{PROGRESS_SUFFIX}"), data)

    def earlier_attempts(self, segment: int) -> Iterator[pa.Table]:
        """The updates that earlier attempts of ``segment`` in this run recorded."""
        prefix = f"{self.run_id}-s{segment:05d}-a"
        for _, updates in _read_progress(self.files, _progress_files(self.files, prefix)):
            yield updates

    def write_dead_letters(self, name: str, letters: pa.Table) -> None:
        """Record, atomically, dead letters of one task attempt as a new Parquet file ``name``."""
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(letters, sink)
        data = sink.getvalue().to_pybytes()
        with durable_write("dead-letters"):
            self.files.write(self.files.path(DEAD_LETTERS_DIR, f"{name}.parquet"), data)

    def dead_letter_keys(self, key: str) -> frozenset[Any]:
        """The keys that have dead letters now: a retried attempt's (its run may have set some
        aside since its start)."""
        return dead_letter_keys_of(self.files, key)

    def dead_letter_places(self, key: str) -> frozenset[tuple[int, Any]]:
        """``(key group, key)`` of each key that has dead letters now, as :meth:`dead_letter_keys`
        reads them."""
        return dead_letter_places_of(self.files, key, DEAD_KEY_GROUP)

    def read_dead_letter_file(self, path: str) -> pa.Table | None:
        """One dead-letter file, to handle its events again; ``None`` if it has gone."""
        table: pa.Table | None = read_dead_letter_file(self.files, path, None, schema_only=False)
        return table

    def stop_requested(self) -> bool:
        """Whether someone asked the run's tasks to stop."""
        return self.files.exists(_stop_path(self.files, self.run_id))

    def request_stop(self, reason: str) -> None:
        """Ask the run's other tasks to stop at their next flush."""
        with durable_write("stop-request"):
            self.files.write(_stop_path(self.files, self.run_id), reason.encode("utf-8"))

    def fenced(self) -> bool:
        """Whether a newer claim than the run's exists: another run took the checkpoint over, and
        nothing these tasks write counts any more. A lower number means the tasks cannot see the
        claims (an in-process store), and stopping them would help no one."""
        numbers = _claim_numbers(self.files)
        return bool(numbers) and numbers[-1] > self.claim_number
