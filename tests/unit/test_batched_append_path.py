"""The batched append path's per-record shortcuts keep their contracts (session 13, issue 32).

* A depot no topology reads has its client records checked without keeping their
  values (:func:`check_client_records`): it must refuse exactly what
  :func:`decode_client_records` refuses, with the same message.
* ``TaskGroupStore.apply`` puts a run's pairs through the batch's default column
  family: runs of several families, deletes and range deletes in one entry must
  still land in their own families.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from pstate import Map, TaskGroupStore
from pstate.changes import ChangeSet
from pstate.errors import SchemaMismatch
from topology.dataflow.entries import build_client_append, check_client_records, decode_client_records

GOOD = [msgpack.packb(v, use_bin_type=True) for v in
        ({"user": "u1", "v": "x" * 80}, 1, "é", b"\x00", [1, [2]], {1: {"a": None}}, 1.5, None)]
#: reserved code, short array, extra data, a map and a list as map keys, invalid UTF-8, a str cut short, empty
BAD = [b"\xc1", b"\x92\x01", b"\x01\x02", b"\x81\x81\x01\x02\x03", b"\x81\x92\x01\x02\x03", b"\xa2\xff\xfe",
       b"\xa5ab", b""]


def _error(fn: object, records: list[bytes]) -> str | None:
    try:
        fn("*raw", 3, records)  # type: ignore[operator]
    except SchemaMismatch as e:
        return str(e)
    return None


def test_checking_refuses_what_decoding_refuses_with_the_same_message() -> None:
    assert _error(check_client_records, GOOD) is None
    assert decode_client_records("*raw", 3, GOOD) == [msgpack.unpackb(r, raw=False, strict_map_key=False)
                                                      for r in GOOD]
    for bad in BAD:
        records = [GOOD[0], bad, GOOD[1]]
        expected = _error(decode_client_records, records)
        assert expected is not None and "undecodable bytes" in expected, (bad, expected)
        assert _error(check_client_records, records) == expected, bad


def test_a_bad_record_refuses_the_whole_append(tmp_path: Path) -> None:
    store = TaskGroupStore(tmp_path / "s", {}, ["*raw"])
    try:
        with pytest.raises(SchemaMismatch, match="undecodable"):
            build_client_append(store, None, [("*raw", 0, GOOD), ("*raw", 1, [GOOD[0], b"\xc1"])])
        b, firsts, _acks = build_client_append(store, None, [("*raw", 0, GOOD), ("*raw", 1, GOOD[:2])])
        assert firsts == [0, 0]
        store.apply(0, b.encode())
        d = store.depot("*raw")  # the client's bytes, stored as they are
        assert (d.read_raw(0, 0)[2], d.read_raw(1, 0)[2]) == (GOOD, GOOD[:2])
    finally:
        store.close()


def test_apply_puts_each_run_in_its_own_family(tmp_path: Path) -> None:
    store = TaskGroupStore(tmp_path / "s", {"$$a": Map(str, int), "$$b": Map(str, int)}, ["*raw"])
    try:
        a, b = "pstate:$$a", "pstate:$$b"
        cs = ChangeSet([a, b], [(0, 0, [b"k1", b"1", b"k2", b"2"]), (0, 1, [b"k1", b"b1"]), (0, 0, [b"k3", b"3"]),
                                (1, 0, [b"k2"]), (0, 1, [b"k9", b"b9"]), (2, 1, [b"k5", b"k99"])])
        assert store.apply(0, cs.encode())
        raw = store._cfs  # (the column families as RocksDB holds them)
        assert list(raw[a].items()) == [(b"k1", b"1"), (b"k3", b"3")]
        assert list(raw[b].items()) == [(b"k1", b"b1")]
        assert store.applied_offset == 0
    finally:
        store.close()
