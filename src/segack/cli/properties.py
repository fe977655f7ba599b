"""Java properties files, as Kafka users keep a client's settings (``client.properties``, what
Kafka's own tools take with ``--command-config``), read by the rules of Java's
``java.util.Properties.load``:

1. **Lines.** A line ending in an odd number of backslashes goes on on the next, whose leading
   blanks are dropped. A line whose first character past its blanks is ``#`` or ``!`` is a comment;
   a blank line is nothing.
2. **Name and value.** The name runs up to the first ``=``, ``:`` or blank not escaped; then blanks,
   at most one ``=`` or ``:``, and blanks are skipped; the value is the rest of the line.
3. **Escapes**, in names and values: ``\\t``, ``\\n``, ``\\r``, ``\\f``, ``\\uXXXX``; a backslash
   before any other character is that character.
"""

from __future__ import annotations

import re

from segack.errors import SegackValueError

__all__ = ["read_properties"]

_BLANKS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> list[str]:
    """Rule 1: the lines that hold a setting, each continued line joined."""
    lines: list[str] = []
    pending: str | None = None
    for natural in re.split(r"\r\n|\r|\n", text):
        line = natural.lstrip(_BLANKS) if pending is not None else natural
        if pending is None and (not line.strip(_BLANKS) or line.lstrip(_BLANKS)[:1] in ("#", "!")):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending = (pending or "") + line[:-1]
            continue
        lines.append((pending or "") + line)
        pending = None
    if pending is not None:
        lines.append(pending)
    return lines


def _unescaped(text: str, where: str) -> str:
    """Rule 3."""
    out, index = [], 0
    while index < len(text):
        char = text[index]
        if char != "\\" or index + 1 == len(text):
            out.append(char)
            index += 1
            continue
        escaped = text[index + 1]
        if escaped == "u":
            digits = text[index + 2:index + 6]
            if not re.fullmatch(r"[0-9A-Fa-f]{4}", digits):
                raise SegackValueError(f"{where}: \\u must be followed by four hexadecimal digits")
            out.append(chr(int(digits, 16)))
            index += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        index += 2
    return "".join(out)


def read_properties(text: str, where: str = "the properties") -> list[tuple[str, str]]:
    """The settings ``(name, value)`` of a properties file's ``text``, in the file's order.

    Raises
    ------
    SegackValueError
        A ``\\u`` escape without four hexadecimal digits (``where`` names the file in the message).
    """
    settings = []
    for line in _logical_lines(text):
        line = line.lstrip(_BLANKS)
        end = 0
        while end < len(line) and line[end] not in "=:" + _BLANKS:
            end += 2 if line[end] == "\\" else 1
        end = min(end, len(line))
        rest = line[end:].lstrip(_BLANKS)
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(_BLANKS)
        settings.append((_unescaped(line[:end], where), _unescaped(rest, where)))
    return settings
