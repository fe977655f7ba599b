"""The Kafka partitions a real-time stream reads, each with a number of its own that no later run
changes.

A real-time stream subscribes to topics as Spark's Kafka source does: ``subscribe`` names them
(``a,b``), ``subscribePattern`` matches them (a regular expression the whole name must match, as
Kafka's clients match it; topics whose names begin with ``__``, the brokers' own, never match). Its
checkpoint keeps, in its settings, the topics it has read and their partition counts, in the order it
first read them (``topics``: ``[[name, count], ...]``). A partition's number is its place in that
list: topic ``b``'s partition 2, after topic ``a``'s 3 partitions, is 5. The number is what the
checkpoint keeps the partition's progress under, and a record's key group (its identity for a sink,
and its dead letters'), so it must stay the same for as long as the checkpoint lives: a topic found
later (a new one that matches the pattern, or one added to ``subscribe``) takes the numbers after the
last ones, and a topic the checkpoint holds may neither leave the subscription nor change its count of
partitions (a key's later records could then be in another partition, whose offsets do not order them
after its earlier ones).

A stream of one topic, as every checkpoint before this module recorded it (``topic`` and
``partitions``), numbers the topic's partitions as Kafka does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from segack.spark_adapter.errors import ForeignInputError, InputError, OptionError

__all__ = ["STARTING_AT", "StreamPartitions", "Subscription", "named"]

#: The checkpoint's setting of where each topic's partitions with no progress start (``earliest``
#: or ``latest``, by topic): ``startingOffsets`` for the topics of its first run, ``earliest`` for
#: a topic found later, recorded before any of its partitions' starts.
STARTING_AT = "starting_at"
#: The prefix of the brokers' own topics (``__consumer_offsets``, ``__transaction_state``), which no
#: pattern matches.
INTERNAL_PREFIX = "__"


def named(pair: tuple[str, int]) -> str:
    """A topic-partition as every line names it: ``topic/partition``."""
    return f"{pair[0]}/{pair[1]}"


@dataclass(frozen=True)
class Subscription:
    """The topics a real-time stream reads: ``topics`` named, or those matching ``pattern``."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Subscription:
        """The subscription of reader ``options`` (Spark's spelling): an
        :class:`~segack.spark_adapter.OptionError` unless exactly one of ``subscribe`` (one topic or
        more) and ``subscribePattern`` (a regular expression that compiles) is given."""
        given = [name for name in ("subscribe", "subscribePattern", "assign") if name in options]
        if "assign" in given:
            raise OptionError("a real-time stream subscribes to topics (subscribe=a,b or subscribePattern="
                              "REGEX) and numbers their partitions itself; assign is not for it")
        if len(given) != 1:
            raise OptionError("a real-time stream needs one of the options subscribe (topics, comma-"
                              "separated) and subscribePattern (a regular expression of topic names)")
        if given == ["subscribePattern"]:
            pattern = str(options["subscribePattern"]).strip()
            try:
                re.compile(pattern)
            except re.error as error:
                raise OptionError(f"subscribePattern {pattern!r} is not a regular expression: "
                                  f"{error}") from None
            if not pattern:
                raise OptionError("subscribePattern is empty: give a regular expression of topic names")
            return cls(pattern=pattern)
        topics = tuple(dict.fromkeys(topic.strip() for topic in str(options["subscribe"]).split(",")
                                     if topic.strip()))
        if not topics:
            raise OptionError("subscribe names no topic: give it as subscribe=TOPIC or subscribe=A,B")
        return cls(topics=topics)

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one of the subscription's."""
        if self.pattern is None:
            return topic in self.topics
        return not topic.startswith(INTERNAL_PREFIX) and re.fullmatch(self.pattern, topic) is not None

    def __str__(self) -> str:
        return f"topics matching {self.pattern!r}" if self.pattern is not None else \
            f"topic{'s' if len(self.topics) > 1 else ''} {', '.join(self.topics)}"


@dataclass(frozen=True)
class StreamPartitions:
    """The partitions a checkpoint's stream reads, by number: ``topics``, each topic and its count of
    partitions in the order they were first read; :attr:`pairs` are ``(topic, partition)`` by number."""

    topics: tuple[tuple[str, int], ...] = ()

    @classmethod
    def recorded(cls, settings: Mapping[str, Any]) -> StreamPartitions:
        """What a checkpoint's ``settings`` record (nothing, for a new checkpoint)."""
        if "topics" in settings:
            return cls(tuple((str(name), int(count)) for name, count in settings["topics"]))
        if settings.get("topic") is not None and settings.get("partitions") is not None:
            return cls(((str(settings["topic"]), int(settings["partitions"])),))
        return cls()

    @property
    def pairs(self) -> tuple[tuple[str, int], ...]:
        """Each partition's ``(topic, partition)``, by number."""
        return tuple((name, partition) for name, count in self.topics for partition in range(count))

    @property
    def names(self) -> tuple[str, ...]:
        """The topics, in the order of their numbers."""
        return tuple(name for name, _ in self.topics)

    def numbers(self) -> dict[tuple[str, int], int]:
        """Each ``(topic, partition)``'s number."""
        return {pair: number for number, pair in enumerate(self.pairs)}

    def settings(self) -> dict[str, Any]:
        """The checkpoint's settings that record them."""
        return {"topics": [[name, count] for name, count in self.topics],
                "topic": ",".join(self.names), "partitions": len(self.pairs)}

    def checked(self, found: Mapping[str, int], subscription: Subscription,
                location: str) -> StreamPartitions:
        """These, with the topics of ``found`` (topics and their counts of partitions) that the
        subscription matches and they lack, numbered after them in the order of their names. A topic
        recorded that the subscription no longer names: a
        :class:`~segack.spark_adapter.ForeignInputError`; one whose count of partitions changed, or
        that the brokers lack: an :class:`~segack.spark_adapter.InputError`."""
        for name, count in self.topics:
            if not subscription.matches(name):
                fix = (f"give a pattern that matches {name} too" if subscription.pattern is not None
                       else f"subscribe to {name} too")
                raise ForeignInputError(
                    f"checkpoint {location} is a real-time stream of {_listed(self.names)}, which "
                    f"{subscription} leaves out: a stream of it reads every topic it ever read (its "
                    f"partitions' numbers and progress are the checkpoint's); {fix}, or start a new "
                    f"checkpoint")
            if name not in found:
                raise InputError(f"Kafka topic {name!r}, which this stream reads, does not exist: it was "
                                 f"deleted; start a new checkpoint (with --commit-offsets-to, it starts "
                                 f"where the group is)")
            if found[name] != count:
                raise InputError(changed_partitions(name, count, found[name]))
        known = set(self.names)
        return StreamPartitions(self.topics + tuple(
            (name, found[name]) for name in sorted(found)
            if name not in known and subscription.matches(name)))


def changed_partitions(topic: str, was: int, now: int) -> str:
    """Why a stream cannot go on reading ``topic``, whose count of partitions went from ``was`` to
    ``now``."""
    return (f"topic {topic} has {now} partitions, not the {was} this stream reads: a key's later records "
            f"may now be in another partition, whose offsets do not order them after its earlier ones; "
            f"start a new checkpoint (with --commit-offsets-to, it starts where the group is)")


def _listed(names: tuple[str, ...]) -> str:
    return f"topic {names[0]}" if len(names) == 1 else f"topics {', '.join(names)}"
