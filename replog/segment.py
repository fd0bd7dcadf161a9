"""One replog segment file: its name, its sparse index, frame lookup, and recovery of a torn tail on open.

A log is a directory of segments named by their first offset. Only the last
one is written; a crash can leave a torn frame at its end, which is cut when
the log is opened (and logged), while damage anywhere else is an error that
names the file and the byte. Sealed segments are indexed on first read.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import re
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from replog.batch import HEADER_SIZE, Batch, FrameHeader, ScanResult, scan_frames
from replog.durable_file import fsync_dir
from replog.errors import CorruptLog

_log = logging.getLogger("millrace.replog")

MiB = 1024 * 1024
SUFFIX = ".log"
SWAP_SUFFIX = ".swap"
SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")
SCAN_CHUNK = 4 * MiB  # read size when scanning a segment

sync_data = getattr(os, "fdatasync", os.fsync)  # data + size, not mtime: enough to read the data back


class SegmentInfo(NamedTuple):
    """A segment as seen from outside: for metrics, far-horizon catchup and tests."""

    base_offset: int
    path: str
    size_bytes: int


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SUFFIX}"


def pread_exact(fd: int, n: int, pos: int) -> bytes:
    """``pread`` that does not return short unless at end of file."""
    data = os.pread(fd, n, pos)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = os.pread(fd, n - got, pos + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """``writev`` every byte of ``parts`` (a short write continues where it stopped)."""
    written = os.writev(fd, parts)
    total = sum(map(len, parts))
    if written == total:
        return
    rest = memoryview(b"".join(parts))[written:]  # rare: only after a short write
    while rest:
        rest = rest[os.write(fd, rest) :]


class Segment:
    """One segment file and its in-memory sparse index.

    ``indexed`` is False for a sealed segment nobody has read since open: its size
    and end offset are then taken from the directory listing (the next segment's
    base) and checked when the index is built.
    """

    __slots__ = (
        "base",
        "end_offset",
        "idx_offsets",
        "idx_positions",
        "indexed",
        "last_epoch",
        "last_idx_pos",
        "path",
        "size",
    )

    def __init__(self, path: Path, base: int, size: int, end_offset: int, *, indexed: bool) -> None:
        self.path = path
        self.base = base
        self.size = size
        self.end_offset = end_offset
        self.indexed = indexed
        self.last_epoch: int | None = None
        self.idx_offsets = array("Q")
        self.idx_positions = array("Q")
        self.last_idx_pos = -(1 << 62)

    def clear_index(self) -> None:
        self.idx_offsets = array("Q")
        self.idx_positions = array("Q")
        self.last_idx_pos = -(1 << 62)
        self.size = 0
        self.end_offset = self.base
        self.last_epoch = None

    def add(self, base: int, epoch: int, count: int, start: int, end: int, interval: int) -> None:
        """Record a frame written (or found) at ``[start, end)``."""
        assert start == self.size, f"frame at byte {start} but segment {self.path} ends at {self.size}"
        assert base == self.end_offset, f"frame base {base} but segment {self.path} ends at {self.end_offset}"
        if start - self.last_idx_pos >= interval:
            self.idx_offsets.append(base)
            self.idx_positions.append(start)
            self.last_idx_pos = start
        self.size = end
        self.end_offset = base + count
        self.last_epoch = epoch

    def info(self) -> SegmentInfo:
        return SegmentInfo(self.base, str(self.path), self.size)


def recover(path: Path, interval: int, durable: bool) -> list[Segment]:
    """The segments of the log at ``path``: sealed ones as listed, the tail indexed and any torn tail cut."""
    for leftover in path.glob("*" + SWAP_SUFFIX):
        # An interrupted mid-batch truncation: the segment it was replacing is intact.
        _log.warning("replog %s: removing leftover %s of an interrupted truncation", path, leftover.name)
        leftover.unlink()
    bases = sorted(int(m.group(1)) for m in map(SEGMENT_NAME.match, os.listdir(path)) if m)
    if not bases:
        (path / segment_name(0)).touch()
        if durable:
            fsync_dir(path)
        bases = [0]
    segments = [
        Segment(path / segment_name(b), b, (path / segment_name(b)).stat().st_size, nxt, indexed=False)
        for b, nxt in itertools.pairwise(bases)
    ]
    tail = Segment(path / segment_name(bases[-1]), bases[-1], 0, bases[-1], indexed=True)
    recover_tail(tail, interval)
    segments.append(tail)
    return segments


def recover_tail(seg: Segment, interval: int) -> None:
    """Index the tail segment, cutting a torn tail; raise if the damage is not at the tail."""
    fd = os.open(seg.path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        result = scan_into(seg, fd, size, interval)
        if result.error is None:
            return
        bad = result.end
        rest = pread_exact(fd, size - bad, bad)
        if not result.torn and _is_misplaced(result.error):
            raise CorruptLog(str(seg.path), bad, result.error)
        found = _find_valid_frame(rest, seg.end_offset)
        if found is not None:
            raise CorruptLog(
                str(seg.path), bad, f"{result.error}, yet a valid frame follows at byte {bad + found}"
            )
        _log.warning(
            "replog %s: cutting torn tail at byte %d (offset %d): %s; %d byte(s) dropped",
            seg.path,
            bad,
            seg.end_offset,
            result.error,
            size - bad,
        )
        os.ftruncate(fd, bad)
        sync_data(fd)
    finally:
        os.close(fd)


def find_frame(seg: Segment, fd: int, offset: int) -> tuple[int, FrameHeader]:
    """Byte position and header of the frame of ``seg`` holding ``offset`` (index lookup, then a short walk)."""
    i = bisect.bisect_right(seg.idx_offsets, offset) - 1
    assert i >= 0, f"offset {offset} below segment {seg.path}"
    pos = seg.idx_positions[i]
    while True:
        hdr = pread_exact(fd, HEADER_SIZE, pos)
        if len(hdr) < HEADER_SIZE:
            raise CorruptLog(str(seg.path), pos, f"short frame header while looking for offset {offset}")
        batch = Batch(hdr)  # a header-only view: ``batch.end`` is the frame size
        frame = FrameHeader(batch.base_offset, batch.epoch, batch.count, pos, pos + batch.end)
        if frame.next_offset > offset:
            if frame.base_offset > offset:
                raise CorruptLog(
                    str(seg.path), pos, f"offset {offset} missing: frame starts at {frame.base_offset}"
                )
            return pos, frame
        if frame.end >= seg.size:
            raise CorruptLog(
                str(seg.path), pos, f"offset {offset} not found before the end of the segment"
            )
        pos = frame.end


def ensure_indexed(seg: Segment, interval: int) -> None:
    """Build a sealed segment's index on first use, checking every frame (:class:`CorruptLog`)."""
    if seg.indexed:
        return
    expected_end = seg.end_offset
    seg.clear_index()
    fd = os.open(seg.path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        result = scan_into(seg, fd, size, interval)
    finally:
        os.close(fd)
    if result.error is not None:
        seg.clear_index()
        seg.end_offset = expected_end
        raise CorruptLog(str(seg.path), result.end, result.error)
    if seg.end_offset != expected_end:
        got = seg.end_offset
        seg.clear_index()
        seg.end_offset = expected_end
        raise CorruptLog(
            str(seg.path),
            size,
            f"segment ends at offset {got} but the next segment starts at {expected_end}",
        )
    seg.indexed = True


def scan_into(seg: Segment, fd: int, size: int, interval: int, *, start: int = 0) -> ScanResult:
    """Scan ``seg``'s file from byte ``start`` (its running state must already match ``start``) and index every valid frame.

    Reads in chunks, growing a chunk when a single frame is larger.  Returns where
    the valid frames end and why scanning stopped there (``error is None``: clean end).
    """
    pos = start
    chunk = SCAN_CHUNK
    while pos < size:
        n = min(chunk, size - pos)
        buf = pread_exact(fd, n, pos)
        result = scan_frames(buf, expect_offset=seg.end_offset, min_epoch=seg.last_epoch or 0)
        for f in result.frames:
            seg.add(f.base_offset, f.epoch, f.entry_count, pos + f.start, pos + f.end, interval)
        if result.error is None:
            pos += result.end
            chunk = SCAN_CHUNK
            continue
        if result.torn and pos + n < size:
            # The frame at ``pos + result.end`` continues past this chunk: read on, with a bigger chunk if needed.
            if result.end == 0:
                chunk *= 2
            pos += result.end
            continue
        return ScanResult([], pos + result.end, result.error, result.torn)
    return ScanResult([], pos, None, False)


def _is_misplaced(error: str) -> bool:
    """A CRC-valid frame with the wrong offset or epoch: never the product of a torn write."""
    return error.startswith(("base offset", "leader epoch"))


def _find_valid_frame(rest: bytes, expected: int) -> int | None:
    """Position in ``rest`` (after its first byte) where a CRC-valid frame starts, or ``None``.

    Decides whether a bad frame is a torn tail (nothing valid after it) or damage in
    the middle.  A regex finds candidate headers in C: the base offset must lie in
    ``[expected, expected + len(rest) // 5 + 1]`` (an entry takes at least 5 bytes),
    so its high-order bytes are fixed, and the entry count must be non-zero; only
    candidates get a Python-level CRC check.
    """
    if len(rest) <= HEADER_SIZE:
        return None
    lo = expected.to_bytes(8, "little")
    hi = min(expected + len(rest) // 5 + 1, (1 << 64) - 1).to_bytes(8, "little")
    fixed = 0
    while fixed < 8 and lo[7 - fixed] == hi[7 - fixed]:
        fixed += 1
    pattern = re.compile(
        b"(?=.{%d}%s.{4}(?!\\x00\\x00\\x00\\x00).{12})" % (8 - fixed, re.escape(lo[8 - fixed :])), re.DOTALL
    )
    for m in pattern.finditer(rest, 1):
        q = m.start()
        body_len = int.from_bytes(rest[q + 16 : q + 20], "little")
        end = q + HEADER_SIZE + body_len
        if end > len(rest):
            continue
        if scan_frames(rest, q, end).error is None:
            return q
    return None
