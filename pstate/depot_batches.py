"""How a depot partition's records are stored: one key per record, or one value per appended batch, mixed.

Column family ``depot:<name>``; keys big-endian, so one partition is one contiguous, ordered range:

- a record (the only layout before session 16; still written for an append of one record):
  ``partition u32 + offset u64`` (12 bytes) -> the record as appended (msgpack);
- a batch (an append of two or more records, Kafka's record batch: one unit on disk, offsets inside):
  ``partition u32 + LAST offset u64 + BATCH_TAG`` (13 bytes) -> ``BATCH_VERSION`` (1 byte), the record count
  ``n`` (u32 little-endian), ``n`` record lengths (u32 little-endian each), the records back to back. Its
  first offset is ``last - n + 1``. The records and lengths are :mod:`pstate.packed_records`' form, so a read
  serves a batch, or a sub-range of it, as two slices of the stored value, with no object per record.

Why the last offset in the key. Offsets are unique across a partition's keys, and a 12-byte key sorts before
a 13-byte key with the same first 12 bytes, so keys sort by the offsets they hold. A forward seek to
``partition + offset`` lands on the key holding ``offset`` (a record at it, or the batch it is inside), and a
trim's range delete of ``[partition + start, partition + new_start)`` (unchanged from the per-record layout)
deletes exactly the records below ``new_start`` and the batches whose last record is below it. A batch that a
trim cuts stays whole until its last record is below the partition's start; its records below the start
are hidden by the start (``_meta``, :mod:`pstate.depots`), which every read clamps to. Key compaction
(:mod:`pstate.compaction`) rewrites a batch it deletes a record from as per-record keys of its survivors.

An older store (per-record keys only) is read as it is: no migration. A key of another length, a tag or a
value version this code does not know, is refused (:class:`pstate.errors.CorruptStore`), never misread.
The leader builds the value into the entry; every replica applies the same bytes.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pstate.errors import CorruptStore
from pstate.packed_records import PackedRecords, pack_lengths, sizes

if TYPE_CHECKING:
    from pstate.engine import Reader

#: the 13th byte of a batch's key (a key of another tag or length is refused: a newer layout)
BATCH_TAG = b"\x01"
#: the first byte of a batch's value
BATCH_VERSION = 1
_RECORD_KEY = struct.Struct(">IQ")
_BATCH_KEY = struct.Struct(">IQc")
_HEAD = 5  # version byte + count u32


def record_key(partition: int, offset: int) -> bytes:
    return _RECORD_KEY.pack(partition, offset)


def batch_key(partition: int, last: int) -> bytes:
    return _BATCH_KEY.pack(partition, last, BATCH_TAG)


def key_span(partition: int, lo: int, hi: int) -> tuple[bytes, bytes]:
    """The first and the last key (both included) that can hold records of offsets ``[lo, hi)`` and no other:
    what a compaction of that range asks RocksDB for (its ranges include their end)."""
    assert 0 <= lo < hi, (lo, hi)
    return record_key(partition, lo), batch_key(partition, hi - 1)


def encode_batch(records: Sequence[bytes]) -> bytes:
    """A batch's stored value (module docstring); at least two records (one is stored as a record key)."""
    assert len(records) >= 2, len(records)
    return b"".join((bytes((BATCH_VERSION,)), len(records).to_bytes(4, "little"), pack_lengths(records), *records))


def append_writes(partition: int, first: int, records: Sequence[bytes]) -> tuple[list[bytes], list[bytes]]:
    """The keys and values that store ``records`` at offsets ``first, first + 1, ...``: one record key, or
    one batch."""
    if len(records) == 1:
        return [record_key(partition, first)], [records[0]]
    if not records:
        return [], []
    return [batch_key(partition, first + len(records) - 1)], [encode_batch(records)]


def _batch_count(key: bytes, value: bytes) -> int:
    if len(key) != 13 or key[12:] != BATCH_TAG or not value or value[0] != BATCH_VERSION or len(value) < _HEAD:
        raise CorruptStore("depot key", f"unknown layout: key {key.hex()} ({len(key)} bytes), value "
                                        f"{value[:1].hex()}...: written by a newer version?")
    n = int.from_bytes(value[1:_HEAD], "little")
    assert n >= 2 and len(value) >= _HEAD + 4 * n, (key.hex(), n, len(value))
    return n


@dataclass(frozen=True)
class Stored:
    """One key's records: offsets ``first .. first + count - 1`` (a record key: count 1, value the record)."""

    key: bytes
    value: bytes
    first: int
    count: int

    @property
    def is_batch(self) -> bool:
        return len(self.key) != 12

    def records(self) -> list[bytes]:
        if not self.is_batch:
            return [self.value]
        end = _HEAD + 4 * self.count
        return PackedRecords(self.value[end:], self.value[_HEAD:end]).split()


def stored(key: bytes, value: bytes) -> Stored:
    """A depot key and its value, read (the module docstring's two layouts)."""
    if len(key) == 12:
        return Stored(key, value, int.from_bytes(key[4:], "big"), 1)
    n = _batch_count(key, value)
    return Stored(key, value, int.from_bytes(key[4:12], "big") - n + 1, n)


def holding(reader: Reader, cf: str, partition: int, offset: int, end: int) -> Stored | None:
    """The key holding ``offset`` (the partition's records are below ``end``); None: no record there."""
    for k, v in reader.scan(cf, record_key(partition, offset), record_key(partition, end)):
        s = stored(k, v)
        return s if s.first <= offset else None
    return None


@dataclass(frozen=True)
class Slice:
    """Records read from one partition: ``spans`` (first offset, count), ascending, and the records packed."""

    spans: list[tuple[int, int]]
    records: PackedRecords
    #: whether the read stopped at ``max_bytes`` (records may follow)
    full: bool

    def offsets(self) -> list[int]:
        return [o for first, n in self.spans for o in range(first, first + n)]


def read_slice(reader: Reader, cf: str, partition: int, lo: int, hi: int, end: int, max_bytes: int,
               dense: bool = True) -> Slice:
    """Records ``lo <= offset < hi`` of a partition whose records are below ``end``, stopping once ``max_bytes``
    are read (at least one record, up to and including the one that reaches it).

    One step per key: a run of record keys (the older layout, or single-record appends) is gathered by
    key, a batch's share taken as two slices of its value (a prefix sum of its lengths only when the read
    starts or stops inside it). ``dense``: the partition's offsets have no gaps (no key compaction ran), so
    a run of record keys is checked at its ends only.
    """
    spans: list[tuple[int, int]] = []
    lens: list[bytes | memoryview] = []
    data: list[bytes | memoryview] = []
    total = 0
    full = False
    run: list[bytes] = []  # consecutive record keys not yet in lens/data, from run_key on
    run_key = last_key = b""

    def flush_run() -> None:
        if run:
            first = int.from_bytes(run_key[4:], "big")
            assert int.from_bytes(last_key[4:], "big") - first + 1 == len(run), (run_key.hex(), last_key.hex())
            spans.append((first, len(run)))
            lens.append(pack_lengths(run))
            data.extend(run)
            run.clear()

    if hi > lo:
        hi_key = record_key(partition, hi)
        add = run.append
        for k, v in reader.scan(cf, record_key(partition, lo), record_key(partition, max(end, hi))):
            if len(k) == 12:  # a record key: the loop's hot path for older stores, kept lean
                if k >= hi_key:
                    break
                if not run:
                    run_key = k
                elif not dense and int.from_bytes(k[4:], "big") != int.from_bytes(last_key[4:], "big") + 1:
                    flush_run()
                    run_key = k
                add(v)
                last_key = k
                total += len(v)
                if total >= max_bytes:
                    full = True
                    break
                continue
            flush_run()
            s = stored(k, v)
            if s.first >= hi:
                break
            i, j = max(0, lo - s.first), min(s.count, hi - s.first)
            body = _HEAD + 4 * s.count
            mv = memoryview(v)
            if i == 0 and j == s.count:
                a, b = body, len(v)
            else:
                n = sizes(mv[_HEAD + 4 * i:_HEAD + 4 * j])
                a = body + (sum(sizes(mv[_HEAD:_HEAD + 4 * i])) if i else 0)
                b = a + sum(n)
            if total + b - a >= max_bytes:  # up to the record that reaches max_bytes
                n = sizes(mv[_HEAD + 4 * i:_HEAD + 4 * j])
                cut = next(c for c, t in enumerate(itertools.accumulate(n, initial=total)) if t >= max_bytes)
                j = i + max(1, cut)
                b = a + sum(n[:j - i])
                full = True
            spans.append((s.first + i, j - i))
            lens.append(mv[_HEAD + 4 * i:_HEAD + 4 * j])
            data.append(mv[a:b])
            total += b - a
            if full:
                break
        flush_run()
    return Slice(_merged(spans), PackedRecords(b"".join(data), b"".join(lens)), full)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for first, n in spans:
        if out and out[-1][0] + out[-1][1] == first:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((first, n))
    return out


def walk(reader: Reader, cf: str, partition: int, lo: int, hi: int) -> Iterator[tuple[int, bytes]]:
    """(offset, record) of each record ``lo <= offset < hi``, one key read at a time (a leader's bounded rounds)."""
    for k, v in reader.scan(cf, record_key(partition, lo), record_key(partition, 0)[:4] + b"\xff" * 9):
        s = stored(k, v)
        if s.first >= hi:
            return
        for off, rec in zip(range(s.first, s.first + s.count), s.records(), strict=True):
            if lo <= off < hi:
                yield off, rec
