"""Where a checkpoint's files live: a local (or mounted) directory, an object store (``s3://``,
``gs://``, ``az://``), or any other :mod:`pyarrow.fs` file system (``hdfs://``).

A checkpoint needs a handful of operations on small files. :class:`Files` names them and what each
promises; :class:`LocalFiles`, :class:`ObjectStoreFiles` and :class:`ArrowFiles` keep the promises,
each its own way.
:func:`open_files` picks one for a location. A new backend (an object store's own client, say) is
one more subclass, and a line in :func:`open_files`.

- **Atomic writes.** :meth:`Files.write` replaces a file so that a reader sees the old bytes or the
  new ones, never a torn file: on local disk a temporary file in the same directory, flushed and
  fsynced, renamed over the target, and the directory fsynced; elsewhere a temporary object moved
  into place.
- **Exclusive creates.** :meth:`Files.create` creates a file unless it exists; where the backend
  can (:attr:`Files.exclusive_create`), of two callers at once exactly one wins: a hard link on
  local disks and NFS, a conditional write on object stores, a rename that refuses to replace on
  HDFS. Elsewhere it looks first.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from segack.spark_adapter.errors import CheckpointLocationError

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

__all__ = ["OBJECT_STORE_SCHEMES", "ArrowFiles", "Files", "LocalFiles", "ObjectStoreFiles", "open_files",
           "resolve_location"]


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

    @abstractmethod
    def entries(self, directory: str) -> Sequence[str] | None:
        """The names of the files and directories in ``directory`` (none if it does not exist);
        ``None`` if it is a file."""

    @abstractmethod
    def remove_empty_directory(self, directory: str) -> None:
        """Remove ``directory`` if it is an empty directory (a store without directories has none
        to leave behind)."""


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

    def remove_empty_directory(self, directory: str) -> None:
        with contextlib.suppress(OSError):  # not empty (another run's file), gone, or not a directory
            os.rmdir(directory)

    def list(self, directory: str) -> list[tuple[str, int]]:
        names = self.entries(directory) or []
        found = []
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                found.append((f"{directory}/{name}", os.stat(f"{directory}/{name}").st_size))
        return found

    def parquet_source(self, path: str) -> Any:
        return path

    def entries(self, directory: str) -> Sequence[str] | None:
        try:
            return os.listdir(directory)
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            return None


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

        try:
            infos = self._fs.get_file_info(fs.FileSelector(directory, allow_not_found=True))
        except NotADirectoryError:
            return []
        return [(info.path, int(info.size or 0)) for info in infos if info.type == fs.FileType.File]

    def parquet_source(self, path: str) -> Any:
        return self._fs.open_input_file(path)

    def entries(self, directory: str) -> Sequence[str] | None:
        from pyarrow import fs

        if self._fs.get_file_info(directory).type == fs.FileType.File:
            return None
        infos = self._fs.get_file_info(fs.FileSelector(directory, allow_not_found=True))
        return [info.base_name for info in infos]

    def remove_empty_directory(self, directory: str) -> None:
        from pyarrow import fs

        if self._fs.get_file_info(directory).type == fs.FileType.Directory and self.entries(directory) == []:
            self._fs.delete_dir(directory)


#: The schemes :class:`ObjectStoreFiles` serves: S3 (and MinIO, R2, ...), GCS, Azure Blob Storage.
OBJECT_STORE_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss")


class ObjectStoreFiles(Files):
    """A prefix in an object store bucket, through obstore, whose conditional writes make
    :meth:`create` atomic: S3's ``If-None-Match: *``, GCS's ``ifGenerationMatch=0``, Azure's
    ``If-None-Match: *``. Every write of one object is atomic on these stores.

    Credentials and endpoints come the stores' standard way (``AWS_ACCESS_KEY_ID``,
    ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ...; ``GOOGLE_SERVICE_ACCOUNT``; ``AZURE_STORAGE_...``);
    an ``http://`` endpoint is allowed when it is the one configured. A store that cannot be
    reached, or refuses, is an ``OSError`` of one line.
    """

    exclusive_create = True

    def __init__(self, location: str) -> None:
        from datetime import timedelta

        from obstore.store import from_url

        self.location = location
        self.root = ""
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
        options: ClientConfig = {"allow_http": True} if endpoint.startswith("http://") else {}
        # A few quick retries: an endpoint that does not answer is refused in seconds, not minutes.
        retries: RetryConfig = {"max_retries": 3, "retry_timeout": timedelta(seconds=20)}
        self._store = from_url(location.replace("s3a://", "s3://", 1), client_options=options,
                               retry_config=retries)

    def path(self, *parts: str) -> str:
        return "/".join(parts)  # keys under the location's prefix, which the store adds

    def _call(self, operation: Any, *arguments: Any, **keywords: Any) -> Any:
        """``operation(store, ...)``, its failures but a missing object as one-line ``OSError``."""
        from obstore.exceptions import AlreadyExistsError, BaseError

        try:
            return operation(self._store, *arguments, **keywords)
        except (FileNotFoundError, AlreadyExistsError):
            raise
        except (BaseError, OSError) as error:
            raise OSError(f"checkpoint store {self.location}: {_store_failure(str(error))}") from None

    def read(self, path: str) -> bytes | None:
        import obstore

        try:
            return bytes(self._call(obstore.get, path).bytes())
        except FileNotFoundError:
            return None

    def exists(self, path: str) -> bool:
        import obstore

        try:
            self._call(obstore.head, path)
        except FileNotFoundError:
            return False
        return True

    def write(self, path: str, data: bytes) -> None:
        import obstore

        self._call(obstore.put, path, data)

    def create(self, path: str, data: bytes) -> bool:
        import obstore
        from obstore.exceptions import AlreadyExistsError

        try:
            self._call(obstore.put, path, data, mode="create")
        except AlreadyExistsError:
            return False
        return True

    def delete(self, path: str) -> None:
        import obstore

        with contextlib.suppress(FileNotFoundError):
            self._call(obstore.delete, path)

    def list(self, directory: str) -> list[tuple[str, int]]:
        import obstore

        listing = self._call(obstore.list_with_delimiter, directory.rstrip("/") + "/" if directory else None)
        return [(entry["path"], int(entry["size"])) for entry in listing["objects"]]

    def entries(self, directory: str) -> Sequence[str] | None:
        import obstore

        prefix = directory.rstrip("/") + "/" if directory else None
        listing = self._call(obstore.list_with_delimiter, prefix)
        found = [*listing["common_prefixes"], *(entry["path"] for entry in listing["objects"])]
        return [name.rstrip("/").rsplit("/", 1)[-1] for name in found]

    def remove_empty_directory(self, directory: str) -> None:
        """Nothing: a prefix is no object, and goes with its last object."""

    def parquet_source(self, path: str) -> Any:
        import pyarrow as pa

        data = self.read(path)
        if data is None:
            raise FileNotFoundError(path)
        return pa.BufferReader(data)


def _store_failure(text: str) -> str:
    """What an object store's error means, in one line: its status and code, or why it was not
    reached."""
    status = re.search(r"status code: (\d{3} [A-Za-z ]+?):", text)
    code = re.search(r"<Code>(\w+)</Code>", text)
    if "169.254.169.254" in text:  # no credentials configured: the client asked the instance metadata
        return ("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the store's own "
                "variables)")
    if status is not None:
        return f"the store answered {status[1]}" + (f" ({code[1]})" if code else "")
    first = text.strip().splitlines()[0] if text.strip() else "unknown error"
    return f"cannot reach the store: {first}"


def resolve_location(location: str) -> str:
    """``location`` in a form every machine reads the same way.

    A URI with a scheme (``s3://bucket/x``) is kept; ``file://`` is dropped; a
    relative local path becomes absolute, against the current directory of the
    process that calls this (the driver), before anything is sent to executors.
    """
    if not isinstance(location, str) or not location:
        raise CheckpointLocationError("a checkpoint location is required")
    if location.startswith("file://"):
        location = location.removeprefix("file://")
    elif "://" in location:
        return location
    return os.path.abspath(os.path.expanduser(location))


def open_files(location: str) -> Files:
    """The backend for a resolved location: an object store's URI (:data:`OBJECT_STORE_SCHEMES`)
    goes to :class:`ObjectStoreFiles`, another URI to :mod:`pyarrow.fs`, a path to the local file
    system."""
    scheme = location.split("://", 1)[0] if "://" in location else None
    if scheme in OBJECT_STORE_SCHEMES:
        return ObjectStoreFiles(location)
    return ArrowFiles(location) if scheme is not None else LocalFiles(location)
