"""A storage that fails on its Nth operation, under the checkpoint store (no Spark).

Every operation of the local files (read, write, create, delete, list, ...) is counted, by the
driver's view and the tasks' alike; the Nth fails, each N in turn (or drawn by hypothesis): it
raises before it acts,
or, a write, leaves its file torn (half its bytes, where a store that broke its promise of atomic
writes would leave them) and raises. What it interrupts is real: a change of segments applied at
once on a checkpoint whose last run crashed (its claim, the state saved under it, the request
removed, the claim released), then the tasks of a run writing their progress. After any such
failure, read by a store that does not fail, the checkpoint is exactly as before the step or as
after it, with the crashed run's progress counted (passed on, never merged twice nor lost), or it
is refused in one line; and once the claim left behind expires, the next change completes or is
refused in one line the same way.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segack.kernel import SegmentSet
from segack.spark_adapter.errors import CheckpointError, SegackError
from segack.spark_adapter.store import rescale
from segack.spark_adapter.store.checkpoint import CheckpointStore
from segack.spark_adapter.store.claims import acquire, recorded_state
from segack.spark_adapter.store.storage import LocalFiles
from segack.spark_adapter.store.tokens import update_schema
from tests.test_rescale import _checkpoint

#: What the files do, each counted as one operation.
OPERATIONS = ("read", "exists", "write", "create", "delete", "list", "entries", "remove_empty_directory")
#: How long the claims of the test's changes and crashed runs last: short, so that one a fault
#: left behind expires before the next change.
CLAIM_SECONDS = 0.01


class InjectedFault(OSError):
    """The storage's failure, as a store's client raises one."""


class FailingStorage:
    """Counts every operation of :class:`LocalFiles`; the ``nth`` raises :class:`InjectedFault`,
    after leaving half of its file's bytes at its path if it writes and ``torn``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, nth: int, torn: bool) -> None:
        self.count, self.nth, self.torn, self.failed = 0, nth, torn, None
        for name in OPERATIONS:
            monkeypatch.setattr(LocalFiles, name, self._counted(name, getattr(LocalFiles, name)))

    def _counted(self, name, operation):
        def counted(files, *arguments):
            self.count += 1
            if self.count != self.nth:
                return operation(files, *arguments)
            self.failed = name
            if self.torn and name in ("write", "create"):
                path, data = arguments
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_bytes(data[:len(data) // 2])
            raise InjectedFault(f"injected: {name} #{self.nth} failed")

        return counted


def _updates(groups: list[int], done: int) -> pa.Table:
    """A task's progress: ``done`` events of each key group of ``groups``, the last of order ``done``."""
    schema = update_schema(pa.null(), pa.null())
    count = len(groups)
    columns = [groups, [done] * count, [0] * count, [None] * count, [None] * count, [0] * count,
               [None] * count, [done] * count, [done] * count]
    return pa.table([pa.array(values, field.type) for values, field in zip(columns, schema, strict=True)],
                    schema=schema)


def _crashed_run(store: CheckpointStore, groups: list[int]) -> int:
    """A run that claimed the checkpoint, whose tasks wrote their progress, and that died; the
    events it recorded done, as a resume counts them."""
    claim = acquire(store, "crashed", CLAIM_SECONDS)
    tasks = store.for_tasks("crashed", claim.number)
    for segment, group in enumerate(groups):
        tasks.write_progress(tasks.progress_name(segment, 0), _updates([group], 2))
    time.sleep(CLAIM_SECONDS * 3)
    return recorded_state(store)[0].tokens.done


def _seen(location: str) -> tuple[int, list[int], list[str]] | str:
    """The checkpoint as a resume sees it (events done, segments, progress files), or the one line
    that refuses it."""
    store = CheckpointStore(location)
    try:
        state, _ = recorded_state(store)
    except CheckpointError as error:
        assert "\n" not in str(error)
        return str(error)
    return state.tokens.done, state.settings["segments"], [path.rsplit("/", 1)[1] for path in
                                                           store.progress_files()]


def _change(store: CheckpointStore, kind: str) -> None:
    if kind == "split":
        rescale.split(store, 1, claim_timeout=CLAIM_SECONDS)
    elif kind == "merge":
        rescale.merge(store, 2, claim_timeout=CLAIM_SECONDS)
    else:
        rescale.scale(store, 5, claim_timeout=CLAIM_SECONDS)


AFTER = {"split": [0, 1, 2, 3], "merge": [0, 1], "scale": [0, 1, 2, 3, 4]}


def _interrupted_change(kind: str, crashed: bool, nth: int, torn: bool) -> bool:
    """One change of segments with the ``nth`` operation failing; whether it failed (``nth`` past
    the change's last operation: it did not)."""
    with tempfile.TemporaryDirectory() as scratch, pytest.MonkeyPatch.context() as monkeypatch:
        store = _checkpoint(Path(scratch), SegmentSet.from_ids([0, 1, 2]), bits=4, counts=[4] * 16)
        done = _crashed_run(store, [3, 5, 7]) if crashed else 0
        progress = [path.rsplit("/", 1)[1] for path in store.progress_files()]
        before, after = (done, [0, 1, 2], progress), (done, AFTER[kind], progress)
        assert _seen(store.location) == before
        storage = FailingStorage(monkeypatch, nth, torn)
        try:
            _change(store, kind)
        except (InjectedFault, SegackError) as error:
            failure: Exception | None = error
        else:
            failure = None  # done, or done with its claim's release failed (a log line: it expires)
        monkeypatch.undo()
        seen = _seen(store.location)
        if isinstance(seen, str):
            # Only a torn file refuses it, the state's or a claim's, named; an error leaves nothing
            # half written. (A store that tears files breaks its promise of atomic writes: the
            # operator restores the file; segack reads nothing else in its place.)
            assert torn and storage.failed in ("write", "create"), (nth, storage.failed, seen)
            assert seen.startswith((f"checkpoint {store.location} is damaged", "claim ")), seen
            return True
        assert seen == after if failure is None else seen in (before, after), (nth, storage.failed, seen)
        # The claim a fault left behind expires; the next change completes and loses nothing.
        time.sleep(CLAIM_SECONDS * 3)
        rescale.scale(store, 6, claim_timeout=CLAIM_SECONDS)
        assert _seen(store.location) == (done, [0, 1, 2, 3, 4, 5], progress)
        return storage.failed is not None


@pytest.mark.parametrize("torn", [False, True], ids=["error", "torn"])
@pytest.mark.parametrize("kind", sorted(AFTER))
def test_a_change_of_segments_interrupted_at_each_operation_keeps_the_checkpoint_or_refuses_it(kind, torn):
    nth = 1
    while _interrupted_change(kind, crashed=True, nth=nth, torn=torn):
        nth += 1
    assert nth > 20  # the change's operations were each interrupted in turn


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(sorted(AFTER)), nth=st.integers(1, 40), torn=st.booleans())
def test_a_change_on_a_checkpoint_with_no_progress_left_behaves_alike(kind, nth, torn):
    _interrupted_change(kind, crashed=False, nth=nth, torn=torn)


@pytest.mark.parametrize("torn", [False, True], ids=["error", "torn"])
def test_a_tasks_progress_interrupted_at_any_operation_counts_whole_files_or_refuses_them(torn):
    for nth in range(1, 6):  # four progress files, one write each; the fifth: none fails
        with tempfile.TemporaryDirectory() as scratch, pytest.MonkeyPatch.context() as monkeypatch:
            store = _checkpoint(Path(scratch), SegmentSet.from_ids([0, 1, 2]), bits=4, counts=[4] * 16)
            claim = acquire(store, "run", 60)
            tasks = store.for_tasks("run", claim.number)
            storage = FailingStorage(monkeypatch, nth, torn)
            written = []
            try:
                for segment, group in enumerate([2, 9, 11, 14]):
                    tasks.write_progress(tasks.progress_name(segment, 0), _updates([group], 3))
                    written.append(group)
            except InjectedFault:
                assert len(written) == nth - 1
            monkeypatch.undo()
            seen = _seen(store.location)
            if isinstance(seen, str):
                assert torn and storage.failed == "write" and "progress" in seen, seen
                continue
            # Each file the tasks wrote counts whole; the one that failed, not at all.
            assert seen[0] == 3 * len(written), (nth, storage.failed, seen)
            assert np.all(recorded_state(store)[0].tokens.done_per_key_group()[written] == 3)
