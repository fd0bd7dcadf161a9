"""A task group's dataflow state on disk: its outbox to other groups and its inbox positions.

A stream topology that hops to a key owned by another task group leaves an
*envelope* for that group in the entry that made it (see
:mod:`topology.dataflow`). This module only stores them; it does not know what
is inside. Everything is written through a :class:`ChangeSetBuilder`, so an
envelope, a position or a trim is part of one replog entry with the effects
that caused it, and is applied on every replica atomically with them:

* ``_outbox`` column family: ``dst u32 + seq u64`` (big-endian) -> envelope bytes.
  Sequence numbers count per destination from 0, with no holes; the leader
  assigns them while it builds the entry, reading through staged entries, like
  depot offsets.
* ``_meta`` ``o:`` + ``dst u32`` -> ``start u64, end u64, bytes u64``: the live
  envelopes ``start <= seq < end`` and their total size (for backpressure).
  Envelopes below ``start`` were trimmed once the destination reported them
  complete.
* ``_meta`` ``i:`` + ``src u32`` -> ``next u64``: every envelope ``src`` sent
  here with ``seq < next`` has been consumed, its effects in the same entry as
  this position (exactly once: a replayed or resent envelope is below it).
* ``_meta`` ``x:dead`` -> ``u64``: records and messages moved to the dead-letter depot.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pstate.changes import OP_PUT, ChangeSet
from pstate.engine import Reader
from pstate.store import META, OUTBOX, ChangeSetBuilder

_BOUNDS = b"o:"
_INBOX = b"i:"
_DEAD = b"x:dead"
_U32 = 1 << 32


@dataclass(frozen=True)
class OutboxBounds:
    """Live envelopes to one destination: ``start <= seq < end``, ``nbytes`` in total."""

    start: int = 0
    end: int = 0
    nbytes: int = 0

    @property
    def pending(self) -> int:
        return self.end - self.start


def _group(g: int) -> bytes:
    if type(g) is not int or not 0 <= g < _U32:
        raise ValueError(f"task group {g!r} must be an int in [0, 2**32)")
    return g.to_bytes(4, "big")


def _envelope_key(dst: int, seq: int) -> bytes:
    return _group(dst) + seq.to_bytes(8, "big")


def _decode_bounds(raw: bytes | None) -> OutboxBounds:
    if raw is None:
        return OutboxBounds()
    return OutboxBounds(int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:16], "big"),
                        int.from_bytes(raw[16:24], "big"))


def _encode_bounds(b: OutboxBounds) -> bytes:
    return b.start.to_bytes(8, "big") + b.end.to_bytes(8, "big") + b.nbytes.to_bytes(8, "big")


def bounds(reader: Reader, dst: int) -> OutboxBounds:
    """The live envelopes to ``dst`` as ``reader`` sees them."""
    return _decode_bounds(reader.get(META, _BOUNDS + _group(dst)))


def destinations(reader: Reader) -> dict[int, OutboxBounds]:
    """Every destination this group ever sent to, with its live envelopes."""
    out = {}
    for k, v in _prefix(reader, _BOUNDS):
        out[int.from_bytes(k[len(_BOUNDS):], "big")] = _decode_bounds(v)
    return out


def put_envelope(builder: ChangeSetBuilder, dst: int, payload: bytes) -> int:
    """Add an envelope for ``dst`` to the entry being built; returns its sequence number."""
    b = bounds(builder.reader, dst)
    builder.writes.put(OUTBOX, _envelope_key(dst, b.end), payload)
    builder.writes.put(META, _BOUNDS + _group(dst), _encode_bounds(OutboxBounds(b.start, b.end + 1,
                                                                                b.nbytes + len(payload))))
    return b.end


def trim(builder: ChangeSetBuilder, dst: int, below: int) -> int:
    """Delete envelopes to ``dst`` below ``below`` (clamped to the live ones); returns how many went.

    Only envelopes the destination reported *complete* may go: the completion
    tracker of a new leader rebuilds what is still pending from the live ones.
    """
    b = bounds(builder.reader, dst)
    new_start = min(max(below, b.start), b.end)
    if new_start == b.start:
        return 0
    freed = sum(len(v) for _k, v in builder.reader.scan(OUTBOX, _envelope_key(dst, b.start),
                                                           _envelope_key(dst, new_start)))
    builder.writes.delete_range(OUTBOX, _envelope_key(dst, b.start), _envelope_key(dst, new_start))
    builder.writes.put(META, _BOUNDS + _group(dst), _encode_bounds(OutboxBounds(new_start, b.end,
                                                                                b.nbytes - freed)))
    return new_start - b.start


def read_envelopes(reader: Reader, dst: int, start: int, end: int | None = None,
                   max_bytes: int = 1 << 20) -> list[tuple[int, bytes]]:
    """Envelopes to ``dst`` with ``start <= seq < end`` as ``(seq, bytes)``, up to about ``max_bytes``.

    At least one envelope comes back if any is in range, so a large envelope
    never stalls its destination.
    """
    out: list[tuple[int, bytes]] = []
    total = 0
    for seq, v in iter_envelopes(reader, dst, start, end):
        out.append((seq, v))
        total += len(v)
        if total >= max_bytes:
            break
    return out


def iter_envelopes(reader: Reader, dst: int, start: int, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """Envelopes to ``dst`` from ``start`` on, lazily (a new leader walks all live ones once)."""
    hi = _envelope_key(dst, end) if end is not None else _group(dst) + b"\xff" * 8
    for k, v in reader.scan(OUTBOX, _envelope_key(dst, start), hi):
        yield int.from_bytes(k[4:], "big"), v


def inbox_position(reader: Reader, src: int) -> int:
    """Next sequence number expected from ``src`` (everything below it was consumed here)."""
    raw = reader.get(META, _INBOX + _group(src))
    return 0 if raw is None else int.from_bytes(raw, "big")


def inbox_positions(reader: Reader) -> dict[int, int]:
    """Every source group's position (sources that never sent anything are absent)."""
    return {int.from_bytes(k[len(_INBOX):], "big"): int.from_bytes(v, "big") for k, v in _prefix(reader, _INBOX)}


def set_inbox_position(builder: ChangeSetBuilder, src: int, position: int) -> None:
    builder.writes.put(META, _INBOX + _group(src), position.to_bytes(8, "big"))


def dead_letters(reader: Reader) -> int:
    """How many records and messages this group moved to the dead-letter depot."""
    raw = reader.get(META, _DEAD)
    return 0 if raw is None else int.from_bytes(raw, "big")


def count_dead_letters(builder: ChangeSetBuilder, n: int) -> None:
    builder.writes.put(META, _DEAD, (dead_letters(builder.reader) + n).to_bytes(8, "big"))


def flow_of(cs: ChangeSet) -> tuple[dict[int, int], list[tuple[int, int, bytes]]]:
    """What one entry did to the dataflow: its new inbox positions and the envelopes it sent.

    Read from the entry's own writes, so a leader learns it for entries it
    inherited from an earlier epoch exactly as for those it built.
    """
    consumed: dict[int, int] = {}
    sent: list[tuple[int, int, bytes]] = []
    for op, ci, items in cs.runs:
        if op != OP_PUT:
            continue
        cf = cs.cfs[ci]
        if cf == OUTBOX:
            for j in range(0, len(items), 2):
                k = items[j]
                sent.append((int.from_bytes(k[:4], "big"), int.from_bytes(k[4:], "big"), items[j + 1]))
        elif cf == META:
            for j in range(0, len(items), 2):
                k = items[j]
                if k[:2] == _INBOX:
                    consumed[int.from_bytes(k[2:], "big")] = int.from_bytes(items[j + 1], "big")
    return consumed, sent


def _prefix(reader: Reader, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    hi = prefix[:-1] + bytes([prefix[-1] + 1])
    return reader.scan(META, prefix, hi)


__all__ = [
    "OutboxBounds",
    "bounds",
    "count_dead_letters",
    "dead_letters",
    "destinations",
    "flow_of",
    "inbox_position",
    "inbox_positions",
    "iter_envelopes",
    "put_envelope",
    "read_envelopes",
    "set_inbox_position",
    "trim",
]
