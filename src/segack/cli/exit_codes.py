"""What a ``segack`` command's exit status means."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The ``segack`` command's exit status, for schedulers and scripts.

    Every command uses the same codes; ``segack replay`` uses each of them.
    """

    #: Done: every event of the input handled (``replay``), or the command did what it says.
    OK = 0
    #: The run stopped before its end: a Spark task failed, or another run took the checkpoint
    #: over. Its progress was saved: run it again to resume.
    FAILED = 1
    #: The command line is wrong: a flag out of its range, a handler that cannot be imported, a
    #: missing argument. Nothing ran; the message names the flag.
    USAGE = 2
    #: The run reached the end of its input (a stream: drained or stopped as asked), but events set
    #: aside as dead letters remain (``segack dead-letters`` lists them; ``--retry-dead-letters``
    #: handles them again).
    DEAD_LETTERS = 3
    #: The input, the checkpoint or the session cannot be used as given: unreadable or empty input,
    #: nulls in the order column, a path that is not a checkpoint, a checkpoint of other input or
    #: held by another run. Nothing was written.
    REFUSED = 4
    #: The handler raised on the same event through all its retries, under ``--on-error stop``. The
    #: progress before that event was saved, but running again fails the same way until its cause
    #: (the handler, the event, a service it calls) is fixed; ``--on-error dead-letter`` sets such
    #: events aside instead.
    HANDLER_FAILED = 5


def exit_status_help() -> str:
    """The codes in one line, as a command's ``--help`` ends."""
    return "exit status: " + ", ".join(f"{code.value} {code.name.lower().replace('_', ' ')}"
                                       for code in ExitCode) + " (see the docs' exit codes)"
