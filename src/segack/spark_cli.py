"""The ``segack replay``, ``segack plan`` and ``segack demo`` commands: the parts of the CLI that
start Spark."""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from segack.cli import ExitCode, counted, percent, run_keywords
from segack.spark_adapter.coordinator.replay import Progress, ReplayResult, load_handler, replay, worker_error
from segack.spark_adapter.errors import (
    CheckpointLocationError,
    HandlerFailedError,
    InputError,
    OptionError,
    ReplayError,
)
from segack.spark_adapter.results import STARTUP, BatchReport, StreamResult
from segack.spark_adapter.sources.files import check_input_files, read_input
from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore

__all__ = ["ProgressPrinter", "demo_command", "plan_command", "replay_command", "stream_command"]

log = logging.getLogger("segack.cli")


#: Seconds of events flowing before the progress line gives a rate: the tasks' first calls (their
#: workers starting, the first lists filling) would make a shorter one say too little.
SHORTEST_WINDOW = 3.0


class ProgressPrinter:
    """Progress on one rewritten line on a terminal, plain log lines elsewhere: events done (with
    the total, once counted, their share and the time left), the rate over the last ``window``
    seconds, the segments, and the calls in flight."""

    def __init__(self, stream: TextIO | None = None, every: float = 5.0, window: float = 10.0) -> None:
        self.stream = sys.stderr if stream is None else stream  # stderr as it is now, not at import
        self.terminal = self.stream.isatty()
        self.every, self.window = every, window
        self._last = float("-inf")
        #: ``(seconds, handled)`` of the reports of the last ``window`` seconds, oldest first.
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def rate(self, progress: Progress) -> float | None:
        """Events handled per second since the oldest report of the window; ``None`` until the
        window holds :data:`SHORTEST_WINDOW` seconds of events flowing. Until the first events are
        handled, a report replaces the one before: that time went to Spark's start and the tasks'
        (a resume's first reports), not to events, and a rate over it would say too little."""
        if len(self._samples) == 1 and self._samples[0][1] == progress.handled:
            self._samples.clear()
        self._samples.append((progress.seconds, progress.handled))
        while len(self._samples) > 2 and progress.seconds - self._samples[1][0] >= self.window:
            self._samples.popleft()
        seconds, handled = self._samples[0]
        if progress.seconds - seconds < SHORTEST_WINDOW:
            return None
        return (progress.handled - handled) / (progress.seconds - seconds)

    def line(self, progress: Progress) -> str:
        """The progress line for ``progress`` (one more report for the rate)."""
        rate = self.rate(progress)
        if progress.total is None:
            parts = [f"{counted(progress.done, 'event')} done"]
        else:
            parts = [f"{progress.done:,} of {counted(progress.total, 'event')} done "
                     f"({percent(progress.done, progress.total)})"]
        if rate is not None:
            left = "" if progress.total is None or rate <= 0 else (
                f", {_duration((progress.total - progress.done) / rate)} left")
            parts.append(f"{rate:,.0f}/s{left}")
        parts.append(counted(progress.segments, "segment"))
        if progress.in_flight or progress.pending:
            parts.append(f"{counted(progress.in_flight, 'call')} in flight, "
                         f"{counted(progress.pending, 'row')} pending")
        return ", ".join(parts)

    def phase(self, text: str) -> None:
        """A start-up phase beginning, on a terminal's status line until the next replaces it (a log
        has them with ``--verbose``)."""
        if self.terminal:
            self.stream.write(f"\rsegack: {text}\033[K")
            self.stream.flush()

    @contextlib.contextmanager
    def phases(self, verbose: bool) -> Iterator[None]:
        """Show the run's start-up phases (:data:`~segack.spark_adapter.results.STARTUP`) while the
        block runs; with ``verbose`` they are log lines already."""
        printer = self

        class Phases(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                printer.phase(record.getMessage())

        handler = Phases()
        level = STARTUP.level
        if not verbose:
            STARTUP.addHandler(handler)
            STARTUP.setLevel(logging.INFO)
            STARTUP.propagate = False
        try:
            yield
        finally:
            STARTUP.removeHandler(handler)
            STARTUP.setLevel(level)
            STARTUP.propagate = True

    def __call__(self, progress: Progress) -> None:
        line = self.line(progress)
        if self.terminal:
            self.stream.write("\r" + line + "\033[K")
        elif progress.handled and time.monotonic() - self._last >= self.every:
            self.stream.write(f"segack: {line}\n")
            self._last = time.monotonic()
        self.stream.flush()

    def close(self) -> None:
        if self.terminal:
            self.stream.write("\n")
            self.stream.flush()


def _duration(seconds: float) -> str:
    """``about 40 s``, ``about 3 min``, ``about 2 h 5 min``."""
    if seconds < 60:
        return f"about {max(round(seconds), 1)} s"
    minutes = round(seconds / 60)
    return f"about {minutes} min" if minutes < 60 else f"about {minutes // 60} h {minutes % 60} min"


def _importable_from_here() -> None:
    """Let handler modules in the working directory import on the driver (executors get them shipped)."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)


def _is_embedded_local(master: str) -> bool:
    """``local`` or ``local[...]``: the driver's JVM runs the tasks itself."""
    return master == "local" or master.startswith("local[")


def _prepare(args: argparse.Namespace) -> tuple[Any, list[str], CheckpointStore] | ExitCode:
    """What ``replay`` and ``stream`` check before Spark starts: the handler, the files to ship, the
    checkpoint's location and INPUT; a refusal prints its line and is its exit code."""
    command = f"segack {args.command}"
    _importable_from_here()
    py_files = [path for path in args.py_files.split(",") if path]
    try:
        handler = load_handler(args.handler)
    except OptionError as error:
        print(f"{command}: argument --handler: {error}", file=sys.stderr)
        return ExitCode.USAGE
    missing = [path for path in py_files if not os.path.isfile(path)]
    if missing:
        print(f"{command}: argument --py-files: no such file {missing[0]!r}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        store = CheckpointStore(args.checkpoint)
        store.load()
        if args.input is not None:
            check_input_files(args.input, args.format)
    except (ValueError, OSError) as error:
        print(f"{command}: {error}", file=sys.stderr)
        return ExitCode.REFUSED
    return handler, py_files, store


def _start_session(args: argparse.Namespace, py_files: list[str]) -> Any:
    """The command's Spark session, the handler's module and ``py_files`` shipped to it."""
    from segack.spark_adapter.spark.session import ship_module, ship_py_files, spark_session

    spark = spark_session(master=_master(args), remote=args.remote, conf=dict(args.conf),
                          quiet=not args.verbose)
    ship_module(spark, args.handler.partition(":")[0])
    ship_py_files(spark, py_files)
    return spark


def _master(args: argparse.Namespace) -> str | None:
    return None if args.remote else (args.master or "local[2]")


def _stop_session(spark: Any, args: argparse.Namespace) -> None:
    # On an embedded local master the JVM stops itself (shutdown hooks included) when this
    # process exits, so the command does not wait for that. Anything else stops in order:
    # local-cluster's own master and workers would otherwise log errors racing the exit, and
    # a Connect session is released on the server.
    master = _master(args)
    if spark is not None and not (master is not None and _is_embedded_local(master)):
        spark.stop()


def _failure_code(args: argparse.Namespace, error: Exception) -> int:
    """The exit code of a run that raised ``error``, its line printed."""
    command = f"segack {args.command}"
    if isinstance(error, HandlerFailedError):
        print(f"{command}: {error}", file=sys.stderr)
        return ExitCode.HANDLER_FAILED
    if isinstance(error, ReplayError):
        print(f"{command}: {error}", file=sys.stderr)
        return ExitCode.FAILED
    if isinstance(error, (ValueError, OSError)):  # a refusal: nothing was written
        print(f"{command}: {error}", file=sys.stderr)
        return ExitCode.REFUSED
    print(f"{command}: {worker_error(error)}", file=sys.stderr)
    return ExitCode.FAILED


@contextlib.contextmanager
def _stop_signals(asked: Callable[[int, Any], None]) -> Iterator[Callable[[], None]]:
    """SIGTERM and SIGINT call ``asked`` while the block runs, as they did before it afterwards. The
    block calls what this yields once Spark has started: PySpark's session puts in its own SIGINT
    handler, which cancels every job and raises ``KeyboardInterrupt`` wherever the main thread is."""
    numbers = (signal.SIGTERM, signal.SIGINT)
    previous = {number: signal.signal(number, asked) for number in numbers}

    def again() -> None:
        for number in numbers:
            signal.signal(number, asked)

    try:
        yield again
    finally:
        for number, handling in previous.items():
            signal.signal(number, handling)


def _interrupt(spark: Any) -> None:
    """Cancel the session's jobs, from a thread of its own (a signal handler runs in the main
    thread, which may be waiting on the session)."""
    def cancel() -> None:
        try:
            spark.interruptAll()
        except Exception as error:  # the session is stopping anyway
            log.info("could not cancel the session's jobs: %s", error)

    threading.Thread(target=cancel, name="segack-interrupt", daemon=True).start()


def replay_command(args: argparse.Namespace) -> int:
    """``segack replay``: an :class:`~segack.cli.ExitCode`, with a one-line reason unless it is ``OK``.
    SIGTERM or Ctrl-C stops the run at once, its tasks' progress up to their last flush kept."""
    prepared = _prepare(args)
    if isinstance(prepared, ExitCode):
        return prepared
    handler, py_files, store = prepared
    printer = ProgressPrinter()
    spark = None
    # A plain flag: a signal handler must not wait for a lock its own thread may hold.
    stop = types.SimpleNamespace(asked=False)

    def asked(number: int, frame: Any) -> None:
        if not stop.asked:
            _say("\nsegack replay: stopping now; the progress saved so far is kept")
        stop.asked = True
        if spark is not None:
            _interrupt(spark)

    try:
        with printer.phases(args.verbose), _stop_signals(asked) as again:
            STARTUP.info("starting Spark (%s)", "Spark Connect" if args.remote else _master(args))
            spark = _start_session(args, py_files)
            again()
            if stop.asked:
                print(f"segack replay: stopped as asked, before the run started ({store.location})",
                      file=sys.stderr)
                return ExitCode.FAILED
            events = read_input(spark, args.input, args.format, dict(args.option), args.table)
            source = args.input if args.table is None else f"table {args.table}"
            result = replay(events, key=args.key, order=args.order, handler=handler, checkpoint=store,
                            progress=printer, source=source, metrics_port=args.metrics_port,
                            **run_keywords(args))
    except Exception as error:
        printer.close()
        if stop.asked:
            print(f"segack replay: stopped as asked; run it again to resume ({store.location})",
                  file=sys.stderr)
            return ExitCode.FAILED
        return _failure_code(args, error)
    finally:
        _stop_session(spark, args)
    printer.close()
    return _report(result, args)


def _stream_events(spark: Any, args: argparse.Namespace) -> Any:
    """``segack stream``'s events: Kafka records (:func:`~segack.spark_adapter.kafka_stream`), or a
    stream of the files at INPUT (their schema read from them) or of a table."""
    from segack.spark_adapter.sources.kafka import kafka_stream

    if args.format == "kafka":
        return kafka_stream(spark, dict(args.option), args.value_schema, args.value_format)
    return read_input(spark, args.input, args.format, dict(args.option), args.table, streaming=True)


def stream_command(args: argparse.Namespace) -> int:
    """``segack stream``: runs until the input is drained (``--trigger available-now``) or SIGTERM or
    Ctrl-C asks it to stop; an :class:`~segack.cli.ExitCode`."""
    from segack.spark_adapter.coordinator.query import StopRequest, stream

    prepared = _prepare(args)
    if isinstance(prepared, ExitCode):
        return prepared
    handler, py_files, store = prepared
    stop = StopRequest()

    def asked(number: int, frame: Any) -> None:
        then = "now" if stop.asked.is_set() else "at the end of the micro-batch under way (again: now)"
        _say(f"segack stream: stopping {then}")
        # Its events' locks are not for a signal handler, which may have interrupted their holder.
        threading.Thread(target=stop.set, name="segack-stop", daemon=True).start()

    spark = None
    try:
        with _stop_signals(asked) as again:
            spark = _start_session(args, py_files)
            again()
            if stop.asked.is_set():
                print("segack stream: stopped as asked, before the query started", file=sys.stderr)
                return ExitCode.OK
            try:
                events = _stream_events(spark, args)
            except OptionError as error:  # --value-schema, which only Spark can read: a flag's error
                print(f"segack stream: {error}", file=sys.stderr)
                return ExitCode.USAGE
            result = stream(events, key=args.key, order=args.order, handler=handler, checkpoint=store,
                            trigger=args.trigger, commit_offsets_to=args.commit_offsets_to, stop=stop,
                            progress=_print_batch, metrics_port=args.metrics_port, **run_keywords(args))
    except Exception as error:
        return _failure_code(args, error)
    finally:
        _stop_session(spark, args)
    if result.interrupted:
        print(f"segack stream: stopped at once as asked, its micro-batch under way incomplete; its progress "
              f"is saved: run it again to resume ({store.location})", file=sys.stderr)
        return ExitCode.FAILED
    return _stream_report(result, args)


def _say(line: str) -> None:
    """``line`` on stderr from a signal handler: one system call, no buffer that the handler may
    have interrupted in the middle of a write."""
    os.write(sys.stderr.fileno(), (line + "\n").encode())


def _print_batch(report: BatchReport) -> None:
    lag = "" if report.lag is None else f", {counted(report.lag, 'record')} behind"
    print(f"segack stream: batch {report.batch_id}: {counted(report.events, 'event')} in "
          f"{report.seconds:.1f} s; {report.events_so_far:,} so far{lag}")


def _stream_report(result: StreamResult, args: argparse.Namespace) -> int:
    """What ``segack stream`` prints at its end, and its exit code."""
    why = "stopped as asked" if result.stopped else "the input is drained"
    last = "no micro-batch" if result.last_batch is None else f"batch {result.last_batch} the last complete"
    batches = "1 micro-batch" if result.batches == 1 else f"{result.batches:,} micro-batches"
    print(f"segack stream: {why}: {batches}, {result.handled:,} events handled, {last}, in "
          f"{result.seconds:.1f} s")
    if result.group_behind:
        batch = ("the last complete micro-batch" if result.last_batch is None
                 else f"micro-batch {result.last_batch}")
        print(f"segack stream: the offsets of {batch} are not committed to consumer group "
              f"{args.commit_offsets_to}: the commit failed (--verbose says why); the next run commits them",
              file=sys.stderr)
    if result.passed_over:
        print(f"segack stream: started at {result.started}, passing over "
              f"{counted(result.passed_over, 'record')} the topic held before it")
    if args.retry_dead_letters:
        stay = f"; {result.retry_failed:,} failed again and stay" if result.retry_failed else ""
        print(f"segack stream: {counted(result.retried, 'dead letter')} handled again{stay}")
    if result.dead_letters:
        print(f"segack stream: {counted(result.dead_letters, 'event')} set aside as dead letters "
              f"(they or an earlier event of their key failed)")
    if result.dead_letters_left:
        print(f"segack stream: {counted(result.dead_letters_left, 'event')} set aside as dead letters "
              f"remain; `segack dead-letters {args.checkpoint}` lists them, and a run with "
              f"--retry-dead-letters handles them again", file=sys.stderr)
        return ExitCode.DEAD_LETTERS
    return ExitCode.OK


def _report(result: ReplayResult, args: argparse.Namespace) -> int:
    """What ``segack replay`` prints at the end of a run, and its exit code."""
    print(f"segack replay: {result.handled:,} events handled, {result.already_done:,} already done, "
          f"{result.total:,} in all, over {result.segments} segments and {2**result.key_group_bits:,} "
          f"key groups in {result.seconds:.1f} s")
    if result.already_done and not result.input_checked:
        log.info("the input is the same files, unchanged, as the last run read: the events done were not "
                 "read again to check them (--verify always checks)")
    if result.segment_changes:
        times = "once" if result.segment_changes == 1 else f"{result.segment_changes} times"
        print(f"segack replay: the segments changed {times} while it ran; `segack status "
              f"{args.checkpoint}` shows each set")
    if args.retry_dead_letters:
        stay = f"; {result.retry_failed:,} failed again and stay" if result.retry_failed else ""
        print(f"segack replay: {counted(result.retried, 'dead letter')} handled again{stay}")
    if result.dead_letters:
        print(f"segack replay: {counted(result.dead_letters, 'event')} set aside as dead letters in this run "
              f"(they or an earlier event of their key failed)")
    if result.dead_letters_left:
        print(f"segack replay: not complete: {counted(result.dead_letters_left, 'event')} set aside as dead "
              f"letters remain; `segack dead-letters {args.checkpoint}` lists them, and a run with "
              f"--retry-dead-letters handles them again", file=sys.stderr)
        return ExitCode.DEAD_LETTERS
    if not result.complete:
        print(f"segack replay: not complete: {result.done:,} of {result.total:,} events done",
              file=sys.stderr)
        return ExitCode.FAILED
    return ExitCode.OK


def _share(fraction: float) -> str:
    """A share as a percentage, with a second decimal where one would show nothing."""
    return f"{fraction:.2%}" if 0 < fraction < 0.01 else f"{fraction:.1%}"


def plan_command(args: argparse.Namespace) -> int:
    """``segack plan``: count the load, print the planned set beside a balanced one, and the floor."""
    from segack.kernel import SegmentSet
    from segack.spark_adapter.coordinator.planning import plan
    from segack.spark_adapter.spark.session import spark_session

    try:
        if args.input is not None:
            check_input_files(args.input, args.format)
    except InputError as error:
        print(f"segack plan: {error}", file=sys.stderr)
        return ExitCode.REFUSED
    master = None if args.remote else (args.master or "local[2]")
    spark = None
    try:
        spark = spark_session(master=master, remote=args.remote, conf=dict(args.conf), quiet=not args.verbose)
        events = read_input(spark, args.input, args.format, dict(args.option), args.table)
        if args.order is not None and args.order not in events.columns:
            raise InputError(f"no column {args.order!r}; the columns are {events.columns}")
        result = plan(events, key=args.key, hash=args.hash, workers=args.workers,
                      key_group_bits=args.key_group_bits, sample=args.sample, top=args.top)
    except (ValueError, OSError) as error:
        print(f"segack plan: {error}", file=sys.stderr)
        return ExitCode.REFUSED
    except Exception as error:
        print(f"segack plan: {worker_error(error)}", file=sys.stderr)
        return ExitCode.FAILED
    finally:
        if spark is not None and not (master is not None and _is_embedded_local(master)):
            spark.stop()
    sampled = f" (estimated from a {result.sample:.0%} sample)" if result.sample else ""
    print(f"{result.total:,} events{sampled}, {2**result.key_group_bits:,} key groups "
          f"({result.key_group_bits} bits), planned for {result.workers} workers")
    if result.hottest:
        width = max(len(str(value)) for value, _ in result.hottest)
        print(f"hottest keys ({args.key}):")
        for value, count in result.hottest:
            print(f"  {value!s:<{width}}  {count:>12,}  {_share(count / max(result.total, 1)):>7}")
        print(f"the hottest key holds {_share(result.hottest_share)} of the events: with per-key order, no "
              f"set of segments makes a run more than {result.floor:.1f}x faster than one worker")
    balanced: SegmentSet = result.balanced
    print(f"{'':<26}{'segments':>9}{'largest':>10}{'speed-up':>10}")
    for name, segments in ((f"planned for {result.workers}", result.segments),
                           (f"balanced({len(balanced)})", balanced)):
        print(f"{name:<26}{len(segments):>9}{result.largest_share(segments):>10.1%}"
              f"{result.speedup(segments):>9.1f}x")
    loads = result.loads(result.segments)
    print("the planned segments:")
    for position, member in enumerate(result.segments):
        print(f"  #{position:<3} id {member.segment_id:<6} mask {member.mask:<6} "
              f"{int(loads[position]):>12,} events  {loads[position] / max(result.total, 1):6.1%}")
    print(f"--segments {result.segments_option}")
    return 0


def _recorded_done(store: CheckpointStore) -> int:
    """Events recorded done, as ``segack status`` counts them."""
    from segack.spark_adapter.store.claims import recorded_state

    tokens = recorded_state(store)[0].tokens
    return 0 if tokens is None else tokens.done


def _replay_process(workdir: str, segments: int) -> subprocess.Popen[bytes]:
    environment = dict(os.environ, SEGACK_DEMO_DB=os.path.join(workdir, "users.sqlite"))
    command = [
        sys.executable, "-m", "segack", "replay", os.path.join(workdir, "events.parquet"),
        "--key", "user", "--order", "ts", "--handler", "segack.demo:sink",
        "--checkpoint", os.path.join(workdir, "checkpoint"), "--segments", str(segments),
        "--batch-size", "100", "--concurrency", "4", "--flush-every", "2000", "--flush-interval", "0.5",
    ]
    return subprocess.Popen(command, env=environment, start_new_session=True)


def demo_command(args: argparse.Namespace) -> int:
    """``segack demo``: replay, crash, rescale and resume, check against sequential processing, in
    ``--workdir`` (else a temporary directory, removed at the end unless ``--keep``)."""
    workdir = args.workdir or tempfile.mkdtemp(prefix="segack-demo-")
    print(f"segack demo: its event log, checkpoint and databases go to {workdir}")
    try:
        return _demo(workdir, args.events)
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
            print(f"segack demo: removed {workdir} (--keep keeps it)")


def _demo(workdir: str, count: int) -> int:
    import pyarrow.parquet as pq

    from segack import demo

    os.makedirs(workdir, exist_ok=True)
    for name in ("users.sqlite", "users.sqlite-wal", "users.sqlite-shm", "expected.sqlite"):
        if os.path.exists(os.path.join(workdir, name)):
            os.remove(os.path.join(workdir, name))
    store = CheckpointStore(os.path.join(workdir, "checkpoint"))
    if store.exists():
        print(f"segack demo: {workdir} already holds a checkpoint; use an empty --workdir", file=sys.stderr)
        return 1
    events = demo.generate_events(count)
    pq.write_table(events, os.path.join(workdir, "events.parquet"))
    users = len(set(events.column("user").to_pylist()))
    print(f"1. wrote {events.num_rows:,} events of {users:,} users (skewed, shuffled) "
          f"to {workdir}/events.parquet")
    demo.sequential_users(events, os.path.join(workdir, "expected.sqlite"))
    print("2. built the expected database by applying every event in time order, sequentially")

    print("3. replaying into SQLite over 4 segments, in lists of up to 100 events, 4 lists in flight per "
          "segment, through a sink that applies each list in one transaction with each user's last applied "
          "position; the run will be killed partway (SIGKILL)")
    first = _replay_process(workdir, 4)
    target = events.num_rows * 0.35
    killed_at = None
    while first.poll() is None:
        time.sleep(0.1)
        try:
            # The tasks' progress files count too: the state alone moves only every merge.
            done = _recorded_done(store)
        except (CheckpointError, CheckpointLocationError):  # not made yet, or written as it was read
            continue
        if done >= target:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            killed_at = _recorded_done(store)
    if killed_at is None and first.returncode != 0:
        print(f"segack demo: the first run failed (exit {first.returncode})", file=sys.stderr)
        return 1
    if killed_at is None or killed_at == events.num_rows:
        print("   the run handled every event before it could be killed")
    else:
        applied = demo.count_events(demo.read_users(os.path.join(workdir, "users.sqlite")))
        print(f"   killed with {killed_at:,} events recorded done (in the checkpoint's state and the "
              f"progress files the next run merges, as `segack status` counts them) and {applied:,} applied "
              f"to the database: the next run is handed again those applied but not recorded, and the sink "
              f"skips them")
    print("4. resuming from the checkpoint with 7 segments instead of 4 (a rescale)")
    second = _replay_process(workdir, 7)
    if second.wait() != 0:
        print(f"segack demo: the resumed run failed (exit {second.returncode})", file=sys.stderr)
        return 1
    got = demo.read_users(os.path.join(workdir, "users.sqlite"))
    expected = demo.read_users(os.path.join(workdir, "expected.sqlite"))
    if got != expected:
        wrong = sum(1 for a, b in zip(got, expected, strict=False) if a != b) + abs(len(got) - len(expected))
        print(f"segack demo: FAILED: the database differs from sequential processing in {wrong} users",
              file=sys.stderr)
        return 1
    print(f"5. checked: all {len(got):,} users ({demo.count_events(got):,} parts) equal sequential "
          f"processing: each event applied exactly once, none before an earlier one of its user")
    return 0
