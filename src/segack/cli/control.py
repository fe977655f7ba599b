"""``segack split``, ``merge``, ``scale`` and ``release``: an operator's changes to a checkpoint,
done at once on one no run holds, or asked of the live run (the page's controls do the same)."""

from __future__ import annotations

import argparse
import os

from segack.cli.exit_codes import ExitCode
from segack.cli.output import refused


def run(args: argparse.Namespace) -> int:
    """``segack split``, ``merge``, ``scale`` or ``release``: an :class:`~segack.cli.ExitCode`."""
    return _release(args) if args.command == "release" else _rescale(args)


def _release(args: argparse.Namespace) -> int:
    from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore
    from segack.spark_adapter.store.claims import force_release

    try:
        store = CheckpointStore(args.checkpoint)
        store.load_existing()
        released = force_release(store, f"segack release --force (pid {os.getpid()})")
    except (CheckpointError, ValueError, OSError) as error:
        return refused("release", error)
    if released is None:
        print(f"segack release: {store.location} is not claimed; nothing to do")
    else:
        print(f"segack release: released the claim of {released.owner()}; should it come back, it is fenced")
    return ExitCode.OK


def _rescale(args: argparse.Namespace) -> int:
    from segack.spark_adapter.store import rescale
    from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore

    command = f"segack {args.command}"
    try:
        store = CheckpointStore(args.checkpoint)
        if args.command == "split":
            outcome = rescale.split(store, args.segment_id, claim_timeout=args.claim_timeout)
        elif args.command == "merge":
            outcome = rescale.merge(store, args.segment_id, claim_timeout=args.claim_timeout)
        else:
            outcome = rescale.scale(store, args.segments, workers=args.workers,
                                    claim_timeout=args.claim_timeout)
    except (CheckpointError, ValueError, OSError) as error:
        return refused(args.command, error)
    print(f"{command}: {outcome.describe()}")
    return ExitCode.OK
