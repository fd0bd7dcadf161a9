"""Order preservation and round trips of the key encoding (pstate.keys)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pstate.errors import CorruptStore, SchemaMismatch
from pstate.keys import decode_key, decode_key_at, encode_key, prefix_end

ints = st.integers() | st.integers(min_value=-(1 << 2000), max_value=1 << 2000)
floats = st.floats(allow_nan=False)
texts = st.text()
blobs = st.binary()
bools = st.booleans()


def _check_order(values: list[object]) -> None:
    by_value = sorted(values)  # type: ignore[type-var]
    by_bytes = sorted(values, key=encode_key)
    assert [encode_key(v) for v in by_value] == [encode_key(v) for v in by_bytes]


@pytest.mark.parametrize("strategy", [ints, floats, texts, blobs, bools], ids=["int", "float", "str", "bytes", "bool"])
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_order_preserved_within_a_type(strategy: st.SearchStrategy[object], data: st.DataObject) -> None:
    _check_order(data.draw(st.lists(strategy, max_size=30)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(texts, ints, st.tuples(blobs, bools)), max_size=20))
def test_order_preserved_for_tuples(values: list[tuple[object, ...]]) -> None:
    _check_order(values)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(texts) | st.tuples(texts, ints) | st.tuples(texts, ints, ints), max_size=20))
def test_prefix_tuples_sort_first(values: list[tuple[object, ...]]) -> None:
    # tuples of different lengths with comparable prefixes
    _check_order(values)


key_values = st.recursive(
    st.none() | bools | ints | floats | texts | blobs,
    lambda inner: st.lists(inner, max_size=4).map(tuple),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(key_values)
def test_round_trip(v: object) -> None:
    enc = encode_key(v)
    out = decode_key(enc)
    assert out == v or (isinstance(v, float) and v == 0.0)
    # self-delimiting: decodable from the middle of a longer key
    assert decode_key_at(b"\x09" + enc + b"\x05tail", 1) == (out, 1 + len(enc))


def test_negative_zero_is_zero_and_nan_refused() -> None:
    assert encode_key(-0.0) == encode_key(0.0)
    with pytest.raises(SchemaMismatch):
        encode_key(math.nan)


def test_types_sort_by_tag_and_unknown_types_refused() -> None:
    order = [None, False, 3, 1.5, "a", b"a", ("a",)]
    assert sorted(order, key=encode_key) == order
    with pytest.raises(SchemaMismatch):
        encode_key([1, 2])


def test_embedded_nul_bytes_keep_order() -> None:
    _check_order(["a", "a\x00", "a\x00\x00", "a\x01", "ab", ""])
    _check_order([b"\x00", b"\x00\xff", b"\x00\x01", b""])


def test_corrupt_keys_are_refused() -> None:
    with pytest.raises(CorruptStore):
        decode_key(b"\x05abc")
    with pytest.raises(CorruptStore):
        decode_key(b"\x42")
    with pytest.raises(CorruptStore):
        decode_key(encode_key(1) + b"x")


def test_prefix_end() -> None:
    assert prefix_end(b"\x03a") == b"\x03b"
    assert prefix_end(b"\x03\xff") == b"\x04"
    assert prefix_end(b"\xff\xff") is None
