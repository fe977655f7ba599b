"""Durable checkpoints: an acker snapshot plus the settings of the run that wrote it.

A checkpoint is a directory (a local path or any URI :mod:`pyarrow.fs` understands)::

    CHECKPOINT/checkpoint.json      the committed state, rewritten atomically
    CHECKPOINT/progress/*.sgak      what running tasks finished since the last merge

``checkpoint.json`` is one JSON object: ``format``, ``version``, ``settings`` (the
run's input, key, order, hash, segments, totals, flush policy), ``acker`` (the
:class:`~segack.OffsetAcker` snapshot, base64) and ``crc32`` of the canonical JSON
of everything else. Progress files are plain acker snapshots, written by the
Spark tasks; the driver merges them into the checkpoint (a union, so merging one
twice is harmless) and deletes them once the merged checkpoint is durable.

Every write is atomic: a temporary file in the same directory, flushed and
fsynced, then renamed over the target (and the directory fsynced) on local disk;
on other filesystems a temporary object moved into place. A reader therefore sees
the old file or the new one, never a torn one. A damaged checkpoint is refused
with :class:`CheckpointError` and never overwritten.
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

from segack.kernel import OffsetAcker

__all__ = ["Checkpoint", "CheckpointError", "CheckpointStore"]

FORMAT = "segack-checkpoint"
VERSION = 1
STATE_FILE = "checkpoint.json"
PROGRESS_DIR = "progress"


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted: damaged, foreign, or from another input."""


@dataclass
class Checkpoint:
    """The committed state of a replay: which events are done, and how the run was set up."""

    acker: OffsetAcker = field(default_factory=OffsetAcker)
    settings: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        body = {
            "format": FORMAT,
            "version": VERSION,
            "settings": self.settings,
            "acker": base64.b64encode(self.acker.snapshot()).decode("ascii"),
        }
        body["crc32"] = zlib.crc32(_canonical(body))
        return json.dumps(body, indent=1, sort_keys=True).encode("utf-8") + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "checkpoint") -> Checkpoint:
        """Parse a checkpoint; anything damaged or foreign is a :class:`CheckpointError`."""
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{where} is damaged: not JSON ({error})") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise CheckpointError(f"{where} is not a segack checkpoint")
        if body.get("version") != VERSION:
            raise CheckpointError(f"{where} has format version {body.get('version')!r}; "
                                  f"this segack reads version {VERSION}")
        crc = body.pop("crc32", None)
        if crc != zlib.crc32(_canonical(body)):
            raise CheckpointError(f"{where} is damaged: its checksum does not match")
        if not isinstance(body.get("settings"), dict) or not isinstance(body.get("acker"), str):
            raise CheckpointError(f"{where} is damaged: settings or acker missing")
        try:
            acker = OffsetAcker.restore(base64.b64decode(body["acker"], validate=True))
        except ValueError as error:
            raise CheckpointError(f"{where} is damaged: {error}") from None
        return cls(acker, body["settings"])


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


class CheckpointStore:
    """A checkpoint directory on local disk or on any filesystem :mod:`pyarrow.fs` opens.

    Picklable: Spark tasks carry it to write their progress files.
    """

    def __init__(self, location: str) -> None:
        if not location:
            raise ValueError("a checkpoint location is required")
        self.location = location
        self._local = "://" not in location or location.startswith("file://")
        if self._local:
            self.root = os.path.abspath(location.removeprefix("file://"))
        else:
            from pyarrow import fs

            filesystem, self.root = fs.FileSystem.from_uri(location)
            self._filesystem = filesystem

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
        if self._local:
            os.makedirs(path, exist_ok=True)
        else:
            self._filesystem.create_dir(path, recursive=True)

    def _read(self, path: str) -> bytes | None:
        if self._local:
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

    def write_atomic(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data`` so that a reader sees the old bytes or the new ones."""
        directory = path.rsplit("/", 1)[0]
        self._makedirs(directory)
        temporary = f"{path}.{uuid.uuid4().hex}.tmp"
        if self._local:
            with open(temporary, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
            descriptor = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        else:
            with self._filesystem.open_output_stream(temporary) as stream:
                stream.write(data)
            self._filesystem.move(temporary, path)

    def _delete(self, path: str) -> None:
        if self._local:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        else:
            self._filesystem.delete_file(path)

    # ---------------------------------------------------------- the state

    def exists(self) -> bool:
        """Whether a checkpoint has been written here."""
        return self._read(self._path(STATE_FILE)) is not None

    def load(self) -> Checkpoint | None:
        """The stored checkpoint, ``None`` if there is none; damage is a :class:`CheckpointError`."""
        data = self._read(self._path(STATE_FILE))
        if data is None:
            return None
        return Checkpoint.from_bytes(data, where=f"checkpoint {self.location}")

    def save(self, checkpoint: Checkpoint) -> None:
        """Write ``checkpoint`` atomically and durably."""
        self.write_atomic(self._path(STATE_FILE), checkpoint.to_bytes())

    # ------------------------------------------------------- task progress

    def write_progress(self, name: str, acker: OffsetAcker) -> None:
        """Record, atomically, what one task attempt has finished so far."""
        self.write_atomic(self._path(PROGRESS_DIR, f"{name}.sgak"), acker.snapshot())

    def progress_files(self) -> list[str]:
        """The progress files present now, sorted."""
        directory = self._path(PROGRESS_DIR)
        if self._local:
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                return []
            return sorted(self._path(PROGRESS_DIR, name) for name in names if name.endswith(".sgak"))
        from pyarrow import fs

        infos = self._filesystem.get_file_info(fs.FileSelector(directory, allow_not_found=True))
        return sorted(info.path for info in infos if info.path.endswith(".sgak"))

    def read_progress(self, paths: list[str]) -> Iterator[tuple[str, OffsetAcker]]:
        """Each readable progress file's acker; a damaged one is a :class:`CheckpointError`."""
        for path in paths:
            data = self._read(path)
            if data is None:
                continue
            try:
                yield path, OffsetAcker.restore(data)
            except ValueError as error:
                raise CheckpointError(f"progress file {path} is damaged: {error}") from None

    def delete_progress(self, paths: list[str]) -> None:
        """Remove progress files already merged into a durable checkpoint."""
        for path in paths:
            self._delete(path)
