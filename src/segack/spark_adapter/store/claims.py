"""One owner per checkpoint: claims, their extension, take-over and fencing.

The rules:

1. **A run claims the checkpoint before it reads or writes progress.** A claim is a file
   ``CHECKPOINT/claims/NNNNNNNNNNNN.json`` whose number is one more than the last claim's: the
   run's *fencing number*. It names the owner (run id, host, pid), when it was claimed and when it
   was last extended. It is created exclusively (a hard link on local disks and NFS, a rename
   that refuses to replace on HDFS), so of two runs that claim at once, one wins.
2. **A live claim refuses every other run**, before it starts a Spark job and without changing
   anything. A claim is live until it is released or goes unextended for ``claim_timeout``
   seconds; the owner extends it every few seconds while it lives and releases it when it ends.
   A claim whose owner ran on this machine and has died (a crash) is not live either.
3. **An expired claim may be taken over.** The new claim's higher number fences the old owner:
   its tasks look at the newest claim number at every flush and stop, writing nothing more,
   once it is not theirs; its driver checks before every save and stops with
   :class:`~segack.spark_adapter.ClaimLostError`, naming the new owner.
4. **Nothing a fenced run writes counts.** A new owner merges the progress files the previous
   claim's run left (a crash's progress is kept); files of any older run were written after it
   lost its claim, and are deleted unread. State files are named after their writer's claim
   number, and the newest is the checkpoint.
5. **A run refused before its first save leaves no trace.** Older claim files are pruned at a
   run's first save; a run that stops before it (its input is another checkpoint's, its sink
   cannot start) deletes its own claim file, so the checkpoint is as it found it, byte for byte.

Object stores (S3, GCS, Azure) create claims with their conditional writes. On a store that
offers neither an exclusive create nor a rename that refuses to replace (other :mod:`pyarrow.fs`
file systems), a claim is created by looking first: two runs that start within the same moment could
both believe they hold it. :attr:`~segack.spark_adapter.store.checkpoint.CheckpointStore.claims_are_atomic`
says which, and ``segack status`` shows it. A driver paused between its check and its save
writes the state file of its own, older claim number, which the checkpoint ignores
(:meth:`~segack.spark_adapter.store.checkpoint.CheckpointStore.load` reads the newest).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from segack.spark_adapter.errors import (
    CheckpointClaimedError,
    CheckpointError,
    ClaimLostError,
    TokenError,
)
from segack.spark_adapter.store.periodic import Periodic

if TYPE_CHECKING:
    from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore

__all__ = ["DEFAULT_CLAIM_TIMEOUT", "CheckpointClaimedError", "Claim", "ClaimKeeper", "ClaimLostError",
           "acquire", "force_release", "latest_claim", "previous_run",
           "recorded_state", "unmerged_progress"]

#: Seconds a claim lives without being extended, unless a run says otherwise.
DEFAULT_CLAIM_TIMEOUT = 60.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    """One claim of a checkpoint (rule 1), as its file records it."""

    #: The fencing number: one more than the claim before it.
    number: int
    run_id: str
    host: str
    pid: int
    claimed_at: float
    extended_at: float
    #: The claim's timeout, as its owner set it.
    timeout: float
    released: bool = False
    #: Who released it, when not its owner (``segack release --force``).
    released_by: str | None = None
    #: The run whose progress files the next owner merges (rule 4), when not this claim's own: a
    #: command that handles no events (``segack split``, ...) passes its predecessor's on.
    progress_of: str | None = None

    @property
    def progress_run(self) -> str:
        """The run whose progress files the next owner merges (rule 4)."""
        return self.progress_of or self.run_id

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8") + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Claim:
        """A claim file's claim; anything else is a
        :class:`~segack.spark_adapter.CheckpointError`."""
        try:
            body = json.loads(data.decode("utf-8"))
            claim = cls(**body)
        except (UnicodeDecodeError, ValueError, TypeError) as error:
            raise CheckpointError(f"{where} is not a segack claim: {error}") from None
        numbers = (claim.number, claim.pid, claim.claimed_at, claim.extended_at, claim.timeout)
        if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in numbers):
            raise CheckpointError(f"{where} is not a segack claim: a number is not a number")
        return claim

    def live(self, now: float) -> bool:
        """Whether the claim still refuses other runs (rule 2): it is neither released nor expired,
        and its owner, if it ran on this machine, is still running."""
        return not self.released and now - self.extended_at < self.timeout and not self.owner_gone()

    def owner_gone(self) -> bool:
        """Whether the owner ran on this machine and its process has ended (a crash): then its
        claim need not wait for the timeout. A process elsewhere cannot be looked at."""
        if self.host != socket.gethostname() or self.pid == os.getpid():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def owner(self) -> str:
        return f"run {self.run_id} (pid {self.pid} on {self.host})"


def latest_claim(store: CheckpointStore) -> Claim | None:
    """The newest claim of ``store`` (``None``: never claimed); a damaged one is a
    :class:`~segack.spark_adapter.CheckpointError`."""
    for number in reversed(store.claim_numbers()):
        data = store.read_claim_file(number)
        if data is not None:
            claim = Claim.from_bytes(data, f"claim {number} of checkpoint {store.location}")
            if claim.number != number:
                raise CheckpointError(f"claim {number} of checkpoint {store.location} says it is claim "
                                      f"{claim.number}")
            return claim
    return None


def previous_run(store: CheckpointStore, claim: Claim) -> str | None:
    """The run id of the claim before ``claim`` (``None``: there was none): rule 4 merges its
    progress files, and only those."""
    if claim.number <= 1:
        return None
    data = store.read_claim_file(claim.number - 1)
    if data is None:
        return None
    return Claim.from_bytes(data, "the previous claim").progress_run


def recorded_state(store: CheckpointStore) -> tuple[Checkpoint, list[str]]:
    """The checkpoint's state with what :func:`unmerged_progress` adds to it (the progress a run
    resumes from), and those files; :class:`~segack.spark_adapter.CheckpointLocationError` where
    there is no checkpoint. Nothing is written."""
    state = store.load_existing()
    unmerged = unmerged_progress(store)
    if state.tokens is not None:
        try:
            for _, updates in store.read_progress(unmerged):
                state.tokens.apply(updates)
        except TokenError as error:
            raise CheckpointError(f"checkpoint {store.location}: {error}") from None
    return state, unmerged


def unmerged_progress(store: CheckpointStore) -> list[str]:
    """The progress files not yet in the state that count: the live run's, or those the next run
    will merge (rule 4); a reader adds them to the state to see what is recorded done."""
    latest = latest_claim(store)
    return [] if latest is None else store.progress_files(latest.progress_run)


def _prune(store: CheckpointStore, number: int) -> None:
    """Keep claim ``number`` and the one before it (rule 4 reads it); older ones are history."""
    store.delete_claim_files([older for older in store.claim_numbers() if older < number - 1])


def acquire(store: CheckpointStore, run_id: str, timeout: float, *, handles_events: bool = True) -> Claim:
    """Claim ``store`` for ``run_id`` (rules 1-3); :class:`~segack.spark_adapter.CheckpointClaimedError`
    if a live claim holds it, or if another run claimed it in the same moment. A claimant that
    ``handles_events`` not (a command changing the segments) leaves the previous run's progress to
    the next run."""
    now = time.time()
    latest = latest_claim(store)
    if latest is not None and latest.live(now):
        raise CheckpointClaimedError(store.location, latest, now)
    passed_on = None if handles_events or latest is None else latest.progress_run
    claim = Claim(number=1 if latest is None else latest.number + 1, run_id=run_id, host=socket.gethostname(),
                  pid=os.getpid(), claimed_at=now, extended_at=now, timeout=timeout, progress_of=passed_on)
    if not store.create_claim_file(claim.number, claim.to_bytes()):
        winner = latest_claim(store)
        assert winner is not None
        log.info("%s: %s claimed it in the same moment as run %s", store.location, winner.owner(), run_id)
        raise CheckpointClaimedError(store.location, winner, time.time())
    if latest is not None and not latest.released:
        log.info("%s: run %s took the checkpoint over from %s, whose claim %s", store.location, run_id,
                 latest.owner(), "outlived its process" if latest.owner_gone() else "lapsed")
    log.info("%s: run %s holds claim %d", store.location, run_id, claim.number)
    return claim


def force_release(store: CheckpointStore, by: str, number: int | None = None) -> Claim | None:
    """Release the newest claim, live or not, for an operator who knows its owner is gone.

    A new claim number, released at once, fences the old owner should it come back; its
    progress stays mergeable by the next run. Returns the claim released (``None``: there was
    none, or it was released already). With ``number``, only claim ``number`` is released: an
    operator who saw one owner gone never releases the run that took over since
    (:class:`~segack.spark_adapter.CheckpointError`, nothing written).
    """
    latest = latest_claim(store)
    if number is not None and (latest is None or latest.number != number):
        now = "no claim" if latest is None else f"claim {latest.number}, {latest.owner()}'s"
        raise CheckpointError(f"claim {number} is no longer the newest of checkpoint {store.location} (it is "
                              f"{now}): nothing released")
    if latest is None or latest.released:
        return None
    released = replace(latest, number=latest.number + 1, extended_at=time.time(), released=True,
                       released_by=by)
    if not store.create_claim_file(released.number, released.to_bytes()):
        raise CheckpointError(f"checkpoint {store.location} was claimed again while it was being released")
    _prune(store, released.number)
    log.info("%s: %s released the claim of %s", store.location, by, latest.owner())
    return latest


class ClaimKeeper(Periodic):
    """Extends a run's claim on a timer while the run lives, and releases it at the end.

    When the claim turns out lost, it records :class:`~segack.spark_adapter.ClaimLostError` in
    ``lost`` and calls ``on_lost`` (which stops the run's job). :meth:`check` raises it: the driver
    calls it before every save (:meth:`save`).
    """

    def __init__(self, store: CheckpointStore, claim: Claim,
                 on_lost: Callable[[], object] | None = None) -> None:
        super().__init__(min(claim.timeout / 4, 5.0), "segack-claim")
        self.store, self.claim, self.on_lost = store, claim, on_lost
        self.lost: ClaimLostError | None = None
        #: Whether the run has saved under this claim (rule 5).
        self.saved = False

    def check(self) -> None:
        """Raise :class:`~segack.spark_adapter.ClaimLostError` unless this run still holds the newest
        claim."""
        if self.lost is None:
            latest = latest_claim(self.store)
            if latest is None or latest.number != self.claim.number or latest.released:
                self.lost = ClaimLostError(self.store.location, self.claim, latest)
        if self.lost is not None:
            raise self.lost

    def save(self, state: Checkpoint) -> None:
        """Save ``state`` as this run's, once :meth:`check` has found the claim still held."""
        self.check()
        self.store.save(state, self.claim.number)
        if not self.saved:
            _prune(self.store, self.claim.number)
            self.saved = True

    def extend(self) -> None:
        self.check()
        extended = replace(self.claim, extended_at=time.time())
        self.store.write_claim_file(extended.number, extended.to_bytes())
        # Only once written: a write that failed leaves the claim expiring after the last one.
        self.claim = extended

    def tick(self) -> bool:
        try:
            self.extend()
        except ClaimLostError as lost:
            log.info("%s", lost)  # the run raises it, once its job has stopped
            if self.on_lost is not None:
                self.on_lost()
            return True
        except OSError as error:
            # The store is unreachable for a moment; the claim holds until it expires.
            log.warning("%s: could not extend the claim of run %s (it expires %g s after %s): %s",
                        self.store.location, self.claim.run_id, self.claim.timeout,
                        time.strftime("%H:%M:%S", time.localtime(self.claim.extended_at)), error)
        except CheckpointError as error:
            # A claim file that cannot be read: whether this run still holds the checkpoint cannot be
            # told, so it stops as if it had lost it (its next save raises the same error).
            log.error("%s: cannot tell whether run %s still holds its claim: %s", self.store.location,
                      self.claim.run_id, error)
            if self.on_lost is not None:
                self.on_lost()
            return True
        return False

    def __exit__(self, *exc_info: Any) -> None:
        super().__exit__(*exc_info)
        if self.lost is None:
            try:
                self.check()
                if exc_info[0] is not None and not self.saved:
                    self.store.withdraw_claim(self.claim.number)  # rule 5
                    log.info("%s: run %s withdrew claim %d: it stopped before it saved anything",
                             self.store.location, self.claim.run_id, self.claim.number)
                    return
                released = replace(self.claim, extended_at=time.time(), released=True)
                self.store.write_claim_file(released.number, released.to_bytes())
            except ClaimLostError as lost:
                log.info("%s", lost)  # the claim is another run's now: nothing to release
            except OSError as error:
                log.warning("%s: could not release the claim of run %s; it expires %g s after it was "
                            "last extended: %s", self.store.location, self.claim.run_id, self.claim.timeout,
                            error)
            else:
                log.info("%s: run %s released claim %d", self.store.location, self.claim.run_id,
                         self.claim.number)
