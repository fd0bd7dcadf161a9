"""Many byte strings as one bytes field plus a length array: how replies and peer messages carry records.

Python pays per object: one protobuf ``bytes`` field and one array of
little-endian uint32 lengths cost two objects however many records travel, where
a ``repeated bytes`` field costs one per record on each side.
"""

from __future__ import annotations

import array
import itertools
import sys


def pack_lengths(items: list[bytes]) -> bytes:
    """The lengths of ``items`` as little-endian uint32s (send ``b"".join(items)`` beside them)."""
    lengths = array.array("I", map(len, items))
    if sys.byteorder != "little":
        lengths.byteswap()
    return lengths.tobytes()


def unpack_lengths(packed: bytes, lengths: bytes) -> list[bytes]:
    """The byte strings ``pack_lengths`` described; ValueError when the lengths do not add up to ``packed``."""
    sizes = array.array("I")
    sizes.frombytes(lengths)
    if sys.byteorder != "little":
        sizes.byteswap()
    ends = list(itertools.accumulate(sizes))
    if (ends[-1] if ends else 0) != len(packed):
        raise ValueError(f"{len(packed)} packed bytes, but the lengths add up to {ends[-1] if ends else 0}")
    return [packed[e - n:e] for n, e in zip(sizes, ends, strict=True)]


def varint(n: int) -> bytes:
    """``n`` (>= 0) as a protobuf base-128 varint: for messages written by hand, where copying a large field
    into a protobuf object first would cost more than the message."""
    assert n >= 0, n
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
