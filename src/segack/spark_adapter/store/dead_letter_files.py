"""The checkpoint's dead-letter files (``dead-letters/``), as the driver's view and the tasks' view
both read them: which there are, what one holds, which keys they park.

A real-time stream's task writes one file per partition and save, named after the partition's
epoch and the number of files that epoch wrote before (:func:`real_time_letters_name`), before the
save whose progress vouches for it (``letters``: the files of each epoch it counts). A file the
partition's progress does not vouch for is no dead letter: an attempt that was taken over while it
wrote it (the new holder hands those records again), or one about to save. Only vouched files are
listed (:func:`dead_letter_paths`), so every reader sees the same letters."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from segack.spark_adapter.errors import CheckpointError

if TYPE_CHECKING:
    from segack.spark_adapter.store.storage import Files

__all__ = ["DEAD_LETTERS_DIR", "dead_letter_keys_of", "dead_letter_paths", "read_dead_letter_file",
           "real_time_letters_name"]

#: Where tasks write the events they did not handle (``on_error="dead-letter"``), as Parquet:
#: the event's columns and the dead-letter columns.
DEAD_LETTERS_DIR = "dead-letters"
_REAL_TIME = re.compile(r".*-rt-p(\d{5,})-e(\d{10})-[0-9a-f]{8}-(\d{5,})\.parquet")


def real_time_letters_name(run_id: str, partition: int, epoch: int, attempt: str, written: int) -> str:
    """The name of the dead-letter file a real-time task's attempt ``attempt`` writes for
    ``partition`` in ``epoch``, after ``written`` others of that epoch."""
    return f"{run_id}-rt-p{partition:05d}-e{epoch:010d}-{attempt[:8]}-{written:05d}"


def dead_letter_paths(files: Files, prefix: str = "") -> list[str]:
    """The dead-letter files present now whose names start with ``prefix``, sorted; a real-time
    stream's only where its partition's progress vouches for them."""
    from segack.spark_adapter.store.partitions import PartitionStates

    start = files.path(DEAD_LETTERS_DIR, prefix)
    found = sorted(path for path, _ in files.list(files.path(DEAD_LETTERS_DIR))
                   if path.endswith(".parquet") and path.startswith(start))
    if not any(_REAL_TIME.fullmatch(path.rsplit("/", 1)[-1]) for path in found):
        return found
    states = PartitionStates(files, files.root).all()
    return [path for path in found if _vouched(path, states)]


def _vouched(path: str, states: dict[int, dict[str, Any]]) -> bool:
    """Whether a dead-letter file counts: not a real-time stream's, or one its partition's
    progress vouches for."""
    matched = _REAL_TIME.fullmatch(path.rsplit("/", 1)[-1])
    if matched is None:
        return True
    partition, epoch, number = int(matched[1]), int(matched[2]), int(matched[3])
    vouched = states.get(partition, {}).get("letters", {})
    return isinstance(vouched, dict) and number < int(vouched.get(str(epoch), 0))


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


def dead_letter_places_of(files: Files, key: str, key_group: str) -> frozenset[tuple[int, Any]]:
    """``(key group, key)`` (columns ``key_group`` and ``key``) over every dead-letter file: the
    keys they park, each in its key group (a real-time stream's partition, where a key of two topics
    is two keys)."""
    places: set[tuple[int, Any]] = set()
    for path in dead_letter_paths(files):
        table = read_dead_letter_file(files, path, [key_group, key])
        if table is not None:
            places.update(zip(table.column(key_group).to_pylist(), table.column(key).to_pylist(),
                              strict=True))
    return frozenset(places)
