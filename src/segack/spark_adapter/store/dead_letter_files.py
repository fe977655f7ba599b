"""The checkpoint's dead-letter files (``dead-letters/``), as the driver's view and the tasks' view
both read them: which there are, what one holds, which keys they park."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from segack.spark_adapter.errors import CheckpointError

if TYPE_CHECKING:
    from segack.spark_adapter.store.storage import Files

__all__ = ["DEAD_LETTERS_DIR", "dead_letter_keys_of", "dead_letter_paths", "read_dead_letter_file"]

#: Where tasks write the events they did not handle (``on_error="dead-letter"``), as Parquet:
#: the event's columns and the dead-letter columns.
DEAD_LETTERS_DIR = "dead-letters"


def dead_letter_paths(files: Files, prefix: str = "") -> list[str]:
    """The dead-letter files present now whose names start with ``prefix``, sorted."""
    start = files.path(DEAD_LETTERS_DIR, prefix)
    return sorted(path for path, _ in files.list(files.path(DEAD_LETTERS_DIR))
                  if path.endswith(".parquet") and path.startswith(start))


def read_dead_letter_file(files: Files, path: str, columns: list[str] | None = None,
                          schema_only: bool = False) -> Any:
    """One file's table (only ``columns``, if given) or its schema alone; ``None`` if it has gone.
    A file that is not Parquet, or lacks a column, is a :class:`~segack.spark_adapter.CheckpointError`."""
    import pyarrow.parquet as pq

    try:
        source = files.parquet_source(path)
        if schema_only:
            return pq.read_schema(source)
        return pq.read_table(source, columns=columns)
    except FileNotFoundError:
        return None
    except (pa.ArrowException, KeyError) as error:
        raise CheckpointError(f"dead-letter file {path} cannot be read: {error}") from None


def dead_letter_keys_of(files: Files, key: str) -> frozenset[Any]:
    """The values of column ``key`` over every dead-letter file: the keys they park."""
    keys: set[Any] = set()
    for path in dead_letter_paths(files):
        table = read_dead_letter_file(files, path, [key])
        if table is not None:
            keys.update(table.column(key).to_pylist())
    return frozenset(keys)
