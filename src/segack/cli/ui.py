"""``segack ui``: the page that follows a checkpoint, its controls and its metrics."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from segack.cli.exit_codes import ExitCode
from segack.cli.output import refused

#: The environment variable a token may come in (``--token`` is seen by every user through ``ps``).
TOKEN_ENV = "SEGACK_UI_TOKEN"


def _token(args: argparse.Namespace) -> str | None:
    """The token ``--token-file``, ``--token`` or :data:`TOKEN_ENV` gives, in that order; ``None``
    for none (the page makes one if it needs one)."""
    from segack.spark_adapter.errors import OptionError

    if args.token_file is not None:
        try:
            with open(args.token_file, encoding="utf-8") as file:
                token = file.readline().strip()
        except OSError as error:
            raise OptionError(f"argument --token-file: cannot read {args.token_file}: "
                              f"{error.strerror or error}") from None
        except UnicodeDecodeError:
            raise OptionError(f"argument --token-file: {args.token_file} is not UTF-8 text") from None
        if not token:
            raise OptionError(f"argument --token-file: {args.token_file} holds no token on its first line")
        return token
    return args.token if args.token is not None else (os.environ.get(TOKEN_ENV) or None)


def run(args: argparse.Namespace) -> int:
    """``segack ui``: serves until Ctrl-C or SIGTERM, then exits 0."""
    try:
        from segack.spark_adapter.console.page import serve_page
    except ImportError as error:
        from segack.extras import install_hint

        print(f"segack ui: needs Flask ({error}): {install_hint('ui')}", file=sys.stderr)
        return ExitCode.USAGE
    from segack.spark_adapter.errors import OptionError
    from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore

    try:
        token = _token(args)
        store = CheckpointStore(args.checkpoint)
        store.load()  # a location that is not a checkpoint is refused here, not on the page
        server = serve_page(store, args.host, args.port, token, read_only=args.read_only)
    except OptionError as error:
        print(f"segack ui: {error}", file=sys.stderr)
        return ExitCode.USAGE
    except (CheckpointError, ValueError, OSError) as error:
        return refused("ui", error)
    stop = threading.Event()
    previous = {number: signal.signal(number, lambda *_: stop.set())
                for number in (signal.SIGTERM, signal.SIGINT)}
    controls = logging.getLogger("segack.spark_adapter.console.controls")
    controls_level = controls.level
    controls.setLevel(logging.INFO)  # each control done is printed
    mode = ", read-only" if args.read_only else ""
    # A token the user gave is theirs to keep: only one made here is printed.
    given = "" if token is None else "; requests carry the token given"
    address = server.url if token is None else server.address
    print(f"segack ui: serving {store.location} on {address} (Ctrl-C stops{mode}{given})", flush=True)
    try:
        stop.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        controls.setLevel(controls_level)
        server.close()
    return ExitCode.OK
