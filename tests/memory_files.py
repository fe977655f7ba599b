"""A checkpoint's files for the simulation tests: the promises of
:class:`segack.spark_adapter.store.storage.Files` (atomic writes, exclusive creates, listings) kept
in a dict (:class:`MemoryFiles`), or in a directory other parts open too, without fsync
(:class:`DiskFiles`), and a store that fails on the operations a test names, before or after they
land."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from segack.spark_adapter.store.storage import Files, LocalFiles

__all__ = ["DiskFiles", "MemoryFiles"]

_CHANGES = ("write", "create", "delete")


class MemoryFiles(Files):
    """Files under ``root``, in memory.

    :attr:`failing` holds the operations (``"write"``, ``"create"``, ``"delete"``, ``"read"``,
    ``"list"``) whose next call raises ``OSError`` (each once), as a store out of reach does;
    ``"write:landed"`` (or ``create``, ``delete``) makes the change, then raises, as a request whose
    answer was lost. :attr:`meanwhile` runs before a change lands, once :attr:`meanwhile_after`
    changes have passed: what others did while the writer was paused there.
    """

    exclusive_create = True
    cheap_looks = True

    def __init__(self, root: str = "/memory/checkpoint") -> None:
        self.root = root
        self.data: dict[str, bytes] = {}
        self.failing: list[str] = []
        self.operations = 0
        self.meanwhile: Callable[[], Any] | None = None
        self.meanwhile_after = 0

    def _passes(self, operation: str) -> bool:
        """Fail or pause before ``operation``; whether it must fail once it has landed."""
        self.operations += 1
        if operation in _CHANGES and self.meanwhile is not None:
            if self.meanwhile_after > 0:
                self.meanwhile_after -= 1
            else:
                meanwhile, self.meanwhile = self.meanwhile, None
                meanwhile()
        if operation in self.failing:
            self.failing.remove(operation)
            raise OSError(f"the store failed a {operation} on purpose")
        landed = f"{operation}:landed"
        if landed in self.failing:
            self.failing.remove(landed)
            return True
        return False

    @staticmethod
    def _lost(operation: str) -> None:
        raise OSError(f"the store made a {operation}, and its answer was lost")

    def read(self, path: str) -> bytes | None:
        self._passes("read")
        return self.data.get(path)

    def exists(self, path: str) -> bool:
        self._passes("read")
        return path in self.data

    def write(self, path: str, data: bytes) -> None:
        lost = self._passes("write")
        self.data[path] = bytes(data)
        if lost:
            self._lost("write")

    def create(self, path: str, data: bytes) -> bool:
        lost = self._passes("create")
        if path in self.data:
            return False
        self.data[path] = bytes(data)
        if lost:
            self._lost("create")
        return True

    def delete(self, path: str) -> None:
        lost = self._passes("delete")
        self.data.pop(path, None)
        if lost:
            self._lost("delete")

    def list(self, directory: str) -> list[tuple[str, int]]:
        self._passes("list")
        prefix = directory.rstrip("/") + "/"
        return [(path, len(data)) for path, data in self.data.items()
                if path.startswith(prefix) and "/" not in path[len(prefix):]]

    def parquet_source(self, path: str) -> Any:
        data = self.read(path)
        if data is None:
            raise FileNotFoundError(path)
        return pa.BufferReader(data)

    def entries(self, directory: str) -> Sequence[str] | None:
        if directory in self.data:
            return None
        prefix = directory.rstrip("/") + "/"
        return sorted({path[len(prefix):].split("/", 1)[0] for path in self.data if path.startswith(prefix)})

    def remove_empty_directory(self, directory: str) -> None:
        """Directories exist only through their files here."""


class DiskFiles(LocalFiles):
    """A directory, as :class:`~segack.spark_adapter.store.storage.LocalFiles` keeps it (other parts
    of a run that open the location see the same files), with :class:`MemoryFiles`' faults and
    pauses, and no fsync: what a simulation checks is the order of the writes, not the disk's."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.failing: list[str] = []
        self.operations = 0
        self.meanwhile: Callable[[], Any] | None = None
        self.meanwhile_after = 0

    _passes = MemoryFiles._passes
    _lost = staticmethod(MemoryFiles._lost)

    def _temporary(self, path: str, data: bytes) -> str:
        import os
        import uuid

        os.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        temporary = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(temporary, "wb") as handle:
            handle.write(data)
        return temporary

    @staticmethod
    def _fsync_directory(directory: str) -> None:
        """Not here (see the class)."""

    def read(self, path: str) -> bytes | None:
        self._passes("read")
        return super().read(path)

    def exists(self, path: str) -> bool:
        self._passes("read")
        return super().exists(path)

    def write(self, path: str, data: bytes) -> None:
        lost = self._passes("write")
        super().write(path, data)
        if lost:
            self._lost("write")

    def create(self, path: str, data: bytes) -> bool:
        lost = self._passes("create")
        made = super().create(path, data)
        if lost and made:
            self._lost("create")
        return made

    def delete(self, path: str) -> None:
        lost = self._passes("delete")
        super().delete(path)
        if lost:
            self._lost("delete")

    def list(self, directory: str) -> list[tuple[str, int]]:
        self._passes("list")
        return super().list(directory)
