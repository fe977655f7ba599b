"""``segack replay`` and ``segack stream``: a run over the input, or a query over a stream, through
the handler, with its progress, its stop on a signal and its last lines."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from segack.cli.exit_codes import ExitCode
from segack.cli.flags import REAL_TIME, run_keywords
from segack.cli.output import ProgressPrinter, counted, say
from segack.cli.session import (
    importable_from_here,
    interrupt,
    spark_master,
    start_session,
    stop_session,
    stop_signals,
)
from segack.spark_adapter.coordinator.replay import ReplayResult, load_handler, replay, worker_error
from segack.spark_adapter.errors import HandlerFailedError, OptionError, ReplayError
from segack.spark_adapter.results import STARTUP, BatchReport, RealTimeReport, StreamResult
from segack.spark_adapter.sources.files import check_input_files, read_input
from segack.spark_adapter.store.checkpoint import CheckpointStore

if TYPE_CHECKING:
    from segack.spark_adapter.coordinator.query import StopRequest

log = logging.getLogger("segack.cli")


@dataclasses.dataclass(frozen=True)
class _Job:
    """The run a ``replay`` or ``stream`` command line asks for, made once, as the command starts."""

    handler: Callable[..., Any]
    #: Files the handler imports, sent to the executors.
    py_files: list[str]
    store: CheckpointStore
    #: The run options, as the keywords of :func:`~segack.spark_adapter.replay` and
    #: :func:`~segack.spark_adapter.stream` take them.
    options: dict[str, Any]


def run(args: argparse.Namespace) -> int:
    """``segack replay`` or ``segack stream``: an :class:`~segack.cli.ExitCode`."""
    job = _prepare(args)
    if isinstance(job, ExitCode):
        return job
    return _replay(args, job) if args.command == "replay" else _stream(args, job)


def _prepare(args: argparse.Namespace) -> _Job | ExitCode:
    """What ``replay`` and ``stream`` check before Spark starts: the handler, the files to ship, the
    checkpoint's location and INPUT; a refusal prints its line and is its exit code."""
    command = f"segack {args.command}"
    importable_from_here()
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
    return _Job(handler, py_files, store, run_keywords(args))


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


def _replay(args: argparse.Namespace, job: _Job) -> int:
    """``segack replay``: an :class:`~segack.cli.ExitCode`, with a one-line reason unless it is ``OK``.
    SIGTERM or Ctrl-C stops the run at once, its tasks' progress up to their last flush kept."""
    store = job.store
    printer = ProgressPrinter()
    spark = None
    # A plain flag: a signal handler must not wait for a lock its own thread may hold.
    stop = types.SimpleNamespace(asked=False)

    def asked(number: int, frame: Any) -> None:
        if not stop.asked:
            say("\nsegack replay: stopping now; the progress saved so far is kept")
        stop.asked = True
        if spark is not None:
            interrupt(spark)

    try:
        with printer.phases(args.verbose), stop_signals(asked) as again:
            STARTUP.info("starting Spark (%s)", "Spark Connect" if args.remote else spark_master(args))
            spark = start_session(args, job.py_files)
            again()
            if stop.asked:
                print(f"segack replay: stopped as asked, before the run started ({store.location})",
                      file=sys.stderr)
                return ExitCode.FAILED
            try:
                events = read_input(spark, args.input, args.format, dict(args.option), args.table)
            except OptionError as error:  # of --option, read with Spark: a flag's error, as in stream
                printer.close()
                print(f"segack replay: {error}", file=sys.stderr)
                return ExitCode.USAGE
            source = args.input if args.table is None else f"table {args.table}"
            result = replay(events, key=args.key, order=args.order, handler=job.handler, checkpoint=store,
                            progress=printer, source=source, metrics_port=args.metrics_port,
                            **job.options)
    except Exception as error:
        printer.close()
        if stop.asked:
            print(f"segack replay: stopped as asked; run it again to resume ({store.location})",
                  file=sys.stderr)
            return ExitCode.FAILED
        return _failure_code(args, error)
    finally:
        stop_session(spark, args)
    printer.close()
    return _report(result, args)


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


def _stream_events(spark: Any, args: argparse.Namespace) -> Any:
    """``segack stream``'s events: Kafka records (:func:`~segack.spark_adapter.kafka_stream`), or a
    stream of the files at INPUT (their schema read from them) or of a table."""
    from segack.spark_adapter.sources.kafka import kafka_stream

    if args.format == "kafka":
        return kafka_stream(spark, dict(args.option), args.value_schema, args.value_format)
    return read_input(spark, args.input, args.format, dict(args.option), args.table, streaming=True)


def _stream(args: argparse.Namespace, job: _Job) -> int:
    """``segack stream``: runs until the input is drained (``--trigger available-now``) or SIGTERM or
    Ctrl-C asks it to stop; an :class:`~segack.cli.ExitCode`."""
    from segack.spark_adapter.coordinator.query import StopRequest, stream
    from segack.spark_adapter.coordinator.query_watch import DEFAULT_STOP_TIMEOUT
    from segack.spark_adapter.sources.kafka_settings import java_options
    from segack.spark_adapter.sources.value_formats import value_registry

    if args.trigger == REAL_TIME:
        return _stream_real_time(args, job)
    if args.commit_interval is not None:
        print("segack stream: --commit-interval is for --trigger real-time; a micro-batch stream commits "
              "after each micro-batch", file=sys.stderr)
        return ExitCode.USAGE
    if args.stop_timeout is None:
        args.stop_timeout = DEFAULT_STOP_TIMEOUT
    if args.format == "kafka":
        try:
            java_options(value_registry(dict(args.option), args.value_format)[1])
        except OptionError as error:  # before Spark starts: the options alone say it
            print(f"segack stream: {error}", file=sys.stderr)
            return ExitCode.USAGE
    store = job.store
    stop = StopRequest()
    asked = _stopping(stop, "at the end of the micro-batch under way")

    spark = None
    try:
        with stop_signals(asked) as again:
            spark = start_session(args, job.py_files)
            again()
            if stop.asked.is_set():
                print("segack stream: stopped as asked, before the query started", file=sys.stderr)
                return ExitCode.OK
            try:
                events = _stream_events(spark, args)
            except OptionError as error:  # of --value-schema or --option, read with Spark: a flag's error
                print(f"segack stream: {error}", file=sys.stderr)
                return ExitCode.USAGE
            result = stream(events, key=args.key, order=args.order, handler=job.handler, checkpoint=store,
                            trigger=args.trigger, commit_offsets_to=args.commit_offsets_to, stop=stop,
                            stop_timeout=args.stop_timeout, progress=_print_batch,
                            metrics_port=args.metrics_port, **job.options)
    except Exception as error:
        return _failure_code(args, error)
    finally:
        stop_session(spark, args)
    if result.interrupted:
        print(f"segack stream: stopped at once as asked, its micro-batch under way incomplete; its progress "
              f"is saved: run it again to resume ({store.location})", file=sys.stderr)
        return ExitCode.FAILED
    return _stream_report(result, args)


#: What a real-time stream's command line cannot have, and why: ``(flag, attribute, allowed, why)``.
_NOT_REAL_TIME = (
    ("--format", "format", "kafka", "a real-time stream reads a Kafka topic"),
    ("--key", "key", "key", "a real-time stream's key is the record's Kafka key (--key key)"),
    ("--order", "order", "offset", "a real-time stream's order is the record's offset (--order offset)"),
    ("--stop-timeout", "stop_timeout", None, "a real-time stream stops once the calls it read finish"),
)


def _stopping(stop: StopRequest, first: str) -> Callable[[int, Any], None]:
    """The signal handler of ``segack stream``: the first signal stops ``stop``'s stream ``first``,
    the second at once."""
    def asked(number: int, frame: Any) -> None:
        then = "now" if stop.asked.is_set() else f"{first} (again: now)"
        say(f"segack stream: stopping {then}")
        # Its events' locks are not for a signal handler, which may have interrupted their holder.
        threading.Thread(target=stop.set, name="segack-stop", daemon=True).start()
    return asked


def _stream_real_time(args: argparse.Namespace, job: _Job) -> int:
    """``segack stream --trigger real-time``: until SIGTERM or Ctrl-C (the calls read finish, exit
    0; twice: at once, exit 1, the progress saved so far kept) or a failure."""
    from segack.spark_adapter.coordinator.query import StopRequest
    from segack.spark_adapter.coordinator.realtime import (
        BATCH_ONLY_OPTIONS,
        check_topics,
        real_time_options,
        stream_real_time,
    )
    from segack.spark_adapter.sources.value_formats import value_registry

    batch_only = [("--" + name.replace("_", "-"), name, unset, "a real-time stream's tasks own Kafka "
                   "partitions, read as records arrive") for name, unset in BATCH_ONLY_OPTIONS.items()]
    for flag, name, allowed, why in (*_NOT_REAL_TIME, *batch_only):
        if getattr(args, name, allowed) != allowed:
            print(f"segack stream: {flag} is not for --trigger real-time: {why}", file=sys.stderr)
            return ExitCode.USAGE
    if args.value_schema is None:
        print("segack stream: --value-schema is required for Kafka", file=sys.stderr)
        return ExitCode.USAGE
    try:
        real_time_options(dict(args.option))
        value_registry(dict(args.option), args.value_format)
    except OptionError as error:  # before Spark starts: the options alone say it
        print(f"segack stream: {error}", file=sys.stderr)
        return ExitCode.USAGE
    stop = StopRequest()
    asked = _stopping(stop, "once the calls read finish")

    spark = None
    try:
        with stop_signals(asked) as again:
            check_topics(dict(args.option), job.store)  # before Spark starts: Kafka and the checkpoint
            spark = start_session(args, job.py_files)
            again()
            if stop.asked.is_set():
                print("segack stream: stopped as asked, before the stream started", file=sys.stderr)
                return ExitCode.OK
            result = stream_real_time(
                spark, dict(args.option), args.value_schema, handler=job.handler, checkpoint=job.store,
                value_format=args.value_format, commit_interval=args.commit_interval or 1.0,
                commit_offsets_to=args.commit_offsets_to,
                stop=stop, progress=_RealTimeLine(), metrics_port=args.metrics_port, **job.options)
    except Exception as error:
        return _failure_code(args, error)
    finally:
        stop_session(spark, args)
    if stop.now.is_set():
        print(f"segack stream: stopped at once as asked; each partition's progress up to its last save is "
              f"kept: run it again to resume ({job.store.location})", file=sys.stderr)
        return ExitCode.FAILED
    lag = "" if result.partitions and None in [p.lag for p in result.partitions] else (
        f", {counted(sum(p.lag or 0 for p in result.partitions), 'record')} behind")
    retried = "" if not (result.retried or result.retry_failed) else (
        f"; {counted(result.retried, 'dead letter')} retried and handled, {result.retry_failed:,} kept")
    print(f"segack stream: stopped as asked: {result.handled:,} events handled, "
          f"{counted(result.dead_letters, 'dead letter')}{lag}, in {result.seconds:.1f} s{retried}")
    if result.group_behind:
        print(f"segack stream: consumer group {args.commit_offsets_to} lacks some partitions' progress: "
              f"the commits failed (--verbose says why); the next run commits what the checkpoint holds",
              file=sys.stderr)
    return _dead_letters_left(result.dead_letters_left, args)


class _RealTimeLine:
    """Prints a real-time stream's progress every :data:`EVERY` seconds: events handled, the rate,
    the lag, and the partition that holds the run back."""

    EVERY = 10.0

    def __init__(self) -> None:
        self.last: RealTimeReport | None = None

    def __call__(self, report: RealTimeReport) -> None:
        if self.last is not None and report.seconds - self.last.seconds < self.EVERY:
            return
        rate = "" if self.last is None else (
            f" ({(report.handled - self.last.handled) / (report.seconds - self.last.seconds):,.0f}/s)")
        lag = "" if report.lag is None else f", {counted(report.lag, 'record')} behind"
        busiest = report.holding_back
        where = busiest and (busiest.partition if busiest.topic is None
                             else f"{busiest.topic}/{busiest.partition}")
        held = "" if busiest is None else (f"; partition {where} holds it back "
                                           f"({counted(busiest.pending, 'record')} pending)")
        print(f"segack stream: real-time: {report.handled:,} events handled{rate}{lag}{held}", flush=True)
        self.last = report


def _print_batch(report: BatchReport) -> None:
    lag = "" if report.lag is None else f", {counted(report.lag, 'record')} behind"
    print(f"segack stream: batch {report.batch_id}: {counted(report.events, 'event')} in "
          f"{report.seconds:.1f} s; {report.events_so_far:,} so far{lag}")


def _stream_report(result: StreamResult, args: argparse.Namespace) -> int:
    """What ``segack stream`` prints at its end, and its exit code."""
    why = "stopped as asked" if result.stopped else "the input is drained"
    last = ("no micro-batch complete" if result.last_batch is None
            else f"batch {result.last_batch} the last complete")
    batches = "1 micro-batch" if result.batches == 1 else f"{result.batches:,} micro-batches"
    print(f"segack stream: {why}: {batches}, {result.handled:,} events handled, {last}, in "
          f"{result.seconds:.1f} s")
    if result.cut_short_batch is not None:
        print(f"segack stream: micro-batch {result.cut_short_batch} still ran {args.stop_timeout:g} s after "
              f"the stop (--stop-timeout): its tasks finished their calls in flight and saved its progress; "
              f"the next run finishes it")
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
    return _dead_letters_left(result.dead_letters_left, args)


def _dead_letters_left(left: int, args: argparse.Namespace) -> int:
    """A stream's exit code, in either mode, once its end is printed: :attr:`ExitCode.DEAD_LETTERS`,
    saying so, while ``left`` dead letters remain in the checkpoint."""
    if not left:
        return ExitCode.OK
    print(f"segack stream: {counted(left, 'event')} set aside as dead letters remain; `segack dead-letters "
          f"{args.checkpoint}` lists them, and a run with --retry-dead-letters handles them again",
          file=sys.stderr)
    return ExitCode.DEAD_LETTERS
