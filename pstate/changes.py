"""The replog entry payload for PState and depot changes: a ``ChangeSet``.

Why resolved writes and not declarative ops: a replog entry must hold the
resulting writes, never code (docs/vocabulary.md, entry) — ``update(fn)`` runs only on the
leader — and followers must reach byte-identical state by applying blindly,
without reading.  So the leader resolves every transform, depot append and
trim into key-level ``put``/``delete``/``delete_range`` operations against its
current state (plus the writes of entries it has appended but not yet
applied, see :class:`Overlay`), and the follower just feeds them into one
RocksDB WriteBatch.  Replaying the same entry on the same state is a no-op
because ``apply`` ignores offsets at or below ``_meta.applied``.

Wire format (msgpack, compact and batch-friendly — one array per run of
operations on one column family, not one map per write)::

    [1, topology | nil, batch_id | nil, [cf_name, ...], [[op, cf_index, [a, b, a, b, ...]], ...]]

``op`` is ``0`` put (pairs key, value), ``1`` delete (keys) or ``2``
delete_range (pairs begin, end).  Keys and values are raw bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from pstate.errors import CorruptStore

OP_PUT = 0
OP_DELETE = 1
OP_DELETE_RANGE = 2
FORMAT_VERSION = 1
_UNKNOWN = (False, None)


@dataclass
class ChangeSet:
    """Decoded replog payload: runs of writes per column family, optionally tagged (topology, batch_id)."""

    cfs: list[str] = field(default_factory=list)
    runs: list[tuple[int, int, list[bytes]]] = field(default_factory=list)
    topology: str | None = None
    batch_id: int | None = None

    def encode(self) -> bytes:
        """msgpack bytes for the replog entry."""
        out: bytes = msgpack.packb(
            [FORMAT_VERSION, self.topology, self.batch_id, self.cfs, _joined(self.runs)],
            use_bin_type=True,
        )
        return out

    @staticmethod
    def decode(payload: bytes) -> ChangeSet:
        """Parse a payload, refusing anything malformed with :class:`CorruptStore` (never a half-apply)."""
        try:
            obj = msgpack.unpackb(payload, raw=False, use_list=True)
            version, topology, batch_id, cfs, runs = obj
        except Exception as exc:
            raise CorruptStore("replog payload", f"not a ChangeSet ({exc})") from exc
        if version != FORMAT_VERSION:
            raise CorruptStore("replog payload", f"unknown ChangeSet version {version!r}")
        if not isinstance(cfs, list) or not isinstance(runs, list):
            raise CorruptStore("replog payload", "bad ChangeSet header")
        for r in runs:
            if (not isinstance(r, list) or len(r) != 3 or r[0] not in (0, 1, 2)
                    or type(r[1]) is not int or not 0 <= r[1] < len(cfs) or not isinstance(r[2], list)
                    or (r[0] != OP_DELETE and len(r[2]) % 2)):
                raise CorruptStore("replog payload", f"bad ChangeSet run {str(r)[:80]}")
        return ChangeSet(cfs, [(r[0], r[1], r[2]) for r in runs], topology, batch_id)

    def __len__(self) -> int:
        n = 0
        for op, _, items in self.runs:
            n += len(items) if op == OP_DELETE else len(items) // 2
        return n


def _joined(runs: list[tuple[int, int, list[bytes]]]) -> list[list[Any]]:
    """The runs as the wire holds them: a run joins its column family's last one when their op is the same.

    Writes interleave families (a handler puts a timeline entry, then a
    counter, per message), which made one run per write: every replica then
    paid per run to decode, check and apply it. Keys of different families
    never meet, so only each family's own order matters (as in RocksDB's
    WriteBatch), and joining keeps it. The writes' own lists are never changed.
    """
    out: list[list[Any]] = []
    last: dict[int, int] = {}  # column family index -> its last run in `out`
    copied: set[int] = set()
    for op, ci, items in runs:
        j = last.get(ci)
        if j is None or out[j][0] != op:
            last[ci] = len(out)
            out.append([op, ci, items])
        elif j in copied:
            out[j][2].extend(items)
        else:
            out[j][2] = out[j][2] + items
            copied.add(j)
    return out


class Writes:
    """An ordered list of key writes being built, with an :class:`Overlay` so later reads see them."""

    def __init__(self) -> None:
        self.cfs: list[str] = []
        self._cf_index: dict[str, int] = {}
        self.runs: list[tuple[int, int, list[bytes]]] = []
        self._last: tuple[int, str] | None = None
        self._overlay = Overlay()
        # the overlay is brought up to date lazily (blind puts in bulk never pay for it)
        self._synced_run = 0
        self._synced_item = 0

    def _run(self, op: int, cf: str) -> list[bytes]:
        if self._last == (op, cf):
            return self.runs[-1][2]
        ci = self._cf_index.get(cf)
        if ci is None:
            ci = self._cf_index[cf] = len(self.cfs)
            self.cfs.append(cf)
        items: list[bytes] = []
        self.runs.append((op, ci, items))
        self._last = (op, cf)
        return items

    @property
    def overlay(self) -> Overlay:
        """Every write so far, indexed for reads."""
        ov = self._overlay
        runs = self.runs
        r, j = self._synced_run, self._synced_item
        if r == len(runs) - 1 and j == len(runs[r][2]):
            return ov  # up to date (the common case: a read right after a read)
        while r < len(runs):
            op, ci, items = runs[r]
            cf = self.cfs[ci]
            if op == OP_PUT:
                d = ov.points.get(cf)
                if d is None:
                    d = ov.points[cf] = {}
                d.update(zip(items[j::2], items[j + 1::2], strict=True))  # = ov.put of each pair, in order, in C
            elif op == OP_DELETE:
                for x in range(j, len(items)):
                    ov.put(cf, items[x], None)
            else:
                for x in range(j, len(items), 2):
                    ov.delete_range(cf, items[x], items[x + 1])
            if r == len(runs) - 1:
                j = len(items)
                break
            r += 1
            j = 0
        self._synced_run, self._synced_item = r, j
        return ov

    def lookup(self, cf: str, key: bytes) -> tuple[bool, bytes | None]:
        runs = self.runs
        ov = self._overlay if not runs or (self._synced_run == len(runs) - 1
                                           and self._synced_item == len(runs[-1][2])) else self.overlay
        d = ov.points.get(cf)
        if d is not None and key in d:
            return True, d[key]
        return ov.lookup(cf, key) if ov.ranges else _UNKNOWN

    def scan(self, cf: str, base: Iterator[tuple[bytes, bytes]], lo: bytes, hi: bytes | None,
             reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        return self.overlay.scan(cf, base, lo, hi, reverse)

    def _in_sync(self) -> bool:
        """True when the overlay holds every write so far (then a small write updates it at once)."""
        runs = self.runs
        if not runs:
            return True
        return self._synced_run == len(runs) - 1 and self._synced_item == len(runs[-1][2])

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        runs = self.runs
        in_sync = not runs or (self._synced_run == len(runs) - 1 and self._synced_item == len(runs[-1][2]))
        last = self._last
        items = runs[-1][2] if last is not None and last[0] == OP_PUT and last[1] == cf else self._run(OP_PUT, cf)
        items.append(key)
        items.append(value)
        if in_sync:  # reads and writes interleave (a transform per message): keep the overlay current as we go
            d = self._overlay.points.get(cf)
            if d is None:
                d = self._overlay.points[cf] = {}
            d[key] = value
            self._synced_run, self._synced_item = len(runs) - 1, len(items)

    def put_many(self, cf: str, keys: list[bytes], values: Sequence[bytes]) -> None:
        """``put(cf, k, v)`` for each pair, in order."""
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys for {len(values)} values")
        pairs: list[bytes] = [b""] * (2 * len(keys))
        pairs[0::2] = keys
        pairs[1::2] = values
        items = self.runs[-1][2] if self._last == (OP_PUT, cf) else self._run(OP_PUT, cf)
        items.extend(pairs)

    def delete(self, cf: str, key: bytes) -> None:
        self._run(OP_DELETE, cf).append(key)

    def delete_range(self, cf: str, begin: bytes, end: bytes) -> None:
        items = self._run(OP_DELETE_RANGE, cf)
        items.append(begin)
        items.append(end)

    def extend(self, other: Writes | ChangeSet) -> None:
        """Append ``other``'s writes after ours (one transform committed atomically, or a decoded entry)."""
        for op, ci, items in other.runs:
            cf = other.cfs[ci]
            if op == OP_PUT:
                in_sync = self._in_sync()
                mine = self.runs[-1][2] if self._last == (OP_PUT, cf) else self._run(OP_PUT, cf)
                mine.extend(items)
                if in_sync:
                    points = self._overlay.points.get(cf)
                    if points is None:
                        points = self._overlay.points[cf] = {}
                    points.update(zip(items[0::2], items[1::2], strict=True))
                    self._synced_run, self._synced_item = len(self.runs) - 1, len(mine)
            elif op == OP_DELETE:
                for k in items:
                    self.delete(cf, k)
            else:
                for j in range(0, len(items), 2):
                    self.delete_range(cf, items[j], items[j + 1])

    def savepoint(self) -> tuple[int, int, int]:
        """A mark that :meth:`rollback` returns to: O(1), so a unit of work can take one for free.

        A stream topology runs each record (or hop message) as one unit inside a
        bigger entry; when user code fails halfway, the unit's writes must go
        and its neighbours' must stay.
        """
        return len(self.runs), len(self.runs[-1][2]) if self.runs else 0, len(self.cfs)

    def rollback(self, mark: tuple[int, int, int]) -> None:
        """Forget every write made since ``mark`` (which must come from this object's :meth:`savepoint`)."""
        nruns, nitems, ncfs = mark
        assert nruns <= len(self.runs) and ncfs <= len(self.cfs), (mark, len(self.runs), len(self.cfs))
        del self.runs[nruns:]
        if nruns:
            del self.runs[nruns - 1][2][nitems:]
        for cf in self.cfs[ncfs:]:
            del self._cf_index[cf]
        del self.cfs[ncfs:]
        self._last = None  # the next write opens a run of its own: never appends into a cut run
        # The overlay keeps only each key's latest value, so writes synced into it cannot be taken out one
        # by one: a rollback past what it saw rebuilds it lazily (failures are rare; savepoints are not).
        if (self._synced_run, self._synced_item) > (max(nruns - 1, 0), nitems if nruns else 0):
            self._overlay = Overlay()
            self._synced_run = self._synced_item = 0

    def __len__(self) -> int:
        return sum(len(items) if op == OP_DELETE else len(items) // 2 for op, _, items in self.runs)


class Overlay:
    """Pending writes layered over a reader: point writes plus range tombstones, per column family.

    A later put wins over an earlier tombstone because ``delete_range`` drops
    the point writes it covers and ``get`` consults point writes first — the
    same order RocksDB applies a WriteBatch in.
    """

    def __init__(self) -> None:
        self.points: dict[str, dict[bytes, bytes | None]] = {}
        self.ranges: dict[str, list[tuple[bytes, bytes]]] = {}

    def put(self, cf: str, key: bytes, value: bytes | None) -> None:
        d = self.points.get(cf)
        if d is None:
            d = self.points[cf] = {}
        d[key] = value

    def delete_range(self, cf: str, begin: bytes, end: bytes) -> None:
        d = self.points.get(cf)
        if d:
            for k in [k for k in d if begin <= k < end]:
                del d[k]
        self.ranges.setdefault(cf, []).append((begin, end))

    def merge(self, other: Overlay) -> None:
        """Layer ``other`` (later writes) on top of this overlay."""
        for cf, rs in other.ranges.items():
            for b, e in rs:
                self.delete_range(cf, b, e)
        for cf, d in other.points.items():
            mine = self.points.get(cf)
            if mine is None:
                self.points[cf] = dict(d)
            else:
                mine.update(d)

    def lookup(self, cf: str, key: bytes) -> tuple[bool, bytes | None]:
        """(known, value): known is False when the overlay says nothing about ``key``."""
        d = self.points.get(cf)
        if d is not None and key in d:
            return True, d[key]
        rs = self.ranges.get(cf)
        if rs:
            for b, e in rs:
                if b <= key < e:
                    return True, None
        return False, None

    def is_empty(self) -> bool:
        return not self.points and not self.ranges

    def scan(self, cf: str, base: Iterator[tuple[bytes, bytes]], lo: bytes, hi: bytes | None,
             reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        """Merge ``base`` (sorted items of the layer below, within [lo, hi)) with this overlay."""
        d = self.points.get(cf) or {}
        rs = self.ranges.get(cf) or []
        if not d and not rs:
            yield from base
            return
        mine = sorted(k for k in d if k >= lo and (hi is None or k < hi))
        if reverse:
            mine.reverse()

        def hidden(k: bytes) -> bool:
            return k in d or any(b <= k < e for b, e in rs)

        j = 0
        for k, v in base:
            while j < len(mine) and ((mine[j] > k) if reverse else (mine[j] < k)):
                mv = d[mine[j]]
                if mv is not None:
                    yield mine[j], mv
                j += 1
            if hidden(k):
                continue
            yield k, v
        while j < len(mine):
            mv = d[mine[j]]
            if mv is not None:
                yield mine[j], mv
            j += 1


def encode_writes(w: Writes, topology: str | None, batch_id: int | None) -> bytes:
    """Encode a :class:`Writes` as a ChangeSet payload."""
    return ChangeSet(w.cfs, w.runs, topology, batch_id).encode()


def decode_any(payload: bytes | ChangeSet) -> ChangeSet:
    return payload if isinstance(payload, ChangeSet) else ChangeSet.decode(payload)


__all__ = ["ChangeSet", "Overlay", "Writes", "decode_any", "encode_writes"]
