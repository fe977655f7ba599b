"""Where a checkpoint's files live: a local (or mounted) directory, or any :mod:`pyarrow.fs` file
system (``hdfs://``, ``s3://``, ``gs://``, ...).

A checkpoint needs a handful of operations on small files. :class:`Files` names them and what each
promises; :class:`LocalFiles` and :class:`ArrowFiles` keep the promises, each its own way.
:func:`open_files` picks one for a location. A new backend (an object store's own client, say) is
one more subclass, and a line in :func:`open_files`.

- **Atomic writes.** :meth:`Files.write` replaces a file so that a reader sees the old bytes or the
  new ones, never a torn file: on local disk a temporary file in the same directory, flushed and
  fsynced, renamed over the target, and the directory fsynced; elsewhere a temporary object moved
  into place.
- **Exclusive creates.** :meth:`Files.create` creates a file unless it exists; where the backend
  can (:attr:`Files.exclusive_create`), of two callers at once exactly one wins: a hard link on
  local disks and NFS, a rename that refuses to replace on HDFS. Elsewhere it looks first.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from abc import ABC, abstractmethod
from typing import Any

__all__ = ["ArrowFiles", "Files", "LocalFiles", "open_files"]


class Files(ABC):
    """A directory tree of small files under :attr:`root`, as a checkpoint uses it."""

    #: The directory, in the backend's own terms.
    root: str
    #: Whether looking at a file's metadata costs no request (a local or mounted disk): tasks then
    #: look for a stop request between their flushes too.
    cheap_looks: bool = False
    #: Whether :meth:`create` is atomic: of two callers creating one file at once, one wins.
    exclusive_create: bool = False

    def path(self, *parts: str) -> str:
        """The path of ``parts`` under the root."""
        return "/".join([self.root.rstrip("/"), *parts])

    @abstractmethod
    def read(self, path: str) -> bytes | None:
        """The file's bytes, or ``None`` if it does not exist."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether the file exists."""

    @abstractmethod
    def write(self, path: str, data: bytes) -> None:
        """Replace the file with ``data``, atomically and durably."""

    @abstractmethod
    def create(self, path: str, data: bytes) -> bool:
        """Create the file with ``data`` unless it exists: ``False`` if it did."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove the file; one that is gone already is fine."""

    @abstractmethod
    def list(self, directory: str) -> list[tuple[str, int]]:
        """``(path, size)`` of each file in ``directory`` (none if it does not exist)."""

    @abstractmethod
    def parquet_source(self, path: str) -> Any:
        """What :mod:`pyarrow.parquet` reads the file from; ``FileNotFoundError`` if it is gone."""


class LocalFiles(Files):
    """A directory on this machine's file system (or a mount every machine shares, such as NFS)."""

    cheap_looks = True
    exclusive_create = True

    def __init__(self, root: str) -> None:
        self.root = root

    def read(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def _temporary(self, path: str, data: bytes) -> str:
        """``data`` written durably to a new temporary file beside ``path``; its path."""
        os.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        temporary = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return temporary

    @staticmethod
    def _fsync_directory(directory: str) -> None:
        """Make a rename or link in ``directory`` durable."""
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def write(self, path: str, data: bytes) -> None:
        os.replace(self._temporary(path, data), path)
        self._fsync_directory(path.rsplit("/", 1)[0])

    def create(self, path: str, data: bytes) -> bool:
        temporary = self._temporary(path, data)
        try:
            os.link(temporary, path)  # fails if the path exists, also on NFS
        except FileExistsError:
            return False
        finally:
            os.remove(temporary)
        self._fsync_directory(path.rsplit("/", 1)[0])
        return True

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)

    def list(self, directory: str) -> list[tuple[str, int]]:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                found.append((f"{directory}/{name}", os.stat(f"{directory}/{name}").st_size))
        return found

    def parquet_source(self, path: str) -> Any:
        return path


class ArrowFiles(Files):
    """A directory on any file system :mod:`pyarrow.fs` opens from a URI."""

    def __init__(self, location: str) -> None:
        from pyarrow import fs

        self._fs, self.root = fs.FileSystem.from_uri(location)
        # HDFS's rename refuses to replace a file; other stores' replace it.
        self.exclusive_create = self._fs.type_name == "hdfs"

    def _missing(self, path: str) -> bool:
        from pyarrow import fs

        return bool(self._fs.get_file_info(path).type == fs.FileType.NotFound)

    def read(self, path: str) -> bytes | None:
        if self._missing(path):
            return None
        with self._fs.open_input_stream(path) as stream:
            return bytes(stream.read())

    def exists(self, path: str) -> bool:
        return not self._missing(path)

    def _temporary(self, path: str, data: bytes) -> str:
        self._fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        temporary = f"{path}.{uuid.uuid4().hex}.tmp"
        with self._fs.open_output_stream(temporary) as stream:
            stream.write(data)
        return temporary

    def write(self, path: str, data: bytes) -> None:
        self._fs.move(self._temporary(path, data), path)

    def create(self, path: str, data: bytes) -> bool:
        if not self.exclusive_create and self.exists(path):
            return False
        temporary = self._temporary(path, data)
        try:
            self._fs.move(temporary, path)
        except OSError:
            self.delete(temporary)
            if self.exists(path):
                return False
            raise
        return True

    def delete(self, path: str) -> None:
        if not self._missing(path):
            self._fs.delete_file(path)

    def list(self, directory: str) -> list[tuple[str, int]]:
        from pyarrow import fs

        infos = self._fs.get_file_info(fs.FileSelector(directory, allow_not_found=True))
        return [(info.path, int(info.size or 0)) for info in infos if info.type == fs.FileType.File]

    def parquet_source(self, path: str) -> Any:
        return self._fs.open_input_file(path)


def open_files(location: str) -> Files:
    """The backend for a resolved location: a URI with a scheme goes to :mod:`pyarrow.fs`, a path
    to the local file system."""
    return ArrowFiles(location) if "://" in location else LocalFiles(location)
