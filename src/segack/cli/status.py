"""``segack status`` and ``segack dead-letters``: what a checkpoint holds, read without Spark."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from segack.cli.exit_codes import ExitCode
from segack.cli.output import counted, local_time, percent, refused

if TYPE_CHECKING:
    from segack.spark_adapter.results import PartitionReport
    from segack.spark_adapter.store.checkpoint import CheckpointStore
    from segack.spark_adapter.store.claims import Claim
    from segack.spark_adapter.store.tokens import KeyGroupTokens


def run(args: argparse.Namespace) -> int:
    """``segack status`` or ``segack dead-letters``: an :class:`~segack.cli.ExitCode`."""
    return _status(args) if args.command == "status" else _dead_letters(args)


def _status(args: argparse.Namespace) -> int:
    from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore
    from segack.spark_adapter.store.claims import latest_claim, recorded_state
    from segack.spark_adapter.store.partitions import REAL_TIME_MODE
    from segack.spark_adapter.store.stream_view import stream_now

    try:
        store = CheckpointStore(args.checkpoint)
        state, unmerged = recorded_state(store)
        letters = store.count_dead_letters()
        claim = latest_claim(store)
    except (CheckpointError, ValueError, OSError) as error:
        return refused("status", error)
    settings, tokens = state.settings, state.tokens
    print(f"{'checkpoint':<15} {store.location}")
    print(f"{'status':<15} {_status_line(settings.get('status', '?'), claim, letters, 'stream' in settings)}")
    _print_stream(stream_now(store.files, settings.get("stream")))
    if settings.get("mode") == REAL_TIME_MODE:
        _print_partitions(settings, store.partitions.reports(), claim is not None and claim.live(time.time()))
    if tokens is not None:
        if "stream" in settings:  # the tokens count the last micro-batch's events
            aside = f", {counted(letters, 'event')} of them set aside as dead letters" if letters else ""
            print(f"{'events':<15} {int(settings['stream'].get('events', 0)):,} in its complete "
                  f"micro-batches{aside}")
        else:
            print(f"{'events':<15} {_events_line(tokens.done, state.input_events, letters)}")
        if unmerged and claim is not None:
            when = "the run merges them" if claim.live(time.time()) else "the next run merges them"
            print(f"{'':<15} (counting {counted(len(unmerged), 'progress file')} of run {claim.progress_run} "
                  f"that the state does not hold yet: {when})")
        _print_key_groups(tokens, settings.get("segments"))
    history = settings.get("segment_history", [])
    if history:
        print(f"{'segment sets':<15} {counted(len(history), 'set')}, newest last")
        for entry in history[-10:]:
            print(f"  {local_time(entry['at'])}  {len(entry['segments']):>4} segments  {entry['why']}")
    pending = _pending_line(store)
    if pending:
        print(f"{'requested':<15} {pending}")
    files = store.progress_files()
    print(f"{'size':<15} {store.size_bytes():,} bytes (its state and {counted(len(files), 'progress file')})")
    print(f"{'claim':<15} {_claim_line(store)}")
    if letters:
        print(f"{'dead letters':<15} {counted(letters, 'event')} set aside "
              f"(`segack dead-letters {args.checkpoint}` lists them)")
    if "input_fingerprint" in settings and "stream" not in settings:
        print(f"{'input':<15} {_input_line(settings['input_fingerprint'])}")
    for name in ("source", "key", "order", "hash", "runs", "flush_every", "flush_interval"):
        if name in settings:
            print(f"{name:<15} {settings[name]}")
    if "checkpoint_id" in settings:
        print(f"{'checkpoint id':<15} {settings['checkpoint_id']} (a SqlSink's positions table: "
              f"segack_applied_{settings['checkpoint_id']}, dropped by hand with the checkpoint)")
    return ExitCode.OK


def _print_stream(stream: dict[str, Any] | None) -> None:
    """A stream's last micro-batch, the one in progress, and (Kafka) where each partition stands."""
    if not stream:
        return
    last = stream.get("last_batch") or {}
    done = stream.get("completed_batch", -1)
    line = "no micro-batch complete yet" if done < 0 else f"micro-batch {done} the last complete"
    if last.get("at"):
        line += f" (reported {local_time(last['at'])})"
    if stream.get("batch"):
        line += f"; batch {stream['batch']['id']} in progress"
    print(f"{'stream':<15} {line}")
    start = stream.get("start") or {}
    if start.get("where"):
        skipped = start.get("passed_over", 0)
        passed = f", passing over {counted(skipped, 'record')} it held before" if skipped else ""
        print(f"{'started':<15} {start['where']}{passed} ({local_time(start['at'])})")
    partitions = stream.get("partitions") or []
    if not partitions:
        return
    group = stream.get("commit_offsets_to")
    told = f"committed to consumer group {group}" if group else "not committed to Kafka (--commit-offsets-to)"
    ends = ("; end offsets as Spark last reported them" if stream.get("ends_at") is None
            else f"; end offsets read from Kafka at {local_time(stream['ends_at'])}")
    print(f"{'kafka':<15} offsets as of micro-batch {last.get('id')}, {told}{ends}")
    # A record from before segack kept what the group was told: every offset was committed.
    told_group = {(topic, partition): end for topic, partition, end in stream.get(
        "group_offsets", [[topic, partition, end] for topic, partition, end, _ in partitions])}
    for topic, partition, end, latest in partitions:
        lag = "" if latest is None else f", end {latest:,}, lag {max(latest - end, 0):,}"
        at = told_group.get((topic, partition))
        state = ("done" if not group else "committed" if at == end
                 else "done, not committed yet" if at is None else f"done, the group at {at:,}")
        print(f"  {topic}/{partition:<5} next offset {end:,} ({state}){lag}")


def _print_partitions(settings: dict[str, Any], reports: tuple[PartitionReport, ...], live: bool) -> None:
    """A real-time stream's partitions, as their tasks last saved them, and while a run is live the one
    that holds it back (:func:`~segack.spark_adapter.results.holding_back`)."""
    group = settings.get("commit_offsets_to")
    told = f"committed to consumer group {group}" if group else "not committed to Kafka"
    handled = sum(report.handled_total for report in reports)
    from segack.spark_adapter.coordinator.stream_partitions import StreamPartitions

    topics = StreamPartitions.recorded(settings).names or (str(settings.get("topic")),)
    print(f"{'real-time':<15} {'topics' if len(topics) > 1 else 'topic'} {', '.join(topics)}, "
          f"{counted(len(reports), 'partition')} with "
          f"progress, saved every {settings.get('commit_interval', 1.0):g} s, {told}; {handled:,} events "
          f"handled")
    from segack.spark_adapter.results import holding_back

    busiest = holding_back(reports) if live else None
    for report in reports:
        lag = "" if report.lag is None else f", end {report.end:,}, lag {report.lag:,}"
        above = (f", {counted(report.done_intervals, 'interval')} done above it" if report.done_intervals
                 else "")
        back = "  <- holds the run back" if report is busiest else ""
        print(f"  {report.topic or topics[0]}/{report.partition:<5} next offset {report.next_offset:,} (read "
              f"{report.read:,}, {report.pending:,} pending{above}){lag}{back}")


def _status_line(status: str, claim: Claim | None, letters: int, streams: bool = False) -> str:
    """What a checkpoint's recorded status and claim mean, and what to do next."""
    if claim is not None and claim.live(time.time()):
        return f"running: {claim.owner()} holds it"
    if status == "running":
        return "stopped before its end (killed, or its machine lost); the next run resumes it"
    if status == "failed":
        return "stopped: its last run failed (the handler, or a Spark task); the next run resumes it"
    if status == "complete" and streams:
        aside = (f", {counted(letters, 'dead letter')} of them set aside (--retry-dead-letters handles them)"
                 if letters else "")
        return (f"stopped between micro-batches: every event of its micro-batches handled{aside}; the next "
                f"run reads on")
    if status == "complete" and letters:
        return (f"not complete: {counted(letters, 'dead letter')} left (read to the end; "
                f"--retry-dead-letters handles them)")
    if status == "complete":
        return "complete: every event handled"
    if status == "stopped":  # a real-time stream's
        return "stopped when asked, its progress saved; the next run resumes it"
    if status == "incomplete":
        return ("stopped before its end, its progress saved (asked to stop, or a task's end lost with its "
                "executor); the next run resumes it")
    return status


def _events_line(done: int, total: int | None, letters: int) -> str:
    """Events handled, set aside and left, never rounded up to all of them."""
    handled = max(done - letters, 0)
    aside = f", {counted(letters, 'event')} set aside as dead letters" if letters else ""
    if total is None:
        return (f"{handled:,} handled{aside}; the total is counted once a run reads its input to the end "
                f"without a failure")
    return (f"{total:,} in all: {handled:,} handled ({percent(handled, total)}), {letters:,} set aside, "
            f"{total - done:,} not reached yet")


def _print_key_groups(tokens: KeyGroupTokens, segment_ids: list[int] | None) -> None:
    """The key groups' progress, and each segment's load and progress."""
    from segack.spark_adapter.console.snapshot import segment_views

    per_group = tokens.done_per_key_group()
    if tokens.counted:
        finished = int(((per_group == tokens.count) & (tokens.count > 0)).sum())
        print(f"{'key groups':<15} {tokens.size:,} ({tokens.bits} bits): "
              f"{int((tokens.count > 0).sum()):,} with events, {finished:,} of them done")
    else:
        print(f"{'key groups':<15} {tokens.size:,} ({tokens.bits} bits): "
              f"{int((per_group > 0).sum()):,} with events done")
    if not segment_ids:
        return
    views = segment_views(tokens, segment_ids)
    print(f"{'segments':<15} {len(views)} now (done counts events handled and set aside)")
    width = len(f"{int(max(tokens.count.max(initial=0), per_group.max(initial=0))):,}")
    for view in views:
        # A segment's share of the events is its share of the run's time: the largest
        # holds the run back (`segack plan` proposes a set that evens them out).
        events = (f"{view.load:>{width},} events {view.load / max(tokens.total or 0, 1):6.1%}"
                  if view.load is not None else f"{'?':>{width}} events {'':6}")
        print(f"  #{view.position:<3} id {view.segment_id:<6} mask {view.mask:<6} "
              f"{events}  {view.done:>{width},} done  {view.key_groups:,} key groups")


def _input_line(fingerprint: str | None) -> str:
    """What the last run recorded of its input, and what that means for the next resume."""
    if fingerprint is None:
        return ("no fingerprint (not a query over files alone that Spark describes in full, or Spark "
                "Connect): a resume checks the events done")
    return f"fingerprint {fingerprint[:12]}: a resume over these files, unchanged, is not checked again"


def _pending_line(store: CheckpointStore) -> str | None:
    """The change of segments waiting for a run, as ``segack status`` shows it."""
    from segack.spark_adapter.store.checkpoint import CheckpointError
    from segack.spark_adapter.store.rescale import pending_change

    try:
        change = pending_change(store)
    except CheckpointError as error:
        return str(error)
    if change is None:
        return None
    return (f"{change.why} -> {len(change.segments)} segments, asked {local_time(change.requested_at)} by "
            f"{change.by}; the run applies it within seconds")


def _claim_line(store: CheckpointStore) -> str:
    """The checkpoint's claim, as ``segack status`` shows it."""
    from segack.spark_adapter.store.claims import latest_claim

    claim = latest_claim(store)
    atomic = "" if store.claims_are_atomic else (
        " (this store cannot create a file exclusively: two runs starting at the same moment could "
        "both claim it)")
    if claim is None:
        return f"never claimed{atomic}"
    now = time.time()
    if claim.released:
        by = f" by {claim.released_by}" if claim.released_by else ""
        return f"free: {claim.owner()} released it{by} {now - claim.extended_at:,.0f} s ago{atomic}"
    state = "held" if claim.live(now) else (
        "expired (its owner is gone)" if claim.owner_gone() else "expired")
    return (f"{state}: {claim.owner()}, claim {claim.number}, extended {now - claim.extended_at:,.1f} s ago, "
            f"timeout {claim.timeout:g} s{atomic}")


def _dead_letters(args: argparse.Namespace) -> int:
    from segack.spark_adapter.console.snapshot import dead_letter_keys
    from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore

    try:
        store = CheckpointStore(args.checkpoint)
        state = store.load_existing()
        events, keys = dead_letter_keys(store, str(state.settings.get("key", "")))
    except (CheckpointError, ValueError, OSError) as error:
        return refused("dead-letters", error)
    if not keys:
        print(f"{'dead letters':<15} none")
        return ExitCode.OK
    print(f"{'dead letters':<15} {counted(events, 'event')} of {counted(len(keys), 'key')}")
    shown = keys[:args.top]
    width = max(len(str(letter.key)) for letter in shown)
    print(f"{state.settings.get('key')!s:<{width}}  {'events':>8}  first error")
    for letter in shown:
        tries = f" ({letter.attempts} attempts)" if letter.attempts > 1 else ""
        print(f"{letter.key!s:<{width}}  {letter.events:>8,}  {letter.error}{tries}")
    if len(keys) > args.top:
        print(f"... and {len(keys) - args.top:,} more keys")
    return ExitCode.OK
