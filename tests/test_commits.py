"""Commit streams over the kernel and the spec acker."""

from __future__ import annotations

import asyncio

import pytest

from segack.errors import DuplicateAckError


def completions(order):
    return [(index, f"offset-{index}") for index in order]


def test_yields_each_advance_and_the_end(impl):
    points = list(impl.commit_points(completions([1, 0, 2, 4, 3])))
    assert points == ["offset-1", "offset-2", "offset-4"]


def test_every_n_throttles_but_the_end_is_never_lost(impl):
    points = list(impl.commit_points(completions(range(10)), every=4))
    assert points == ["offset-3", "offset-7", "offset-9"]


def test_interval_throttles_by_time(impl):
    points = list(impl.commit_points(completions(range(50)), interval=3600))
    assert points == ["offset-49"]


def test_failure_yields_the_last_committable_point_then_reraises(impl):
    def failing():
        yield from completions([0, 2, 1])
        raise RuntimeError("source broke")

    stream = impl.commit_points(failing(), every=100)
    assert next(stream) == "offset-2"
    with pytest.raises(RuntimeError, match="source broke"):
        next(stream)


def test_an_acker_error_also_stops_the_stream_after_the_pending_point(impl):
    stream = impl.commit_points(completions([0, 1, 1]), every=10)
    assert next(stream) == "offset-1"
    with pytest.raises(DuplicateAckError):
        next(stream)


def test_feeds_a_given_acker(impl):
    acker = impl.OffsetAcker(100)
    assert list(impl.commit_points(completions([100, 101]), acker=acker)) == ["offset-100", "offset-101"]
    assert acker.next_index == 102


@pytest.mark.parametrize("kwargs", [{"every": 0}, {"every": 1.5}, {"interval": -1}])
def test_bad_throttles(impl, kwargs):
    with pytest.raises(ValueError):
        list(impl.commit_points([], **kwargs))


def test_async_stream_matches_and_survives_failure(impl):
    async def source():
        for pair in completions([1, 0, 3, 2]):
            yield pair
        raise RuntimeError("late failure")

    async def collect():
        seen = []
        with pytest.raises(RuntimeError, match="late failure"):
            async for point in impl.commit_points_async(source(), every=5):
                seen.append(point)
        return seen

    assert asyncio.run(collect()) == ["offset-3"]


def test_every_one_and_interval_zero_yield_every_advance(impl):
    """The smallest settings allowed throttle nothing: each advance is yielded as it happens."""
    every_advance = ["offset-1", "offset-2", "offset-4"]
    assert list(impl.commit_points(completions([1, 0, 2, 4, 3]), every=1)) == every_advance
    assert list(impl.commit_points(completions([1, 0, 2, 4, 3]), interval=0)) == every_advance
    assert list(impl.commit_points(completions([1, 0, 2, 4, 3]), every=1, interval=0)) == every_advance
