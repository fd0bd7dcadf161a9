"""Key compaction of a depot partition: keep the latest record of each key, in bounded rounds.

A round indexes up to ``limit`` records past the partition's compaction cursor: for each, the index (in
``_meta``: key -> latest offset, tombstone flag) names the key's previous record, which is deleted, and
then points at this one. Records below the cursor therefore hold exactly the latest record of each key
(checked against a model in tests/unit/test_compaction.py); records above it are not yet compacted. A
tombstone (a record the depot's partitioner says deletes its key) is queued with the round's time and
deleted, with its index entry, ``delete_retention_ms`` later, so a reader that saw the key's old value
has that long to see it deleted. Offsets never change: readers see gaps (``DepotView.read_sparse``). A record
deleted from a stored batch (:mod:`pstate.depot_batches`) rewrites the batch's other records (at or above the
partition's start) as record keys, in the same entry.

Every write is in the round's entry (the leader reads, every replica applies the same deletes), and a
round only indexes applied records (the promise rule of :mod:`pstate.retention`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from pstate.depot_batches import holding, record_key, walk
from pstate.depots import COMPACTION_CURSOR, META, check_partition, depot_cf, read_partition_info
from pstate.engine import Reader, pack, unpack
from pstate.retention import RetentionState, read_state, write_state
from pstate.store import ChangeSetBuilder

_INDEX = b"kc:"
_TOMBSTONES = b"kt:"
_CURSOR = COMPACTION_CURSOR


def _prefix(tag: bytes, depot: str, partition: int) -> bytes:
    return tag + depot.encode() + b"\x00" + check_partition(partition)


def cursor(reader: Reader, depot: str, partition: int) -> int | None:
    """The offset below which the partition is compacted (None: never compacted, so it has no gaps)."""
    raw = reader.get(META, _prefix(_CURSOR, depot, partition))
    return None if raw is None else int.from_bytes(raw, "big")


def compact(builder: ChangeSetBuilder, depot: str, partition: int, key_of: Callable[[Any], Any],
            is_tombstone: Callable[[Any], bool] | None, now_ms: int, delete_retention_ms: int, limit: int,
            applied: Reader) -> int:
    """One bounded round (see the module docstring); returns the records it deleted."""
    assert limit > 0, limit
    check_partition(partition)
    cf = depot_cf(depot)
    reader = builder.reader
    info = read_partition_info(reader, depot, partition)
    applied_end = read_partition_info(applied, depot, partition).end
    start = max(cursor(reader, depot, partition) or 0, info.start)
    stop = min(applied_end, start + limit)
    index = _prefix(_INDEX, depot, partition)
    tombs = _prefix(_TOMBSTONES, depot, partition)
    deleted = 0
    deleted_bytes = 0

    def drop(offset: int) -> None:
        nonlocal deleted, deleted_bytes
        held = holding(reader, cf, partition, offset, info.end)
        if held is None:
            return
        old = held.value
        builder.writes.delete(cf, held.key)
        if held.is_batch:  # the batch's other records stay, as record keys (pstate.depot_batches)
            for off, rec in zip(range(held.first, held.first + held.count), held.records(), strict=True):
                if off == offset:
                    old = rec
                elif off >= info.start:
                    builder.writes.put(cf, record_key(partition, off), rec)
        deleted += 1
        deleted_bytes += len(old)

    for offset, v in list(walk(reader, cf, partition, start, stop)):
        record = unpack(v)
        key = pack(key_of(record))
        tomb = bool(is_tombstone(record)) if is_tombstone is not None else False
        prev = reader.get(META, index + key)
        if prev is not None:
            prev_offset, prev_tomb = msgpack.unpackb(prev)
            if prev_offset >= info.start:
                drop(prev_offset)
            if prev_tomb:
                builder.writes.delete(META, tombs + prev_offset.to_bytes(8, "big"))
        builder.writes.put(META, index + key, msgpack.packb([offset, tomb]))
        if tomb:
            builder.writes.put(META, tombs + offset.to_bytes(8, "big"), msgpack.packb([key, now_ms]))
    if stop > start or cursor(reader, depot, partition) is None:
        builder.writes.put(META, _prefix(_CURSOR, depot, partition), max(stop, start).to_bytes(8, "big"))
    # tombstones queued long enough: the record and its key's index entry go (oldest first, bounded too)
    for k, v in list(reader.scan(META, tombs, tombs + b"\xff" * 9))[:limit]:
        key, queued_ms = msgpack.unpackb(v)
        if queued_ms > now_ms - delete_retention_ms:
            break
        offset = int.from_bytes(k[len(tombs):], "big")
        if offset >= info.start:
            drop(offset)
        builder.writes.delete(META, k)
        builder.writes.delete(META, index + key)
    if deleted:
        st = read_state(reader, depot, partition)
        write_state(builder, depot, partition, RetentionState(st.start_bytes, st.marks,
                                                              st.compacted_records + deleted,
                                                              st.compacted_bytes + deleted_bytes))
    return deleted
