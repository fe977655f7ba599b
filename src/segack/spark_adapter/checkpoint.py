"""Durable checkpoints: per-key-group tokens plus the settings of the run that wrote them.

A checkpoint is a directory, a local path or any URI :mod:`pyarrow.fs` opens
(``hdfs://``, ``s3://``, ``gs://``, ``file://`` ...)::

    CHECKPOINT/checkpoint-N.json         the committed state, rewritten atomically (N: the claim)
    CHECKPOINT/progress/RUN-sN-aN.sgku   what each running task has finished (its updates)
    CHECKPOINT/progress/RUN.stop         asks the run's tasks to stop at their next flush
    CHECKPOINT/claims/N.json             who runs on the checkpoint (:mod:`~segack.spark_adapter.claims`)
    CHECKPOINT/dead-letters/*.parquet    events set aside (:mod:`~segack.spark_adapter.dead_letters`)
    CHECKPOINT/segments-request.json     segments asked of the live run (:mod:`~segack.spark_adapter.rescale`)

The state file is named after the claim number of the run that wrote it
(:mod:`~segack.spark_adapter.claims`); the newest is the checkpoint, and older ones are deleted
once it is written, so a run fenced by a newer claim cannot bring its state back by saving late.
It is one JSON object: ``format``, ``version``, ``segack`` (the
version that wrote it), ``settings`` (the input's key, order, hash, column types,
key-group resolution, segments, flush policy, status), ``tokens`` (the
:class:`~segack.spark_adapter.tokens.KeyGroupTokens`, sealed and base64) and
``crc32`` of the canonical JSON of everything else. Its size depends on the
number of key groups, never on the number of events.

Every write is atomic: a temporary file in the same directory, flushed and
fsynced, then renamed over the target (and the directory fsynced) on local
disk; elsewhere a temporary object moved into place. A reader sees the old
file or the new one, never a torn one. A damaged checkpoint is refused with
:class:`CheckpointError` and never overwritten.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from segack._version import __version__
from segack.errors import SegackValueError
from segack.spark_adapter.tokens import KeyGroupTokens, TokenError, decode_updates, encode_updates

__all__ = ["Checkpoint", "CheckpointError", "CheckpointStore", "resolve_location"]

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
#: Where tasks write the events they did not handle (``on_error="dead-letter"``), as Parquet:
#: the event's columns and these.
DEAD_LETTERS_DIR = "dead-letters"
#: Where runs claim the checkpoint (:mod:`segack.spark_adapter.claims`).
CLAIMS_DIR = "claims"
#: A change of segments asked of the run that holds the checkpoint (:mod:`segack.spark_adapter.rescale`).
SEGMENTS_REQUEST = "segments-request.json"
DEAD_ERROR = "__segack_error"
DEAD_ATTEMPTS = "__segack_attempts"
DEAD_KEY_GROUP = "__segack_key_group"
DEAD_POSITION = "__segack_position"
# A progress file's schema metadata: its task's calls in flight and rows pending, as decimal text.
_IN_FLIGHT = b"segack.in_flight"
_PENDING = b"segack.pending"


class CheckpointError(SegackValueError):
    """A checkpoint that cannot be trusted: damaged, foreign, from another input or another version."""


def resolve_location(location: str) -> str:
    """``location`` in a form every machine reads the same way.

    A URI with a scheme (``s3://bucket/x``) is kept; ``file://`` is dropped; a
    relative local path becomes absolute, against the current directory of the
    process that calls this (the driver), before anything is sent to executors.
    """
    if not isinstance(location, str) or not location:
        raise SegackValueError("a checkpoint location is required")
    if location.startswith("file://"):
        location = location.removeprefix("file://")
    elif "://" in location:
        return location
    return os.path.abspath(os.path.expanduser(location))


@dataclass
class Checkpoint:
    """The committed state of a replay: its settings and, once it has counted its input, its tokens."""

    settings: dict[str, Any] = field(default_factory=dict)
    tokens: KeyGroupTokens | None = None

    def to_bytes(self) -> bytes:
        tokens = None if self.tokens is None else base64.b64encode(self.tokens.to_bytes()).decode("ascii")
        body = {"format": FORMAT, "version": VERSION, "segack": __version__, "settings": self.settings,
                "tokens": tokens}
        body["crc32"] = zlib.crc32(_canonical(body))
        return json.dumps(body, indent=1, sort_keys=True).encode("utf-8") + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "checkpoint") -> Checkpoint:
        """Parse a checkpoint; a damaged, foreign or other-version one is a :class:`CheckpointError`."""
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


class CheckpointStore:
    """A checkpoint directory on local disk or on any filesystem :mod:`pyarrow.fs` opens.

    The location is resolved at once (:func:`resolve_location`), so the store
    means the same directory wherever it is unpickled. Spark tasks carry it to
    write their progress files.
    """

    def __init__(self, location: str) -> None:
        self.location = resolve_location(location)
        self.is_local = "://" not in self.location
        if self.is_local:
            self.root = self.location
        else:
            from pyarrow import fs

            self._filesystem, self.root = fs.FileSystem.from_uri(self.location)

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["location"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"CheckpointStore({self.location!r})"

    # -------------------------------------------------------------- paths

    def _path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def _makedirs(self, path: str) -> None:
        if self.is_local:
            os.makedirs(path, exist_ok=True)
        else:
            self._filesystem.create_dir(path, recursive=True)

    def _read(self, path: str) -> bytes | None:
        if self.is_local:
            try:
                with open(path, "rb") as handle:
                    return handle.read()
            except FileNotFoundError:
                return None
        from pyarrow import fs

        if self._filesystem.get_file_info(path).type == fs.FileType.NotFound:
            return None
        with self._filesystem.open_input_stream(path) as stream:
            return bytes(stream.read())

    def _exists(self, path: str) -> bool:
        if self.is_local:
            return os.path.exists(path)
        from pyarrow import fs

        return bool(self._filesystem.get_file_info(path).type != fs.FileType.NotFound)

    def _write_temporary(self, path: str, data: bytes) -> str:
        """Write ``data`` durably to a new temporary file beside ``path``; returns its path."""
        self._makedirs(path.rsplit("/", 1)[0])
        temporary = f"{path}.{uuid.uuid4().hex}.tmp"
        if self.is_local:
            with open(temporary, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        else:
            with self._filesystem.open_output_stream(temporary) as stream:
                stream.write(data)
        return temporary

    @staticmethod
    def _fsync_directory(directory: str) -> None:
        """Make a rename or link in a local ``directory`` durable."""
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def write_atomic(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data`` so that a reader sees the old bytes or the new ones."""
        temporary = self._write_temporary(path, data)
        if self.is_local:
            os.replace(temporary, path)
            self._fsync_directory(path.rsplit("/", 1)[0])
        else:
            self._filesystem.move(temporary, path)

    def _delete(self, path: str) -> None:
        if self.is_local:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        else:
            from pyarrow import fs

            if self._filesystem.get_file_info(path).type != fs.FileType.NotFound:
                self._filesystem.delete_file(path)

    def _list(self, directory: str) -> list[tuple[str, int]]:
        """``(path, size)`` of each file in ``directory`` (none if it does not exist)."""
        if self.is_local:
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                return []
            found = []
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    found.append((f"{directory}/{name}", os.stat(f"{directory}/{name}").st_size))
            return found
        from pyarrow import fs

        infos = self._filesystem.get_file_info(fs.FileSelector(directory, allow_not_found=True))
        return [(info.path, int(info.size or 0)) for info in infos if info.type == fs.FileType.File]

    # ---------------------------------------------------------- the state

    def _state_files(self) -> list[tuple[int, str, int]]:
        """``(claim number, path, size)`` of each state file present now, newest last."""
        found = []
        for path, size in self._list(self.root.rstrip("/")):
            name = path.rsplit("/", 1)[-1]
            if name.startswith(STATE_PREFIX) and name.endswith(STATE_SUFFIX):
                number = name[len(STATE_PREFIX):-len(STATE_SUFFIX)]
                if number.isdigit():
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
        """The stored checkpoint, ``None`` if there is none; damage is a :class:`CheckpointError`.

        That is the newest state file: the one written under the highest claim number, so a run
        fenced by a newer claim cannot bring back its older state by saving late.
        """
        for _ in range(10):
            path = self.state_file()
            if path is None:
                return None
            data = self._read(path)
            if data is not None:
                return Checkpoint.from_bytes(data, where=f"checkpoint {self.location}")
            # Pruned after a newer one was written: look again.
        raise CheckpointError(f"checkpoint {self.location}: its state files keep changing under the reader")

    def save(self, checkpoint: Checkpoint, claim_number: int | None = None) -> None:
        """Write ``checkpoint`` atomically and durably, as the state of claim ``claim_number``
        (``None``: in place of the newest state file, for tools that edit a checkpoint no run
        holds); older claims' states go."""
        if claim_number is None:
            files = self._state_files()
            claim_number = files[-1][0] if files else 0
        path = self._path(f"{STATE_PREFIX}{claim_number:012d}{STATE_SUFFIX}")
        self.write_atomic(path, checkpoint.to_bytes())
        for number, older, _ in self._state_files():
            if number < claim_number:
                self._delete(older)

    def size_bytes(self) -> int:
        """Bytes the checkpoint takes now: its state file and the progress files."""
        files = self._state_files()
        return (files[-1][2] if files else 0) + sum(size for _, size in self._list(self._path(PROGRESS_DIR)))

    # ------------------------------------------------------- dead letters

    def write_dead_letters(self, name: str, letters: pa.Table) -> None:
        """Record, atomically, dead letters of one task attempt as a new Parquet file ``name``."""
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(letters, sink)
        self._makedirs(self._path(DEAD_LETTERS_DIR))
        self.write_atomic(self._path(DEAD_LETTERS_DIR, f"{name}.parquet"), sink.getvalue().to_pybytes())

    def dead_letter_files(self, prefix: str = "") -> list[str]:
        """The dead-letter files present now whose names start with ``prefix``, sorted."""
        start = self._path(DEAD_LETTERS_DIR, prefix)
        return sorted(path for path, _ in self._list(self._path(DEAD_LETTERS_DIR))
                      if path.endswith(".parquet") and path.startswith(start))

    def _dead_letter_file(self, path: str, columns: list[str] | None, schema_only: bool) -> Any:
        import pyarrow.parquet as pq

        try:
            source = path if self.is_local else self._filesystem.open_input_file(path)
            if schema_only:
                return pq.read_schema(source)
            return pq.read_table(source, columns=columns)
        except FileNotFoundError:
            return None
        except (pa.ArrowException, KeyError) as error:
            raise CheckpointError(f"dead-letter file {path} cannot be read: {error}") from None

    def read_dead_letter_file(self, path: str, columns: list[str] | None = None) -> pa.Table | None:
        """One dead-letter file (only ``columns``, if given); ``None`` if it has gone. A file
        that is not Parquet, or lacks a column, is a :class:`CheckpointError`."""
        table: pa.Table | None = self._dead_letter_file(path, columns, schema_only=False)
        return table

    def dead_letter_schema(self, path: str) -> pa.Schema | None:
        """The schema of one dead-letter file, read from its footer; ``None`` if it has gone."""
        schema: pa.Schema | None = self._dead_letter_file(path, None, schema_only=True)
        return schema

    def read_dead_letters(self) -> pa.Table | None:
        """Every dead letter recorded, one row per event (an event written again, by a retried
        task attempt or an interrupted retry, counts once), or ``None`` when there are none."""
        tables = [table for table in map(self.read_dead_letter_file, self.dead_letter_files())
                  if table is not None]
        if not tables:
            return None
        letters = pa.concat_tables(tables, promote_options="permissive")
        places = list(zip(letters.column(DEAD_KEY_GROUP).to_pylist(),
                          letters.column(DEAD_POSITION).to_pylist(), strict=True))
        first = {place: row for row, place in reversed(list(enumerate(places)))}
        return letters.take(sorted(first.values()))

    def dead_letter_keys(self, key: str) -> frozenset[Any]:
        """The keys that have dead letters (their later events wait behind them)."""
        keys: set[Any] = set()
        for path in self.dead_letter_files():
            table = self.read_dead_letter_file(path, columns=[key])
            if table is not None:
                keys.update(table.column(key).to_pylist())
        return frozenset(keys)

    def delete_dead_letters(self, paths: list[str]) -> None:
        """Remove dead-letter files whose events are handled, or recorded again elsewhere."""
        for path in paths:
            self._delete(path)

    # ------------------------------------------------------------- claims

    @property
    def claims_are_atomic(self) -> bool:
        """Whether two runs claiming at once cannot both win: true on local disks (and NFS) and
        HDFS, whose rename refuses to replace a file; elsewhere a claim is made by looking first."""
        return self.is_local or self._filesystem.type_name == "hdfs"

    def claim_numbers(self) -> list[int]:
        """The numbers of the claim files present now, ascending."""
        numbers = []
        for path, _ in self._list(self._path(CLAIMS_DIR)):
            name = path.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                numbers.append(int(name[:-5]))
        return sorted(numbers)

    def _claim_path(self, number: int) -> str:
        return self._path(CLAIMS_DIR, f"{number:012d}.json")

    def read_claim_file(self, number: int) -> bytes | None:
        """The bytes of claim ``number``, or ``None`` if it has gone."""
        return self._read(self._claim_path(number))

    def create_claim_file(self, number: int, data: bytes) -> bool:
        """Create claim ``number`` unless it exists: ``False`` if it did (another run won)."""
        path = self._claim_path(number)
        if not self.is_local and self._exists(path):
            return False
        temporary = self._write_temporary(path, data)
        if self.is_local:
            try:
                os.link(temporary, path)  # fails if the path exists, also on NFS
            except FileExistsError:
                return False
            finally:
                os.remove(temporary)
            self._fsync_directory(self._path(CLAIMS_DIR))
            return True
        try:
            self._filesystem.move(temporary, path)  # HDFS refuses to replace; others replace
        except OSError:
            self._delete(temporary)
            if self._exists(path):
                return False
            raise
        return True

    def write_claim_file(self, number: int, data: bytes) -> None:
        """Rewrite claim ``number`` (its owner extends or releases it)."""
        self.write_atomic(self._claim_path(number), data)

    def delete_claim_files(self, numbers: list[int]) -> None:
        for number in numbers:
            self._delete(self._claim_path(number))

    # ---------------------------------------------------- segment requests

    def read_segments_request(self) -> bytes | None:
        """The pending change of segments, or ``None``."""
        return self._read(self._path(SEGMENTS_REQUEST))

    def write_segments_request(self, data: bytes) -> None:
        """Record, atomically, a change of segments for the run that holds the checkpoint."""
        self.write_atomic(self._path(SEGMENTS_REQUEST), data)

    def delete_segments_request(self) -> None:
        """Remove the pending change of segments, once applied."""
        self._delete(self._path(SEGMENTS_REQUEST))

    # ------------------------------------------------------- task progress

    @staticmethod
    def progress_name(run_id: str, segment: int, attempt: int) -> str:
        """The progress file name of one task attempt."""
        return f"{run_id}-s{segment:05d}-a{attempt}"

    def write_progress(self, name: str, updates: pa.Table, in_flight: int = 0, pending: int = 0) -> None:
        """Record, atomically, what one task attempt has finished so far (its update table), and
        how many of its calls run now and rows wait uncommitted (for the progress line)."""
        load = {_IN_FLIGHT: str(in_flight).encode("ascii"), _PENDING: str(pending).encode("ascii")}
        self.write_atomic(self._path(PROGRESS_DIR, f"{name}{PROGRESS_SUFFIX}"),
                          encode_updates(updates.replace_schema_metadata(load)))

    def progress_files(self, prefix: str = "") -> list[str]:
        """The progress files present now whose names start with ``prefix``, sorted."""
        start = self._path(PROGRESS_DIR, prefix)
        return sorted(path for path, _ in self._list(self._path(PROGRESS_DIR))
                      if path.endswith(PROGRESS_SUFFIX) and path.startswith(start))

    def read_progress(self, paths: list[str]) -> Iterator[tuple[str, pa.Table]]:
        """Each readable progress file's updates; a damaged one is a :class:`CheckpointError`."""
        for path in paths:
            data = self._read(path)
            if data is None:
                continue
            try:
                yield path, decode_updates(data, what=f"progress file {path}")
            except TokenError as error:
                raise CheckpointError(str(error)) from None

    @staticmethod
    def task_load(updates: pa.Table) -> tuple[int, int]:
        """The calls in flight and rows pending a progress file reported (0, 0 if it did not)."""
        metadata = updates.schema.metadata or {}
        counts = []
        for name in (_IN_FLIGHT, _PENDING):
            text = metadata.get(name, b"0")
            counts.append(int(text) if text.isdigit() and len(text) < 19 else 0)
        return counts[0], counts[1]

    def delete_progress(self, paths: list[str]) -> None:
        """Remove progress files already merged into a durable checkpoint."""
        for path in paths:
            self._delete(path)

    # ------------------------------------------------------------ stopping

    def request_stop(self, run_id: str, reason: str) -> None:
        """Ask the tasks of ``run_id`` to stop at their next flush."""
        self.write_atomic(self._path(PROGRESS_DIR, f"{run_id}{STOP_SUFFIX}"), reason.encode("utf-8"))

    def stop_requested(self, run_id: str) -> bool:
        """Whether someone asked the tasks of ``run_id`` to stop."""
        return self._exists(self._path(PROGRESS_DIR, f"{run_id}{STOP_SUFFIX}"))

    def clear_stop(self, run_id: str) -> None:
        """Remove the stop request of a run that has ended."""
        self._delete(self._path(PROGRESS_DIR, f"{run_id}{STOP_SUFFIX}"))
