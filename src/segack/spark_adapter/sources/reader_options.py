"""A reader's options spelled as segack reads them.

Spark matches a reader's option names without regard to case (``readchangefeed=true`` reads a
change feed), so segack does too: before it reads an option it knows, :func:`spelled` gives that
name the spelling segack looks for. Two spellings of one name are refused: Spark would keep
either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from segack.spark_adapter.errors import OptionError

__all__ = ["spelled"]


def spelled(options: Mapping[str, str], names: Iterable[str], prefixes: Iterable[str] = ()) -> dict[str, str]:
    """``options``, each of ``names`` (and each name starting with one of ``prefixes``, its prefix)
    spelled as given here, whatever its case; other options as they are.

    Raises :class:`~segack.spark_adapter.OptionError` for an option given twice in two spellings.
    """
    known = {name.lower(): name for name in names}
    starts = [(prefix.lower(), prefix) for prefix in prefixes]
    found: dict[str, str] = {}
    given: dict[str, str] = {}
    for name, value in options.items():
        lowered = name.lower()
        canonical = known.get(lowered) or next(
            (prefix + name[len(start):] for start, prefix in starts if lowered.startswith(start)), name)
        if canonical.lower() in given:
            raise OptionError(f"option {name!r} is given twice (also as {given[canonical.lower()]!r}); Spark "
                              f"reads option names without regard to case: give it once")
        given[canonical.lower()] = name
        found[canonical] = value
    return found
