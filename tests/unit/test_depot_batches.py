"""Stored batches (pstate.depot_batches): an append of several records is one value, keyed by its last offset,
beside the per-record keys of older stores and single-record appends; every read works at any offset, also
inside a batch; a trim inside a batch moves the start and the batch goes once its last record is below it;
key compaction rewrites a batch it deletes from; and a property test of reads and trims against a model list.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pstate.compaction import compact, cursor
from pstate.depot_batches import BATCH_TAG, batch_key, encode_batch, read_slice, record_key
from pstate.depots import (
    META,
    PartitionInfo,
    batched_key,
    check_partition,
    depot_meta_key,
    encode_partition_meta,
)
from pstate.errors import CorruptStore
from pstate.retention import trim
from pstate.store import TaskGroupStore, depot_cf
from tests.unit.depot_store import Applier, D

CF = depot_cf(D)


@pytest.fixture
def store(tmp_path: Any) -> Any:
    with TaskGroupStore(tmp_path / "s", {}, [D]) as s:
        yield s


def _keys(store: TaskGroupStore) -> list[bytes]:
    return [k for k, _v in store.applied_reader().scan(CF, b"", None)]


def test_an_append_of_many_is_one_value_and_of_one_a_record_key(store: TaskGroupStore) -> None:
    run = Applier(store)
    assert run(lambda b: b.depot_append(D, 2, ["a", "b", "c"])) == [0, 1, 2]
    assert run(lambda b: b.depot_append(D, 2, ["d"])) == [3]
    assert run(lambda b: b.depot_append(D, 2, ["e", "f"])) == [4, 5]
    assert _keys(store) == [batch_key(2, 2), record_key(2, 3), batch_key(2, 5)]
    assert store.applied_reader().get(CF, batch_key(2, 2)) == encode_batch([msgpack.packb(r) for r in "abc"])
    assert store.depot(D).read(2, 0) == list(enumerate("abcdef"))
    assert store.depot(D).partition_info(2).appended_bytes == 12  # the records' bytes, not the values'


def test_an_old_store_with_per_record_keys_reads_mixed_with_batches(store: TaskGroupStore) -> None:
    """A store written before session 16 (a key per record, as then) takes batches after it, in one partition."""
    run = Applier(store)
    old = [msgpack.packb(f"old{i}") for i in range(5)]

    def old_append(b: Any) -> None:  # what depot_append_encoded wrote before: a key per record
        p = check_partition(0)
        b.writes.put_many(CF, [p + o.to_bytes(8, "big") for o in range(5)], old)
        b.writes.put(META, depot_meta_key(D, p), encode_partition_meta(PartitionInfo(0, 5, 25), None))

    run(old_append)
    run(lambda b: b.depot_append(D, 0, ["n5", "n6", "n7"], 10))
    run(lambda b: b.depot_append(D, 0, ["n8"], 20))
    want = [f"old{i}" for i in range(5)] + ["n5", "n6", "n7", "n8"]
    d = store.depot(D)
    for start in range(10):
        for end in range(start, 11):
            assert d.read(0, start, end) == list(enumerate(want))[start:end], (start, end)
            first, nxt, raw = d.read_raw(0, start, end)
            assert raw == [msgpack.packb(r) for r in want[start:end]] and nxt == max(start, min(end, 9)) \
                and first == (start if raw else nxt), (start, end)
    assert [d.time_of(0, o) for o in (4, 5, 7, 8, 9)] == [None, 10, 10, 20, None]


def test_reads_inside_a_batch_honour_max_bytes(store: TaskGroupStore) -> None:
    run = Applier(store)
    recs = [msgpack.packb("x" * (i % 5)) for i in range(50)]
    run(lambda b: b.depot_append_encoded(D, 0, recs))
    d = store.depot(D)
    for start in (0, 1, 17, 44):
        for max_bytes in (1, 2, 7, 40, 1 << 20):
            records, first, nxt, offsets = d.read_packed(0, start, 45, max_bytes)
            got = records.split()
            # up to and including the record that reaches max_bytes, at least one
            n = next((i + 1 for i in range(45 - start) if sum(map(len, recs[start:start + i + 1])) >= max_bytes),
                     45 - start)
            assert (first, nxt, offsets, got) == (start, start + n, [], recs[start:start + n]), (start, max_bytes)


def test_a_trim_inside_a_batch_moves_the_start_and_the_batch_goes_with_its_last_record(store: TaskGroupStore
                                                                                         ) -> None:
    run = Applier(store)
    run(lambda b: b.depot_append(D, 0, list(range(10))))
    run(lambda b: b.depot_append(D, 0, list(range(10, 20))))
    run(lambda b: trim(b, D, 0, 4, store.applied_reader()))
    d = store.depot(D)
    assert d.partition_info(0).start == 4
    assert d.read(0, 0) == [(o, o) for o in range(4, 20)]  # never a record below the start
    assert d.read_raw(0, 0, 4) == (0, 0, [])
    assert d.read_sparse(0, 0, 6)[0] == [4, 5]
    assert d.time_of(0, 3) is None and d.time_of(0, 4) is not None
    assert _keys(store) == [batch_key(0, 9), batch_key(0, 19)]  # the cut batch stays
    run(lambda b: trim(b, D, 0, 10, store.applied_reader()))
    assert _keys(store) == [batch_key(0, 19)]
    assert d.read(0, 0, 12) == [(10, 10), (11, 11)]
    run(lambda b: trim(b, D, 0, 20, store.applied_reader()))
    assert _keys(store) == [] and d.read(0, 0) == []


def test_compaction_rewrites_a_batch_it_deletes_from_as_record_keys(store: TaskGroupStore) -> None:
    run = Applier(store)
    run(lambda b: b.depot_append(D, 0, [["a", 0], ["b", 1], ["c", 2], ["a", 3]]))
    run(lambda b: b.depot_append(D, 0, [["d", 4], ["e", 5]]))
    run(lambda b: compact(b, D, 0, lambda r: r[0], None, 0, 0, 100, store.applied_reader()))
    d = store.depot(D)
    assert d.read(0, 0) == [(1, ["b", 1]), (2, ["c", 2]), (3, ["a", 3]), (4, ["d", 4]), (5, ["e", 5])]
    assert _keys(store) == [record_key(0, 1), record_key(0, 2), record_key(0, 3), batch_key(0, 5)]
    offsets, _records, nxt = d.read_sparse(0, 0)
    assert (offsets, nxt) == ([1, 2, 3, 4, 5], 6)
    assert d.read_packed(0, 0, None, 1)[1:] == (1, 2, [1])


def test_a_batch_cut_by_a_trim_is_compacted_without_its_records_below_the_start(store: TaskGroupStore) -> None:
    run = Applier(store)
    run(lambda b: b.depot_append(D, 0, [["a", 0], ["b", 1], ["c", 2], ["a", 3], ["e", 4]]))
    run(lambda b: trim(b, D, 0, 2, store.applied_reader()))
    run(lambda b: b.depot_append(D, 0, [["c", 5]]))
    run(lambda b: compact(b, D, 0, lambda r: r[0], None, 0, 0, 100, store.applied_reader()))
    assert store.depot(D).read(0, 0) == [(3, ["a", 3]), (4, ["e", 4]), (5, ["c", 5])]
    assert _keys(store) == [record_key(0, 3), record_key(0, 4), record_key(0, 5)]


def test_a_layout_this_code_does_not_know_is_refused(store: TaskGroupStore) -> None:
    run = Applier(store)
    run(lambda b: b.depot_append(D, 0, ["a", "b"]))
    value = store.applied_reader().get(CF, batch_key(0, 1))
    assert value is not None and batch_key(0, 1)[12:] == BATCH_TAG
    run(lambda b: b.writes.put(CF, batch_key(0, 1), b"\x02" + value[1:]))  # a newer value version
    with pytest.raises(CorruptStore, match="newer version"):
        store.depot(D).read(0, 0)


# ------------------------------------------------------------------------ reads against a model list


def _first(r: Any) -> Any:
    return r[0]


_OPS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 6), st.booleans()),  # records; per-record keys (older layout)
    st.tuples(st.just("trim"), st.integers(0, 40), st.booleans()),
    st.tuples(st.just("compact"), st.integers(1, 8), st.booleans()),
), max_size=14)
_READS = st.lists(st.tuples(st.integers(0, 45), st.one_of(st.none(), st.integers(0, 45)), st.integers(1, 40)),
                  min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(ops=_OPS, reads=_READS)
def test_reads_match_a_model_list(tmp_path_factory: Any, ops: list[tuple[str, int, bool]],
                                  reads: list[tuple[int, int | None, int]]) -> None:
    with TaskGroupStore(tmp_path_factory.mktemp("s"), {}, [D]) as store:
        run = Applier(store)
        model: dict[int, bytes] = {}  # offset -> record, of the records a reader may see
        end = 0
        compacted = False
        for op, n, flag in ops:
            if op == "append":
                recs = [msgpack.packb([(end + i) % 3, end + i, "x" * ((end + i) % 4)]) for i in range(n)]
                if flag:
                    for r in recs:  # one key each: the older layout
                        run(lambda b, r=r: b.depot_append_encoded(D, 0, [r]))
                else:
                    run(lambda b, recs=recs: b.depot_append_encoded(D, 0, recs))
                model.update(zip(range(end, end + n), recs, strict=True))
                end += n
            elif op == "trim":
                start = run(lambda b, n=n: trim(b, D, 0, n, store.applied_reader()))
                model = {o: r for o, r in model.items() if o >= start}
            elif flag:  # key compaction, a bounded round
                compacted = True
                run(lambda b, n=n: compact(b, D, 0, _first, None, 0, 0, n, store.applied_reader()))
                below = cursor(store.applied_reader(), D, 0) or 0
                latest = {msgpack.unpackb(r)[0]: o for o, r in sorted(model.items()) if o < below}
                model = {o: r for o, r in model.items() if o >= below or latest[msgpack.unpackb(r)[0]] == o}
        d = store.depot(D)
        assert d.read(0, 0, None, 1 << 30) == [(o, msgpack.unpackb(r)) for o, r in sorted(model.items())]
        for start, stop, max_bytes in reads:
            want = [o for o in sorted(model) if o >= start and (stop is None or o < stop)]
            n = next((i + 1 for i in range(len(want)) if sum(len(model[o]) for o in want[:i + 1]) >= max_bytes),
                     len(want))
            records, first, nxt, offsets = d.read_packed(0, start, stop, max_bytes)
            assert records.split() == [model[o] for o in want[:n]]
            if compacted:
                assert offsets == want[:n]
            else:
                assert (first, nxt) == ((want[0], want[n - 1] + 1) if want else (start, start))
            assert [o for o, _ in d.read(0, start, stop, max_bytes)] == want[:n]


def test_a_partition_of_record_keys_only_is_read_as_values_until_its_first_batch(store: TaskGroupStore) -> None:
    """A partition that never stored a batch (single-record appends, older stores) reads its values in RocksDB's
    C loop (no key object per record); its first batch marks it in ``_meta`` and reads go key by key."""
    run = Applier(store)
    for r in "abcdef":
        run(lambda b, r=r: b.depot_append(D, 1, [r]))
    view = store.depot(D)
    p = check_partition(1)
    assert store.applied_reader().get(META, batched_key(D, p)) is None
    fast = view._record_keys_slice(1, 1, 5, 1 << 20)
    assert fast is not None and fast.spans == [(1, 4)] and fast.records.split() == [msgpack.packb(r) for r in "bcde"]
    cut = view._record_keys_slice(1, 0, 6, 5)  # max_bytes: up to the record that reaches it (2-byte records)
    assert cut is not None and cut.spans == [(0, 3)] and cut.full
    assert cut == read_slice(store.applied_reader(), CF, 1, 0, 6, 6, 5)  # what the key-by-key read gives
    assert view.read_packed(1, 2, 4, 1 << 20)[1:3] == (2, 4)
    run(lambda b: b.depot_trim(D, 1, 2))
    assert view.read(1, 0) == list(enumerate("abcdef"))[2:]  # from the start, the trimmed prefix never read
    run(lambda b: b.depot_append(D, 1, ["g", "h"]))
    assert store.applied_reader().get(META, batched_key(D, p)) == b""
    assert view._record_keys_slice(1, 2, 8, 1 << 20) is None
    assert view.read(1, 0) == list(enumerate("abcdefgh"))[2:]
    assert view.read_packed(1, 3, 7, 1 << 20)[0].split() == [msgpack.packb(r) for r in "defg"]
