"""Many byte strings as one bytes value plus an array of their lengths (little-endian u32 each).

How depot records travel (replies, peer messages) and, since session 16, how a depot stores an appended batch
of them (:mod:`pstate.depot_batches`): Python pays per object, so one ``bytes`` value and one array of lengths
cost two objects however many records there are, where a list costs one per record on each side. A stored
batch is served by slicing it (its lengths and its records are already in this form), never by splitting it.

Pure (no RocksDB): the client's and the Spark reader's side use it too (:mod:`conductor.wire.packing`).
"""

from __future__ import annotations

import array
import itertools
import sys
from collections.abc import Sequence
from dataclasses import dataclass

_LITTLE = sys.byteorder == "little"


def pack_lengths(items: Sequence[bytes]) -> bytes:
    """The lengths of ``items`` as little-endian uint32s (send or store ``b"".join(items)`` beside them)."""
    lengths = array.array("I", map(len, items))
    assert lengths.itemsize == 4, lengths.itemsize
    if not _LITTLE:
        lengths.byteswap()
    return lengths.tobytes()


def sizes(lengths: bytes | memoryview) -> array.array[int]:
    """The lengths :func:`pack_lengths` wrote, as ints (one C copy)."""
    out = array.array("I")
    out.frombytes(lengths)
    if not _LITTLE:
        out.byteswap()
    return out


def unpack_lengths(packed: bytes, lengths: bytes) -> list[bytes]:
    """The byte strings ``pack_lengths`` described; ValueError when the lengths do not add up to ``packed``."""
    n = sizes(lengths)
    ends = list(itertools.accumulate(n))
    if (ends[-1] if ends else 0) != len(packed):
        raise ValueError(f"{len(packed)} packed bytes, but the lengths add up to {ends[-1] if ends else 0}")
    return [packed[e - k:e] for k, e in zip(n, ends, strict=True)]


@dataclass(frozen=True)
class PackedRecords:
    """Records back to back (``data``) and their lengths (``lengths``: u32 little-endian each), as a reply
    carries them; ``split`` makes the per-record list only for a caller that needs one."""

    data: bytes
    lengths: bytes

    def __len__(self) -> int:
        return len(self.lengths) // 4

    def split(self) -> list[bytes]:
        return unpack_lengths(self.data, self.lengths)

    @classmethod
    def of(cls, records: Sequence[bytes]) -> PackedRecords:
        return cls(b"".join(records), pack_lengths(records))


EMPTY = PackedRecords(b"", b"")
