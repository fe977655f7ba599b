"""Per-key-group tokens without Spark: applying updates, bytes, damage, and what a resume keeps."""

from __future__ import annotations

import datetime
import zlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segack.spark_adapter import OptionError
from segack.spark_adapter.store.tokens import (
    KeyGroupTokens,
    TokenError,
    decode_updates,
    encode_updates,
    update_schema,
)
from tests.outcomes import exactly

ORDER, KEY = pa.int64(), pa.string()


def _updates(rows, order_type=ORDER, key_type=KEY):
    """An update table from ``(kg, committed, run_start, order, key, tie, extras)`` tuples, with
    ``(done_xor, done_sum)`` appended when a tuple leaves them out."""
    rows = [row if len(row) == 9 else (*row, row[1] * 3, row[1] * 5) for row in rows]
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in range(9)]
    return pa.table([pa.array(list(values), field.type) for values, field in
                     zip(columns, update_schema(order_type, key_type), strict=True)],
                    schema=update_schema(order_type, key_type))


def _tokens(counts, bits=3):
    tokens = KeyGroupTokens.empty(bits, ORDER, KEY)
    padded = np.zeros(2**bits, dtype=np.int64)
    padded[: len(counts)] = counts
    tokens.set_counts(padded)
    return tokens


def _state(tokens):
    return (tokens.base.tolist(), tokens.count.tolist(), tokens.counted, tokens.committed.tolist(),
            {g: int(tokens.run_start[g]) for g in tokens.boundaries}, dict(tokens.boundaries),
            {g: sorted(p) for g, p in tokens.extras.items()}, tokens.done_xor.tolist(),
            tokens.done_sum.tolist())


def test_an_update_moves_committed_points_and_records_boundaries():
    tokens = _tokens([5, 3, 0, 2])
    moved = tokens.apply(_updates([(0, 3, 1, 10, "a", 7, None), (1, 1, 0, 4, "b", 9, [2])]))
    assert moved == 2
    assert tokens.committed.tolist()[:4] == [3, 1, 0, 0]
    assert tokens.boundaries == {0: (10, "a", 7), 1: (4, "b", 9)}
    assert tokens.extras == {1: {2}}
    assert tokens.done_xor.tolist()[:2] == [9, 3] and tokens.done_sum.tolist()[:2] == [15, 5]
    assert tokens.done == 5 and tokens.total == 10 and not tokens.complete
    assert tokens.first_kept_positions().tolist()[:4] == [1, 0, 0, 0]


def test_updates_are_idempotent_and_order_free():
    newer = _updates([(0, 4, 3, 12, "c", 1, None)])
    older = _updates([(0, 2, 1, 8, "a", 5, [3])])
    one, two = _tokens([6]), _tokens([6])
    one.apply(older)
    one.apply(newer)
    two.apply(newer)
    two.apply(older)
    two.apply(newer)
    assert _state(one) == _state(two)
    # The older update's extra (position 3) now lies below the committed point: it is dropped.
    assert one.committed[0] == 4 and one.extras == {}


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 9), st.lists(st.integers(0, 8), max_size=3)),
                max_size=8), st.randoms())
def test_applying_updates_in_any_order_gives_the_same_tokens(updates, random):
    rows = [(group, committed, committed - 1, committed * 10, f"k{committed}", committed,
             sorted({p for p in extras if p >= committed}) or None)
            for group, committed, extras in updates]
    shuffled = list(rows)
    random.shuffle(shuffled)
    one, two = _tokens([9, 9, 9, 9]), _tokens([9, 9, 9, 9])
    for row in rows:
        one.apply(_updates([row]))
    two.apply(_updates(shuffled))
    assert _state(one) == _state(two)
    for group in range(4):
        expected = max([committed for g, committed, _ in updates if g == group], default=0)
        assert one.committed[group] == expected


@pytest.mark.parametrize(("row", "message"), [
    ((8, 1, 0, 1, "a", 1, None), r"outside 0\.\.7"),
    ((0, 6, 5, 1, "a", 1, None), r"outside 0\.\.5"),
    ((0, 2, 0, 1, "a", None, None), "no valid boundary"),
    ((0, 2, 2, 1, "a", 1, None), "no valid boundary"),
    ((0, 2, 1, 1, "a", 1, [5]), "outside the input"),
])
def test_contradicting_updates_are_refused_and_change_nothing(row, message):
    tokens = _tokens([5])
    tokens.apply(_updates([(0, 1, 0, 3, "x", 4, None)]))
    before = _state(tokens)
    with pytest.raises(TokenError, match=message):
        tokens.apply(_updates([(0, 1, 0, 3, "x", 4, None), row]))
    assert _state(tokens) == before


def test_a_new_input_continues_positions_and_needs_the_last_one_done():
    tokens = _tokens([2, 1])
    tokens.apply(_updates([(0, 2, 1, 5, "a", 1, None)]))
    with pytest.raises(ValueError, match="not complete"):
        tokens.start_input()
    tokens.apply(_updates([(1, 1, 0, 6, "b", 2, None)]))
    tokens.start_input()
    assert tokens.base.tolist()[:3] == [2, 1, 0] and tokens.committed.tolist()[:3] == [2, 1, 0]
    assert tokens.boundaries == {} and tokens.done == 0 and tokens.total is None and not tokens.counted
    assert tokens.done_xor.tolist() == [0] * 8 and tokens.first_kept_positions().tolist()[:3] == [2, 1, 0]
    with pytest.raises(TokenError, match=r"outside 2\.\."):
        tokens.apply(_updates([(0, 1, 0, 5, "a", 1, None)]))
    tokens.apply(_updates([(0, 4, 3, 5, "a", 1, None)]))
    tokens.count_from_committed()
    assert tokens.complete and tokens.total == 2 and tokens.count.tolist()[:2] == [2, 0]


def test_counts_unknown_until_set_and_never_below_what_is_done():
    tokens = KeyGroupTokens.empty(2, pa.null(), pa.null())
    assert tokens.total is None and not tokens.complete
    tokens.apply(_updates([(1, 3, 2, 7, "k", 4, [5])]))
    assert (tokens.order_type, tokens.key_type) == (ORDER, KEY), "types come with the first update"
    before = _state(tokens)
    for counts in ([0, 2, 0, 0], [0, 5, 0, 0], [1, 2, 3]):
        with pytest.raises(ValueError, match="counts"):
            tokens.set_counts(np.array(counts))
    assert _state(tokens) == before
    back = KeyGroupTokens.from_bytes(tokens.to_bytes(), 2)
    assert _state(back) == before and back.total is None
    tokens.set_counts(np.array([0, 6, 0, 0]))
    assert tokens.total == 6 and tokens.done == 4
    # With nothing done and nothing counted there is no row to tell: the flag must still survive.
    for flag in (False, True):
        blank = KeyGroupTokens.empty(2, ORDER, KEY)
        if flag:
            blank.set_counts(np.zeros(4, dtype=np.int64))
        assert KeyGroupTokens.from_bytes(blank.to_bytes(), 2).counted is flag


@pytest.mark.parametrize(("order_type", "value"), [
    (pa.timestamp("us", tz="UTC"), datetime.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC)),
    (pa.float64(), float("nan")),
    (pa.decimal128(20, 3), None),
    (pa.string(), "ünïcødé"),
    (pa.date32(), datetime.date(1999, 12, 31)),
])
def test_tokens_round_trip_through_bytes_with_their_types(order_type, value):
    tokens = KeyGroupTokens.empty(4, order_type, pa.int64())
    counts = np.zeros(16, dtype=np.int64)
    counts[[1, 5, 9]] = [3, 4, 1]
    tokens.set_counts(counts)
    tokens.apply(_updates([(5, 3, 1, value, 77, -5, [3])], order_type, pa.int64()))
    back = KeyGroupTokens.from_bytes(tokens.to_bytes(), 4)
    assert (back.order_type, back.key_type) == (order_type, pa.int64())
    got, want = _state(back), _state(tokens)
    if order_type == pa.float64():  # NaN != NaN; compare it apart
        assert np.isnan(got[5][5][0]) and np.isnan(want[5][5][0])
        got[5][5] = want[5][5] = None
    assert got == want


def test_every_damaged_byte_is_refused_or_reads_the_same():
    tokens = _tokens([4, 2, 0, 7])
    tokens.apply(_updates([(0, 2, 0, 5, "a", 3, [3]), (3, 7, 6, 9, "z", 1, None)]))
    data = tokens.to_bytes()
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0x10
        try:
            back = KeyGroupTokens.from_bytes(bytes(damaged), 3)
        except TokenError:
            continue
        assert _state(back) == _state(tokens)
    for cut in (0, 3, 6, 9, len(data) - 1):
        with pytest.raises(TokenError):
            KeyGroupTokens.from_bytes(data[:cut], 3)
    with pytest.raises(TokenError, match="not segack key-group progress"):
        KeyGroupTokens.from_bytes(b"PAR1" + data[4:], 3)
    with pytest.raises(TokenError, match="not segack key-group progress"):
        decode_updates(data)


def test_tokens_that_contradict_themselves_are_refused():
    tokens = _tokens([1])
    tokens.committed[0] = 2  # past the key group's one event: not something apply() allows
    with pytest.raises(TokenError, match="outside its key group"):
        KeyGroupTokens.from_bytes(tokens.to_bytes(), 3)
    finer = KeyGroupTokens.empty(4, ORDER, KEY)
    finer.committed[9] = 1
    with pytest.raises(TokenError, match=r"not distinct values in 0\.\.7"):
        KeyGroupTokens.from_bytes(finer.to_bytes(), 3)


def test_update_bytes_round_trip_and_refuse_damage():
    updates = _updates([(2, 5, 3, 1, "k", 8, [7, 9], -4, 2**40)])
    data = encode_updates(updates)
    assert decode_updates(data).equals(updates)
    with pytest.raises(TokenError, match="checksum"):
        decode_updates(data[:-1] + bytes([data[-1] ^ 1]))


@pytest.mark.parametrize("bits", [-1, 17, True, 2.0])
def test_a_resolution_outside_0_to_16_is_refused(bits):
    with pytest.raises(OptionError, match="key_group_bits"):
        KeyGroupTokens.empty(bits, ORDER, KEY)


def test_a_sealed_progress_file_whose_column_names_are_not_text_is_damage():
    """Found by `nox -s fuzz`: an Arrow stream with a valid checksum and a non-UTF-8 field name."""
    import base64
    import struct
    import zlib

    from segack.spark_adapter.store import tokens

    body = base64.b64decode(
        "/////3gAAAAQAAAAAAAKAAwABgAFAAgACgAAAAABBAAMAAAACAAIAAAABAAIAAAABAAAAAEAAAAUAAAAEAAUAAgABgAHAAwA"
        "AAAQABAAAAAAAAECEAAAABwAAAAEAAAAAAAAAAIAAABr/wAACAAMAAgABwAIAAAAAAAAASAAAAD/////AAAAAAAAAG1hdBwA"
        "AAAEAAAAAAAAAAIAAABrRwAACAAQAARzAAwADHNlZ2FjayI6IDkyCiB9"
    )
    data = tokens._UPDATES_MAGIC + struct.pack(">I", zlib.crc32(body)) + body
    with pytest.raises(TokenError, match="damaged"):
        tokens.decode_updates(data)


# ---------------------------------------------------------------- the sealed format, read apart
#
# A sealed file is a 5-byte magic (4 letters and a format version), a big-endian CRC-32 of the
# rest, and an Arrow IPC stream. These tests read and write that format themselves, so they check
# the bytes segack writes against the documented layout, not against segack's own reader.

TOKENS_MAGIC = b"SGKT\x02"


def _open(data, magic=TOKENS_MAGIC):
    assert data[:5] == magic
    assert int.from_bytes(data[5:9], "big") == zlib.crc32(data[9:])
    return pa.ipc.open_stream(data[9:]).read_all()


def _seal(table, magic=TOKENS_MAGIC):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    body = sink.getvalue().to_pybytes()
    return magic + zlib.crc32(body).to_bytes(4, "big") + body


def _with(table, name, values):
    """``table`` with column ``name`` replaced by ``values`` (same type unless they are an array)."""
    index = table.schema.get_field_index(name)
    column = values if isinstance(values, pa.Array) else pa.array(values, table.schema.field(name).type)
    return table.set_column(index, pa.field(name, column.type), column)


def test_tokens_bytes_hold_one_row_per_key_group_in_use_in_the_documented_schema():
    tokens = KeyGroupTokens.empty(3, ORDER, KEY)
    tokens.apply(_updates([(2, 2, 0, 5, "a", 3, None), (6, 0, 0, None, None, None, [4])]))
    stored = _open(tokens.to_bytes())
    assert stored.schema.metadata == {b"counted": b"0"}
    assert stored.schema.remove_metadata() == pa.schema([
        ("kg", pa.int32()), ("base", pa.int64()), ("count", pa.int64()), ("committed", pa.int64()),
        ("run_start", pa.int64()), ("order", ORDER), ("key", KEY), ("tie", pa.int64()),
        ("extras", pa.list_(pa.int64())), ("done_xor", pa.int64()), ("done_sum", pa.int64()),
    ])
    # Key group 2 has progress, 6 only an extra; the others have nothing and no row.
    assert stored.to_pylist() == [
        {"kg": 2, "base": 0, "count": None, "committed": 2, "run_start": 0, "order": 5, "key": "a",
         "tie": 3, "extras": None, "done_xor": 6, "done_sum": 10},
        {"kg": 6, "base": 0, "count": None, "committed": 0, "run_start": None, "order": None, "key": None,
         "tie": None, "extras": [4], "done_xor": 0, "done_sum": 0},
    ]
    # Counted, a key group with events (1) has a row; after a new input, one with a base (2) too.
    tokens = _tokens([0, 2, 1])
    tokens.apply(_updates([(1, 2, 1, 5, "a", 3, None), (2, 1, 0, 4, "b", 1, None)]))
    assert _open(tokens.to_bytes()).column("kg").to_pylist() == [1, 2]
    assert _open(tokens.to_bytes()).column("count").to_pylist() == [2, 1]
    tokens.start_input()
    stored = _open(tokens.to_bytes())
    assert stored.select(["kg", "base", "committed"]).to_pylist() == [
        {"kg": 1, "base": 2, "committed": 2}, {"kg": 2, "base": 1, "committed": 1}]


def test_the_boundary_table_holds_each_boundary_with_the_columns_types():
    tokens = _tokens([3, 0, 2, 2])
    assert tokens.boundary_table().num_rows == 0
    tokens.apply(_updates([(3, 1, 0, 9, "z", -2, None), (0, 2, 1, 7, "a", 5, [2])]))
    table = tokens.boundary_table()
    assert table.schema == pa.schema([("kg", pa.int32()), ("order", ORDER), ("key", KEY),
                                      ("tie", pa.int64())])
    assert table.to_pylist() == [{"kg": 0, "order": 7, "key": "a", "tie": 5},
                                 {"kg": 3, "order": 9, "key": "z", "tie": -2}]


def test_a_copy_is_equal_and_independent():
    tokens = _tokens([3, 2])
    tokens.apply(_updates([(0, 2, 1, 7, "a", 5, None), (1, 0, 0, None, None, None, [1])]))
    copy = tokens.copy()
    assert _state(copy) == _state(tokens)
    assert (copy.bits, copy.order_type, copy.key_type, copy.total) == (3, ORDER, KEY, 5)
    copy.apply(_updates([(0, 3, 2, 8, "b", 6, None), (1, 0, 0, None, None, None, [0])]))
    copy.extras[1].add(9)
    assert tokens.committed[0] == 2 and tokens.boundaries[0] == (7, "a", 5) and tokens.extras == {1: {1}}
    assert tokens.done_xor[0] == 6


def test_a_new_input_starts_from_zeroed_int64_digests_and_counts():
    tokens = _tokens([2])
    tokens.apply(_updates([(0, 2, 1, 5, "a", 1, None)]))
    tokens.start_input()
    for name in ("base", "committed", "run_start", "done_xor", "done_sum", "count"):
        assert getattr(tokens, name).dtype == np.int64, name
    assert tokens.count.tolist() == [0] * 8 and tokens.counted is False and tokens.extras == {}
    with pytest.raises(ValueError, match=exactly(
            "the current input is not complete; a new one cannot start")):
        tokens.start_input()


def test_counts_are_kept_as_int64_whatever_they_are_given_as():
    tokens = KeyGroupTokens.empty(1, ORDER, KEY)
    tokens.set_counts(np.array([200, 100], dtype=np.uint8))
    assert tokens.count.dtype == np.int64 and tokens.total == 300
    tokens.apply(_updates([(0, 2, 1, 5, "a", 1, None)]))
    with pytest.raises(ValueError, match=exactly("counts smaller than the events already done")):
        tokens.set_counts(np.array([1, 0]))


@pytest.mark.parametrize("bits", [0, 16])
def test_the_resolutions_at_both_ends_are_accepted(bits):
    assert KeyGroupTokens.empty(bits, ORDER, KEY).size == 2**bits


def test_updates_at_the_edges_of_what_is_allowed():
    tokens = _tokens([4])
    # A key group at its base needs no boundary; an extra may be the first position.
    assert tokens.apply(_updates([(0, 0, 0, None, None, None, [0])])) == 0
    assert tokens.extras == {0: {0}} and tokens.boundaries == {}
    tokens.apply(_updates([(0, 2, 1, 5, "a", 1, [2])]))
    # An extra at the committed point is still beyond it, so it is kept.
    assert tokens.extras == {0: {2}}
    # An update at the same committed point moves nothing, and its other boundary is ignored.
    assert tokens.apply(_updates([(0, 2, 0, 9, "z", 7, None)])) == 0
    assert tokens.boundaries == {0: (5, "a", 1)} and int(tokens.run_start[0]) == 1


def test_damage_is_named_with_what_was_read():
    data = _tokens([1]).to_bytes()
    cases = [
        (b"SGKT", "tokens has an unknown format version none"),
        (b"SGKT\x09" + data[5:], "tokens has an unknown format version 09"),
        (data[:9], "tokens is damaged: it is cut short"),
        (data[:7], "tokens is damaged: it is cut short"),
    ]
    for damaged, message in cases:
        with pytest.raises(TokenError, match=exactly(f"{message}")):
            KeyGroupTokens.from_bytes(damaged, 3)
    with pytest.raises(TokenError, match=exactly("progress is not segack key-group progress")):
        decode_updates(b"junk")
    with pytest.raises(TokenError, match=exactly("the file x has an unknown format version 01")):
        decode_updates(b"SGKU\x01" + bytes(8), what="the file x")
    with pytest.raises(TokenError, match=exactly("the file x is not segack key-group progress")):
        KeyGroupTokens.from_bytes(b"junk", 3, what="the file x")
    no_tie = _open(encode_updates(_updates([(0, 1, 0, 3, "a", 1, None)])), b"SGKU\x02").drop_columns(["tie"])
    with pytest.raises(TokenError, match=exactly("the file x is damaged: column 'tie' is missing or has the "
                                                 "wrong type")):
        decode_updates(_seal(no_tie, b"SGKU\x02"), what="the file x")


def _damaged_tokens(change, bits=3):
    """Tokens with progress in key group 0 (committed 2 of 4, run start 1), their table changed by
    ``change`` and sealed again: well-formed bytes that say something impossible."""
    tokens = _tokens([4], bits=bits)
    tokens.apply(_updates([(0, 2, 1, 5, "a", 1, [3])]))
    return _seal(change(_open(tokens.to_bytes())))


OUTSIDE = "a committed point lies outside its key group"


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: t.drop_columns(["key"]), "the boundary columns are missing"),
    (lambda t: _with(t, "kg", pa.array([0], pa.int64())), "column 'kg' is missing or has the wrong type"),
    (lambda t: t.drop_columns(["done_sum"]), "column 'done_sum' is missing or has the wrong type"),
    (lambda t: _with(t, "kg", [8]), "its key groups are not distinct values in 0..7"),
    (lambda t: _with(t, "base", [None]), "base has gaps"),
    (lambda t: _with(t, "done_xor", [None]), "done_xor has gaps"),
    (lambda t: t.replace_schema_metadata({}), "it does not say whether the events are counted"),
    (lambda t: _with(t, "count", [None]), "its counts contradict its counted flag"),
    (lambda t: _with(_with(t, "count", [-1]), "committed", [0]), OUTSIDE),
    (lambda t: _with(_with(t, "base", [-1]), "committed", [-1]), OUTSIDE),
    (lambda t: _with(t, "run_start", [None]), "key group 0 has no valid boundary"),
    (lambda t: _with(t, "tie", [None]), "key group 0 has no valid boundary"),
    (lambda t: _with(t, "run_start", [2]), "key group 0 has no valid boundary"),
    (lambda t: _with(t, "extras", [[1]]), "key group 0 has extras outside its events"),
    (lambda t: _with(t, "extras", [[3, 3]]), "key group 0 has extras outside its events"),
    (lambda t: _with(t, "extras", [[4]]), "key group 0 has extras outside its events"),
])
def test_tokens_that_are_well_sealed_but_impossible_are_refused(change, message):
    with pytest.raises(TokenError, match=exactly(f"the tokens of x is damaged: {message}")):
        KeyGroupTokens.from_bytes(_damaged_tokens(change), 3, what="the tokens of x")


def test_a_boundary_at_the_key_groups_first_position_reads_back():
    tokens = _tokens([4])
    tokens.apply(_updates([(0, 1, 0, 5, "a", 1, None)]))
    assert _state(KeyGroupTokens.from_bytes(tokens.to_bytes(), 3)) == _state(tokens)
    # The helper that damages tokens changes only what it is told to.
    assert _state(KeyGroupTokens.from_bytes(_damaged_tokens(lambda t: t), 3))[3][:1] == [2]


def test_tokens_are_stored_compressed():
    tokens = _tokens(list(range(1, 2**10 + 1)), bits=10)
    rows = [(group, 1, 0, 7, "k" * 40, group, None) for group in range(0, 2**10, 2)]
    tokens.apply(_updates(rows))
    sealed = tokens.to_bytes()
    plain = _seal(_open(sealed))  # the same stream, written without compression
    assert len(sealed) < len(plain) / 2
