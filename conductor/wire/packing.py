"""Many byte strings as one bytes field plus a length array: how replies and peer messages carry records.

Python pays per object: one protobuf ``bytes`` field and one array of
little-endian uint32 lengths cost two objects however many records travel, where
a ``repeated bytes`` field costs one per record on each side.
"""

from __future__ import annotations

# the lengths codec is pstate's (a depot stores an appended batch in this form: pstate.depot_batches)
from pstate.packed_records import pack_lengths as pack_lengths
from pstate.packed_records import unpack_lengths as unpack_lengths


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
