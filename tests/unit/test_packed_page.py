"""Packed scan pages (pstate/packed_page.py): the same pairs, bounds and resume points as decoded pages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path as FsPath
from typing import Any

import pytest

from pstate import Map, TaskGroupStore
from pstate.codec import pack, unpack
from pstate.keys import encode_key
from pstate.packed_page import pack_page, unpack_pairs

KEYS: list[Any] = ["", "a", "a\x00b", "caf\u00e9", "k" * 40]


@pytest.mark.parametrize("keys", [KEYS, KEYS[:1], KEYS[1:2], [], [1, 2, 300], ["a", 7], [("t", 1)], [b"x"]])
def test_packed_pairs_round_trip(keys: list[Any]) -> None:
    values = [{"v": i, "big": 1 << 80} for i, _ in enumerate(keys)]  # (a big int: the codec's extension type)
    page = pack_page([b"\x02" + encode_key(k) for k in keys], [pack(v) for v in values])
    assert page.count == len(keys)
    # what the items of an unpacked page are on the client (tuple keys arrive as lists there too)
    assert unpack_pairs(page) == list(map(tuple, unpack(pack(list(zip(keys, values, strict=True))))))


def test_plain_str_keys_travel_unparsed() -> None:
    lone = pack_page([b"\x02" + encode_key(k) for k in ("\ud800x", "b")], [b"\x01", b"\x02"])
    assert unpack_pairs(lone) == [("\ud800x", 1), ("b", 2)]  # (stored with surrogatepass)
    page = pack_page([b"\x02" + encode_key(k) for k in ("ab", "c")], [b"\x01", b"\x02"])
    assert page.str_keys == b"ab\x00\x01\x02\x05c" and not page.keys
    mixed = pack_page([b"\x02" + encode_key(k) for k in ("ab", "a\x00")], [b"\x01", b"\x02"])
    assert not mixed.str_keys and mixed.keys


@pytest.fixture
def store(tmp_path: FsPath) -> Iterator[TaskGroupStore]:
    s = TaskGroupStore(tmp_path / "state", {"$$counts": Map(str, int), "$$posts": Map(int, str)})
    b = s.changes()
    for i in range(3000):
        b.set("$$counts", f"w{i:05d}", i * 1000)
    for i in range(300):
        b.set("$$posts", i, f"post {i}")
    s.apply(0, b.changeset())
    yield s
    s.close()


@pytest.mark.parametrize(("limit", "max_bytes"), [(300, 1 << 20), (10_000, 1 << 20), (10_000, 700), (1, 1), (77, 150)])
def test_packed_pages_match_decoded_pages(store: TaskGroupStore, limit: int, max_bytes: int) -> None:
    view = store.pstate("$$counts")
    after = None
    while True:
        plain = view.scan_page(None, None, after, limit, max_bytes)
        packed = view.packed_scan_page(None, None, after, limit, max_bytes)
        assert packed is not None
        assert unpack_pairs(packed.pairs) == plain.items
        assert (packed.after, packed.scanned) == (plain.after, plain.scanned)
        assert len(plain.items) <= limit
        if plain.after is None:
            break
        after = plain.after
    posts = store.pstate("$$posts").packed_scan_page(None, None, None, 1000, 1 << 20)
    assert posts is not None and unpack_pairs(posts.pairs) == [(i, f"post {i}") for i in range(300)]
    ranged = view.packed_scan_page("w00010", "w00020", None, 100, 1 << 20, lambda k: k.endswith("5"))
    assert ranged is not None and unpack_pairs(ranged.pairs) == [("w00015", 15_000)]
