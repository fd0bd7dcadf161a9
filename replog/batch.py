"""The replog batch frame: the unit written to disk, sent to followers and checksummed.

Python pays per object, not per byte (docs/performance.md), so the frame is built
so that encoding, validating and decoding cost a handful of C-level calls per
*batch*, never a Python-level loop per *entry*.  It follows Kafka's record batch:
one header per batch, then the entries.

Layout (all integers little-endian)::

    offset  size  field
    0       8     base offset       offset of the first entry
    8       4     leader epoch      epoch of the leader that created every entry of the batch
    12      4     entry count       >= 1
    16      4     payload length    bytes after the header (= 5 * count + sum of entry lengths)
    20      4     CRC32C            see below
    24      n     entry types       ``count`` bytes, one u8 type per entry
    24+n    4n    entry lengths     ``count`` u32 (an ``array('I')`` image)
    24+5n   ...   payloads          concatenated entry payloads

The body is *columnar* (all types, then all lengths, then all payloads) instead of
Kafka's row-wise varints: that turns encoding into ``bytes(types) +
array('I', map(len, payloads)).tobytes() + b"".join(payloads)`` and decoding into
``itertools.accumulate`` over the lengths, all of which run in C.

The CRC32C covers everything after the CRC field (the body) *and* the 20 header
bytes before it.  Kafka leaves the base offset out of its CRC because brokers
rewrite offsets of producer batches; a Millrace frame is created once by the
leader and then copied byte for byte (followers append the leader's frames
unchanged), so there is no reason to leave a flipped base offset, epoch or count
undetected.

A frame never changes once written, except when a truncation cuts a batch in two:
the kept prefix is re-encoded with the same base offset and epoch
(:func:`truncate_frame`).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from itertools import accumulate, islice, repeat
from typing import NamedTuple

from crc32c import crc32c

from replog.errors import InvalidFrame

__all__ = [
    "HEADER_SIZE",
    "MAX_BODY",
    "Batch",
    "FrameHeader",
    "ScanResult",
    "check_frames",
    "decode_frames",
    "encode_batch",
    "encode_parts",
    "scan_frames",
    "trim_frames",
    "truncate_frame",
]

_PREFIX = struct.Struct("<QIII")  # base offset, epoch, count, payload length
_HEADER = struct.Struct("<QIIII")  # ... plus the CRC
_CRC = struct.Struct("<I")
PREFIX_SIZE = _PREFIX.size  # 20: the bytes the CRC covers before itself
HEADER_SIZE = _HEADER.size  # 24
MAX_BODY = 0xFFFFFFFF  # the payload length field is a u32
MAX_EPOCH = 0xFFFFFFFF
MAX_OFFSET = 0xFFFFFFFFFFFFFFFF

# The lengths column is an ``array('I')`` image: it must be 4 bytes wide and
# little-endian on disk, whatever the host.
assert array("I").itemsize == 4, "array('I') must be 32 bits wide on this platform"
_SWAP = sys.byteorder != "little"

TypesArg = int | bytes | bytearray | Sequence[int]


class FrameHeader(NamedTuple):
    """One validated frame inside a buffer: its header fields and its byte span ``[start, end)``."""

    base_offset: int
    epoch: int
    entry_count: int
    start: int
    end: int

    @property
    def last_offset(self) -> int:
        """Offset of the last entry of the batch."""
        return self.base_offset + self.entry_count - 1

    @property
    def next_offset(self) -> int:
        """Offset the entry after this batch gets."""
        return self.base_offset + self.entry_count

    @property
    def size(self) -> int:
        """Frame size in bytes, header included."""
        return self.end - self.start


class ScanResult(NamedTuple):
    """What :func:`scan_frames` found.

    ``end`` is where the valid frames stop.  When ``error`` is ``None`` every byte up
    to the end of the scanned range was a valid frame.  ``torn`` says the scan stopped
    because the buffer ended in the middle of a frame (a short header, or a length
    that runs past the end): a torn write on disk, or a read that did not take the
    whole last frame.  Any other error is damage inside the buffer.
    """

    frames: list[FrameHeader]
    end: int
    error: str | None
    torn: bool


def _types_column(types: TypesArg, count: int) -> bytes:
    """The entry-type column: one byte per entry (``bytes()`` rejects values outside 0..255)."""
    if isinstance(types, int):
        if not 0 <= types <= 255:
            raise ValueError(f"entry type {types} does not fit in a u8 (0..255)")
        return bytes((types,)) * count
    try:
        column = bytes(types)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"entry types must be ints in 0..255: {exc}") from None
    if len(column) != count:
        raise ValueError(f"got {len(column)} entry types for {count} payloads")
    return column


def encode_parts(
    base_offset: int, epoch: int, types: TypesArg, payloads: Sequence[bytes]
) -> tuple[bytes, bytes, bytes, bytes]:
    """Encode one batch as its four parts: header, type column, length column, payloads.

    Their concatenation is the frame.  The log hands the parts straight to
    ``os.writev`` so a large batch is copied once (the payload join) rather than
    twice; big short-lived buffers are expensive in CPython because each one is
    fresh ``mmap`` memory that page-faults on first touch.
    """
    count = len(payloads)
    if count == 0:
        raise ValueError("a batch needs at least one entry")
    if not 0 <= base_offset <= MAX_OFFSET - count:
        raise ValueError(f"base offset {base_offset} out of range")
    if not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"leader epoch {epoch} does not fit in a u32")
    type_col = _types_column(types, count)
    lengths = array("I", map(len, payloads))
    if _SWAP:
        lengths.byteswap()
    length_col = lengths.tobytes()
    data = b"".join(payloads)
    body_len = 5 * count + len(data)
    if body_len > MAX_BODY:
        raise ValueError(f"batch body of {body_len} bytes exceeds the u32 frame limit; split the batch")
    prefix = _PREFIX.pack(base_offset, epoch, count, body_len)
    crc = crc32c(data, crc32c(length_col, crc32c(type_col, crc32c(prefix))))
    return prefix + _CRC.pack(crc), type_col, length_col, data


def encode_batch(base_offset: int, epoch: int, types: TypesArg, payloads: Sequence[bytes]) -> bytes:
    """Encode one batch frame.

    ``types`` is either one int (every entry has that type, the common case) or one
    type per payload.  ``payloads`` is a list of ``bytes``-like objects; the work is a
    few C calls whatever their number.  Raises ``ValueError`` for an empty batch or
    out-of-range fields, because a frame that cannot be decoded must never be written.
    """
    return b"".join(encode_parts(base_offset, epoch, types, payloads))


def scan_frames(
    buf: bytes | bytearray | memoryview,
    start: int = 0,
    end: int | None = None,
    *,
    expect_offset: int | None = None,
    min_epoch: int = 0,
) -> ScanResult:
    """Walk concatenated frames in ``buf[start:end]``, validating each one, and stop at the first bad one.

    Checks per frame: a whole header, ``count >= 1``, a length consistent with the
    count, the CRC32C, the sum of the entry lengths, contiguous offsets (the first
    frame must start at ``expect_offset`` when given) and non-decreasing epochs (at
    least ``min_epoch``).  Cost per frame: one ``unpack_from``, one CRC call over the
    frame, one ``array`` sum; no per-entry Python work.

    Used by followers to validate raw frames from the leader before appending them
    unchanged, by the log to recover its tail on open, and by reads to check what
    they return.  It never raises for bad data; the caller decides whether a bad
    frame is a torn tail to cut or an error.
    """
    if end is None:
        end = len(buf)
    frames: list[FrameHeader] = []
    pos = start
    expected = expect_offset
    last_epoch = min_epoch
    unpack = _HEADER.unpack_from
    mv = memoryview(buf)
    while pos < end:
        if end - pos < HEADER_SIZE:
            return ScanResult(frames, pos, f"short header: {end - pos} of {HEADER_SIZE} bytes", True)
        base, epoch, count, body_len, crc = unpack(buf, pos)
        if count == 0:
            return ScanResult(frames, pos, "entry count is 0", False)
        if body_len < 5 * count:
            return ScanResult(frames, pos, f"payload length {body_len} too small for {count} entries", False)
        frame_end = pos + HEADER_SIZE + body_len
        if frame_end > end:
            return ScanResult(
                frames, pos, f"frame of {HEADER_SIZE + body_len} bytes runs past the data ({end - pos})", True
            )
        body_start = pos + HEADER_SIZE
        if crc32c(mv[body_start:frame_end], crc32c(mv[pos : pos + PREFIX_SIZE])) != crc:
            return ScanResult(frames, pos, "CRC32C mismatch", False)
        lengths = array("I")
        lengths.frombytes(mv[body_start + count : body_start + 5 * count])
        if _SWAP:
            lengths.byteswap()
        if sum(lengths) != body_len - 5 * count:
            return ScanResult(frames, pos, "entry lengths do not add up to the payload length", False)
        if expected is not None and base != expected:
            return ScanResult(frames, pos, f"base offset {base}, expected {expected}", False)
        if epoch < last_epoch:
            return ScanResult(
                frames, pos, f"leader epoch {epoch} is lower than the preceding {last_epoch}", False
            )
        frames.append(FrameHeader(base, epoch, count, pos, frame_end))
        expected = base + count
        last_epoch = epoch
        pos = frame_end
    return ScanResult(frames, pos, None, False)


def check_frames(
    buf: bytes | bytearray | memoryview, *, expect_offset: int | None = None, min_epoch: int = 0
) -> list[FrameHeader]:
    """:func:`scan_frames` over the whole buffer, raising :class:`InvalidFrame` unless every byte is valid."""
    result = scan_frames(buf, expect_offset=expect_offset, min_epoch=min_epoch)
    if result.error is not None:
        raise InvalidFrame(result.end, result.error)
    return result.frames


class Batch:
    """A lightweight view of one frame: header fields are parsed eagerly, entries only on demand.

    Holds a reference to the buffer; nothing is copied until :meth:`entries` or
    :meth:`payloads` is called.  It does not re-check the CRC: build views with
    :func:`decode_frames` (which validates) or over frames already validated.
    """

    __slots__ = ("_buf", "_start", "base_offset", "count", "end", "epoch")

    def __init__(self, buf: bytes, start: int = 0) -> None:
        base, epoch, count, body_len, _crc = _HEADER.unpack_from(buf, start)
        self._buf = buf
        self._start = start
        self.base_offset: int = base
        self.epoch: int = epoch
        self.count: int = count
        self.end: int = start + HEADER_SIZE + body_len

    @property
    def last_offset(self) -> int:
        """Offset of the last entry."""
        return self.base_offset + self.count - 1

    @property
    def next_offset(self) -> int:
        """Offset the entry after this batch gets."""
        return self.base_offset + self.count

    def frame(self) -> bytes:
        """The raw frame bytes (header included), e.g. to forward to a follower."""
        return bytes(self._buf[self._start : self.end])

    def types(self) -> bytes:
        """The entry-type column: iterate it to get one int per entry."""
        s = self._start + HEADER_SIZE
        return bytes(self._buf[s : s + self.count])

    def _bounds(self) -> list[int]:
        s = self._start + HEADER_SIZE
        n = self.count
        lengths = array("I")
        lengths.frombytes(self._buf[s + n : s + 5 * n])
        if _SWAP:
            lengths.byteswap()
        return list(accumulate(lengths, initial=s + 5 * n))

    def payloads(self) -> list[bytes]:
        """Every entry payload, as ``bytes``, in offset order (C-level slicing, no Python loop)."""
        bounds = self._bounds()
        buf = self._buf
        return list(map(buf.__getitem__, map(slice, bounds, islice(bounds, 1, None))))

    def entries(self) -> list[tuple[int, bytes]]:
        """``(type, payload)`` per entry, in offset order."""
        return list(zip(self.types(), self.payloads(), strict=True))

    def offset_entries(self) -> list[tuple[int, int, int, bytes]]:
        """``(offset, epoch, type, payload)`` per entry: the shape :meth:`replog.log.Log.read_entries` returns."""
        n = self.count
        return list(
            zip(
                range(self.base_offset, self.base_offset + n),
                repeat(self.epoch, n),
                self.types(),
                self.payloads(),
                strict=True,
            )
        )

    def __repr__(self) -> str:
        return f"Batch(base_offset={self.base_offset}, count={self.count}, epoch={self.epoch})"


def decode_frames(buf: bytes, *, expect_offset: int | None = None) -> list[Batch]:
    """Validate concatenated frames and return one :class:`Batch` view per frame (raises :class:`InvalidFrame`)."""
    return [Batch(buf, f.start) for f in check_frames(buf, expect_offset=expect_offset)]


def truncate_frame(frame: bytes, keep: int) -> bytes:
    """Re-encode ``frame`` with only its first ``keep`` entries (same base offset and epoch).

    This is how a truncation that lands inside a batch (KIP-101 divergence points
    can) is carried out: the kept prefix becomes a smaller, fully valid frame.
    """
    batch = Batch(frame)
    if not 0 < keep < batch.count:
        raise ValueError(f"can keep 1..{batch.count - 1} entries of a {batch.count}-entry batch, not {keep}")
    return encode_batch(batch.base_offset, batch.epoch, batch.types()[:keep], batch.payloads()[:keep])


def trim_frames(raw: bytes, from_offset: int) -> bytes:
    """Drop every entry below ``from_offset`` from validated concatenated frames.

    A follower that truncated inside a batch ends in the middle of one of the
    leader's batches, and the leader's :meth:`replog.log.Log.read` returns whole
    frames, so the first frame received starts below the follower's end offset.
    ``log.append_frames(trim_frames(raw, log.end_offset))`` re-encodes only the
    straddling frame's suffix (same epoch, entries unchanged) and passes every
    later frame through byte for byte.  Raises :class:`InvalidFrame` for bad frames.
    """
    out: list[bytes] = []
    for f in check_frames(raw):
        if f.next_offset <= from_offset:
            continue
        if f.base_offset >= from_offset:
            out.append(raw[f.start :])
            break
        batch = Batch(raw, f.start)
        skip = from_offset - f.base_offset
        out.append(encode_batch(from_offset, batch.epoch, batch.types()[skip:], batch.payloads()[skip:]))
    return b"".join(out)
