"""Idempotent producers: each client's recent request numbers, kept with the entries they made.

A client (a *producer*, Kafka's word) numbers its requests to each task group;
a retry after a lost reply carries the same ``(producer, sequence)``. The
entry that appends a request's records also records the request's reply here,
in the same replog entry, so the state travels with the data: a follower
applies it with the records, and a new leader sees it for entries it holds but
has not applied yet (they are staged). A request whose number is recorded is a
retry: it is answered with the original depot offsets and ack values and
appends nothing.

Bounded, in ``_meta`` (big-endian integers):

* ``q:`` + producer u64 + slot u16 -> msgpack ``[sequence, first offsets, ack values]``:
  the reply of each of the producer's last :data:`WINDOW` sequence numbers, in
  :data:`WINDOW` slots (sequence ``s`` overwrites ``s - WINDOW``: no deletes);
* ``p:`` + producer u64 -> highest sequence u64 + last use (ms) u64;
* ``r:`` + last use (ms) u64 + producer u64 -> ``b""``: producers by last use, so
  the least recently used one is found with one seek and forgotten once it is idle
  for :data:`EXPIRY_MS` or more than :data:`MAX_PRODUCERS` are known;
* ``pn`` -> how many producers are known.

Past the window (a sequence number at or below the highest minus
:data:`WINDOW` that is not recorded), or from a forgotten producer, a request
is appended again: delivery is at-least-once there, exactly-once inside.
The times come from the leader's clock and are written into the entry, so every
replica forgets the same producers at the same offset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from pstate.engine import Reader
from pstate.store import META, ChangeSetBuilder

#: sequence numbers remembered per producer and task group (more than a client keeps in flight to one group)
WINDOW = 128
#: a producer idle this long is forgotten (its retries after that are appended again)
EXPIRY_MS = 60 * 60 * 1000
#: most producers remembered per task group; the least recently used one goes first
MAX_PRODUCERS = 4096
#: a producer's every this-many-th request also looks for an idle producer to forget (a new one always does)
EXPIRY_CHECK_EVERY = 32
#: the last-use index is rewritten at most this often per producer (a coarse LRU costs fewer writes)
TOUCH_MS = 1000

_HEAD = b"p:"
_SEQ = b"q:"
_LRU = b"r:"
_COUNT = b"pn"
_U64 = 1 << 64


@dataclass(frozen=True)
class Previous:
    """The reply a request got the first time: its depot offsets (one per partition) and ack values."""

    firsts: list[int]
    acks: dict[str, list[Any]]


@dataclass(frozen=True)
class Lookup:
    """What the window says of one request: its original reply if it is a retry, and the producer's head."""

    pid: bytes
    sequence: int
    #: (highest sequence, last use in ms), None for a producer not known here
    head: tuple[int, int] | None
    previous: Previous | None


def _u64(n: int, what: str) -> bytes:
    if type(n) is not int or not 0 <= n < _U64:
        raise ValueError(f"{what} {n!r} must be an int in [0, 2**64)")
    return n.to_bytes(8, "big")


def _slot(pid: bytes, sequence: int) -> bytes:
    """Sequence numbers share WINDOW slots per producer: recording one overwrites the one WINDOW before it."""
    return _SEQ + pid + (sequence % WINDOW).to_bytes(2, "big")


def _count(reader: Reader) -> int:
    raw = reader.get(META, _COUNT)
    return 0 if raw is None else int.from_bytes(raw, "big")


def lookup(reader: Reader, producer: int, sequence: int) -> Lookup:
    """Whether ``(producer, sequence)`` is a retry (``previous`` set: answer it, append nothing)."""
    pid = _u64(producer, "producer")
    _u64(sequence, "sequence")
    raw = reader.get(META, _HEAD + pid)
    if raw is None:
        return Lookup(pid, sequence, None, None)
    head = int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:16], "big")
    if sequence > head[0]:
        return Lookup(pid, sequence, head, None)  # newer than any seen: the common case costs one read
    slot = reader.get(META, _slot(pid, sequence))
    if slot is not None:
        seq, firsts, acks = msgpack.unpackb(slot, raw=False, strict_map_key=False)
        if seq == sequence:
            return Lookup(pid, sequence, head, Previous(list(firsts), dict(acks)))
    return Lookup(pid, sequence, head, None)


def record(builder: ChangeSetBuilder, seen: Lookup, firsts: list[int], acks: dict[str, list[Any]],
           now_ms: int) -> bool:
    """Record the reply of a request appended in ``builder``'s entry; False when it is past the window.

    ``seen`` is the request's :func:`lookup`, made before its entry was built.
    A new producer, and every :data:`EXPIRY_CHECK_EVERY`-th sequence number,
    also forgets at most one producer that expired (or the least recently used
    one beyond :data:`MAX_PRODUCERS`), so the work per append stays constant and
    the count never exceeds the bound.
    """
    assert seen.previous is None, "a retry appends nothing, so it records nothing"
    w = builder.writes
    pid, sequence = seen.pid, seen.sequence
    if seen.head is None:
        highest, used = sequence, -1
        count = _count(builder.reader) + 1
        w.put(META, _COUNT, count.to_bytes(8, "big"))
    else:
        highest, used = seen.head
        if sequence <= highest - WINDOW:
            return False  # too old to tell whether it was appended: at-least-once from here
        highest = max(highest, sequence)
        count = -1  # read only when looking for a producer to forget
    w.put(META, _slot(pid, sequence), msgpack.packb([sequence, firsts, acks], use_bin_type=True))
    if now_ms - used >= TOUCH_MS:
        if used >= 0:
            w.delete(META, _LRU + used.to_bytes(8, "big") + pid)
        used = now_ms
        w.put(META, _LRU + used.to_bytes(8, "big") + pid, b"")
    w.put(META, _HEAD + pid, highest.to_bytes(8, "big") + used.to_bytes(8, "big"))
    if count >= 0 or sequence % EXPIRY_CHECK_EVERY == 0:  # a new producer, or now and then
        _expire_one(builder, count if count >= 0 else _count(builder.reader), now_ms, pid)
    return True


def _expire_one(builder: ChangeSetBuilder, count: int, now_ms: int, keep: bytes) -> None:
    """Forget the least recently used producer if it is idle too long or one too many are known."""
    for key, _v in builder.reader.scan(META, _LRU, _LRU[:-1] + bytes([_LRU[-1] + 1])):
        used = int.from_bytes(key[2:10], "big")
        pid = key[10:18]
        if pid == keep or (now_ms - used < EXPIRY_MS and count <= MAX_PRODUCERS):
            return
        w = builder.writes
        w.delete(META, key)
        w.delete(META, _HEAD + pid)
        w.delete_range(META, _SEQ + pid, _SEQ + pid + b"\xff" * 3)
        w.put(META, _COUNT, (count - 1).to_bytes(8, "big"))
        return


def producers(reader: Reader) -> int:
    """How many producers this task group remembers."""
    return _count(reader)


__all__ = ["EXPIRY_MS", "MAX_PRODUCERS", "WINDOW", "Lookup", "Previous", "lookup", "producers", "record"]
