"""The durable replog: a directory of segment files holding batch frames.

Layout: ``<dir>/<base offset, 20 digits>.log`` per segment, each a plain
concatenation of frames (:mod:`replog.batch`) whose offsets continue exactly
where the previous segment's end, plus a ``LOCK`` file held with ``flock`` so two
``Log`` objects (or two workers) can never write the same replog.

Why the sparse index lives only in memory
    Kafka keeps an ``.index`` file next to each segment.  Here the index (offset ->
    byte position, one entry at most every ``index_interval_bytes``) is *derived*
    data rebuilt from the frames: a persistent index can be ahead of or behind its
    segment after a crash, and every such case needs recovery code and tests of its
    own.  Rebuilding costs one sequential read of a segment, paid only when it is
    needed: the tail segment is scanned on open anyway (torn-tail recovery), and a
    sealed segment is indexed the first time something reads it (usually a follower
    catching up; far-behind followers use far-horizon catchup instead).  Start-up
    time therefore depends on one segment, not on the size of the log.

What is verified when
    * On open, the tail segment is read whole and every frame checked (length,
      CRC32C, offsets contiguous, epochs non-decreasing).  A torn or corrupt tail is
      cut at the last valid frame and the cut logged on ``millrace.replog`` with file
      and byte position.  A bad frame *followed by a valid frame* is not a torn
      write (acknowledged data would be lost), so it raises :class:`CorruptLog`.
    * A sealed segment is checked the same way when first indexed; any bad frame, or
      an end that does not meet the next segment's base offset, raises
      :class:`CorruptLog` (a sealed segment has no torn tail to forgive).
      ``Log.open(..., verify=True)`` or :meth:`Log.verify` does this for every
      segment up front.
    * Every :meth:`Log.read` re-checks the CRC of the frames it returns, so rot is
      caught before it is shipped to a follower.

Durability (``fsync``)
    ``"batch"`` (default): ``fdatasync`` after every append, before it returns, so
    an appended entry counts as held only once it is on disk.  ``"interval"``: at
    most every ``fsync_interval_ms`` (checked on append; the driver may also call
    :meth:`Log.flush` from its tick).  ``"none"``: the OS decides; only
    :meth:`Log.flush` and :meth:`Log.close` sync.  :attr:`Log.flushed_offset` tells
    what is durable under every policy.

Not thread-safe: one driver thread owns a ``Log`` (the replication state machines
are single-threaded by design).
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import itertools
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal

from replog.batch import (
    HEADER_SIZE,
    Batch,
    FrameHeader,
    TypesArg,
    encode_parts,
    scan_frames,
    truncate_frame,
)
from replog.config import DEFAULT_SEGMENT_BYTES
from replog.durable_file import fsync_dir
from replog.errors import CorruptLog, InvalidFrame, OffsetOutOfRange, UnexpectedOffset
from replog.segment import (
    SWAP_SUFFIX,
    Segment,
    SegmentInfo,
    ensure_indexed,
    find_frame,
    pread_exact,
    recover,
    scan_into,
    segment_name,
    sync_data,
    write_all,
)
from replog.tail_cache import TailCache

__all__ = ["Entry", "FsyncPolicy", "Log", "SegmentInfo"]

_log = logging.getLogger("millrace.replog")

FsyncPolicy = Literal["batch", "none", "interval"]
_POLICIES = ("batch", "none", "interval")

MiB = 1024 * 1024
#: bytes of the newest frames a log keeps in memory for reads of its tail (see ``Log.read``)
TAIL_CACHE_BYTES = 4 * MiB
_LOCK_NAME = "LOCK"
_COPY_CHUNK = 4 * MiB


Entry = tuple[int, int, int, bytes]
"""``(offset, epoch, type, payload)`` as returned by :meth:`Log.read_entries`."""


class Log:
    """An append-only, segmented, checksummed log of batch frames; see the module docstring.

    Offsets are dense: the entries of the log are exactly ``[start_offset,
    end_offset)``.  Build one with :meth:`Log.open`.
    """

    def __init__(
        self,
        directory: Path,
        segments: list[Segment],
        lock_fd: int,
        *,
        segment_bytes: int,
        fsync: FsyncPolicy,
        fsync_interval_ms: int,
        index_interval_bytes: int,
    ) -> None:
        """Use :meth:`Log.open`; this only wires already-recovered state together."""
        self._dir = directory
        self._segments = segments
        self._bases = [s.base for s in segments]
        self._lock_fd = lock_fd
        self._segment_bytes = segment_bytes
        self._fsync: FsyncPolicy = fsync
        self._fsync_interval = fsync_interval_ms / 1000.0
        self._index_interval = index_interval_bytes
        self._fd = self._open_active()
        self._unsynced_sealed: list[Path] = []
        #: a segment was created or deleted since the directory was last fsynced (True after open:
        #: recovery may have created the first segment without syncing under fsync="none")
        self._dir_dirty = True
        self._flushed = self.end_offset
        self._last_sync = time.monotonic()
        self._closed = False
        #: the most recently written frames, newest last: (base offset, next offset, frame bytes); reads of
        #: the tail (replication and apply, right after the append) are served from here, not the disk
        self._tail = TailCache(TAIL_CACHE_BYTES)
        self._check_invariants()

    # ------------------------------------------------------------------ open

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync: FsyncPolicy = "batch",
        index_interval_bytes: int = 4096,
        fsync_interval_ms: int = 100,
        verify: bool = False,
    ) -> Log:
        """Open (creating if needed) the log in ``directory`` and recover its tail.

        A new log starts at offset 0; use :meth:`reset` to start elsewhere (a
        follower that installed a checkpoint).  ``verify=True`` also checks every
        sealed segment now instead of when it is first read.  Raises
        :class:`CorruptLog` for damage that is not a torn tail, and
        ``BlockingIOError`` if another ``Log`` holds the directory.
        """
        if fsync not in _POLICIES:
            raise ValueError(f"fsync must be one of {_POLICIES}, not {fsync!r}")
        if segment_bytes < HEADER_SIZE + 5:
            raise ValueError(f"segment_bytes={segment_bytes} cannot hold even one frame")
        if index_interval_bytes < 1:
            raise ValueError("index_interval_bytes must be positive")
        if fsync_interval_ms < 0:
            raise ValueError("fsync_interval_ms must not be negative")
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(path / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise BlockingIOError(
                errno.EWOULDBLOCK,
                f"replog directory {path} is already open by another Log; close that one first",
            ) from None
        try:
            segments = recover(path, index_interval_bytes, fsync != "none")
            log = cls(
                path,
                segments,
                lock_fd,
                segment_bytes=segment_bytes,
                fsync=fsync,
                fsync_interval_ms=fsync_interval_ms,
                index_interval_bytes=index_interval_bytes,
            )
        except BaseException:
            os.close(lock_fd)  # closing releases the flock
            raise
        if verify:
            try:
                log.verify()
            except BaseException:
                log.close()
                raise
        return log

    def _open_active(self) -> int:
        fd = os.open(self._segments[-1].path, os.O_RDWR | os.O_CREAT, 0o644)
        os.lseek(fd, self._segments[-1].size, os.SEEK_SET)
        return fd

    # ------------------------------------------------------------ properties

    @property
    def directory(self) -> Path:
        """The directory holding the segments."""
        return self._dir

    @property
    def start_offset(self) -> int:
        """Lowest offset held (``== end_offset`` when the log is empty)."""
        return self._segments[0].base

    @property
    def end_offset(self) -> int:
        """The offset the next appended entry gets (Kafka's log end offset)."""
        return self._segments[-1].end_offset

    @property
    def flushed_offset(self) -> int:
        """Every offset below this one is on disk (``== end_offset`` after each append under ``"batch"``)."""
        return self._flushed

    @property
    def last_epoch(self) -> int | None:
        """Leader epoch of the last entry, or ``None`` for an empty log.

        May index the previous segment when the active one is empty (right after a
        roll or a truncation to a segment boundary).
        """
        for seg in reversed(self._segments):
            ensure_indexed(seg, self._index_interval)
            if seg.last_epoch is not None:
                return seg.last_epoch
        return None

    def size_bytes(self) -> int:
        """Bytes held by all segments."""
        return sum(s.size for s in self._segments)

    def segments(self) -> list[SegmentInfo]:
        """The segments, oldest first (sizes of unread sealed segments come from the file system)."""
        return [s.info() for s in self._segments]

    # --------------------------------------------------------------- writing

    def append(self, epoch: int, types: TypesArg, payloads: Sequence[bytes]) -> int:
        """Leader path: append one batch of entries at ``end_offset``; return its base offset.

        ``types`` is one entry type for all, or one per payload.  Under
        ``fsync="batch"`` the entries are on disk when this returns.  ``epoch`` must
        not be lower than :attr:`last_epoch` (epochs never decrease along a log:
        KIP-101 truncation relies on it); ``ValueError`` otherwise.
        """
        self._check_open()
        last = self.last_epoch
        if last is not None and epoch < last:
            raise ValueError(f"cannot append with leader epoch {epoch}: the log already holds epoch {last}")
        base = self.end_offset
        parts = encode_parts(base, epoch, types, payloads)
        size = sum(map(len, parts))
        self._roll_if_full(size)
        seg = self._segments[-1]
        start = seg.size
        self._write(parts, start)
        seg.add(base, epoch, len(payloads), start, start + size, self._index_interval)
        self._tail.remember(base, base + len(payloads), b"".join(parts))
        self._after_write()
        return base

    def append_frames(self, raw: bytes) -> int:
        """Follower path: append the leader's frames unchanged; return the new ``end_offset``.

        ``raw`` is whole concatenated frames, validated with
        :func:`~replog.batch.scan_frames` (CRC, layout, contiguity, epochs) before a
        byte is written; bad data raises :class:`InvalidFrame`.  The first frame must
        start exactly at ``end_offset``, else :class:`UnexpectedOffset` (truncate
        first, or trim a frame that straddles the end with
        :func:`~replog.batch.trim_frames`).  Frames are written in runs that fill
        segments; should the disk fail half-way (``OSError``), a whole-frame prefix
        may already be in the log: :attr:`end_offset` says how far it got.
        """
        self._check_open()
        if not raw:
            return self.end_offset
        result = scan_frames(raw)
        if result.error is not None:
            raise InvalidFrame(result.end, result.error)
        frames = result.frames
        if frames[0].base_offset != self.end_offset:
            raise UnexpectedOffset(self.end_offset, frames[0].base_offset)
        last = self.last_epoch
        if last is not None and frames[0].epoch < last:
            raise InvalidFrame(0, f"leader epoch {frames[0].epoch} is lower than the log's last epoch {last}")
        view = memoryview(raw)
        run: list[FrameHeader] = []  # frames to write together into the active segment
        run_bytes = 0
        for f in frames:
            used = self._segments[-1].size + run_bytes
            if used > 0 and used + f.size > self._segment_bytes:
                self._write_run(view, run)
                run, run_bytes = [], 0
                self._roll_if_full(f.size)
            run.append(f)
            run_bytes += f.size
        self._write_run(view, run)
        self._after_write()
        return self.end_offset

    def _write_run(self, view: memoryview, run: list[FrameHeader]) -> None:
        """Write consecutive frames of a received buffer, unchanged, at the end of the active segment."""
        if not run:
            return
        seg = self._segments[-1]
        pos = seg.size
        self._write([view[run[0].start : run[-1].end]], pos)  # no copy: writev takes any buffer
        delta = pos - run[0].start
        for f in run:
            seg.add(
                f.base_offset, f.epoch, f.entry_count, f.start + delta, f.end + delta, self._index_interval
            )
            self._tail.remember(f.base_offset, f.next_offset, view[f.start : f.end])

    # --------------------------------------------------------------- tail cache

    def _write(self, parts: Sequence[bytes | memoryview], pos: int) -> None:
        """Write at the end of the active segment; on failure, cut back so no partial frame stays behind."""
        try:
            write_all(self._fd, list(parts))
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, pos)
                os.lseek(self._fd, pos, os.SEEK_SET)
            raise

    def _after_write(self) -> None:
        due = self._fsync == "interval" and time.monotonic() - self._last_sync >= self._fsync_interval
        if self._fsync == "batch" or due:
            self._sync_active()

    def _sync_active(self) -> None:
        sync_data(self._fd)
        self._flushed = self.end_offset
        self._last_sync = time.monotonic()

    def _roll_if_full(self, incoming: int) -> None:
        """Start a new segment at ``end_offset`` if ``incoming`` bytes would overflow a non-empty active one."""
        seg = self._segments[-1]
        if seg.size == 0 or seg.size + incoming <= self._segment_bytes:
            return
        if self._fsync == "none":
            self._unsynced_sealed.append(seg.path)
        else:
            sync_data(self._fd)
        os.close(self._fd)
        new = Segment(
            self._dir / segment_name(seg.end_offset), seg.end_offset, 0, seg.end_offset, indexed=True
        )
        self._segments.append(new)
        self._bases.append(new.base)
        self._fd = self._open_active()
        if self._fsync != "none":
            self._sync_dir()
        else:
            self._dir_dirty = True

    def _sync_dir(self) -> None:
        fsync_dir(self._dir)
        self._dir_dirty = False

    def flush(self) -> None:
        """Make everything appended so far durable (segment data and the directory entries).

        The directory is fsynced only if a segment was created or deleted since its
        last fsync: a name lives in the directory, the bytes of an existing file do
        not, so appends to a segment whose name is already durable need only the
        segment's own ``fdatasync`` (as ext4, XFS and btrfs guarantee; it is what
        Kafka and etcd rely on too). Every operation that changes the directory
        either fsyncs it itself (roll under "batch"/"interval", truncate, reset,
        retention under "batch"/"interval") or sets ``_dir_dirty`` so the next
        flush does (roll and retention under "none"); a fresh ``Log`` starts
        dirty, as recovery may have created the first segment unsynced. So after
        ``flush`` returns, a crash still finds every segment that holds flushed
        entries, as before; only the redundant per-flush directory fsync is gone.
        """
        self._check_open()
        for path in self._unsynced_sealed:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._unsynced_sealed.clear()
        if self._dir_dirty:
            self._sync_dir()
        self._sync_active()

    # --------------------------------------------------------------- reading

    def read(self, start: int, max_bytes: int, *, end: int | None = None) -> bytes:
        """Raw whole frames from the frame containing ``start``, about ``max_bytes`` of them.

        Always at least one frame (even if larger than ``max_bytes``), never a partial
        one; may span segments.  ``start == end_offset`` returns ``b""``.  The frames'
        CRCs are checked (:class:`CorruptLog` on rot).  The first frame may begin
        below ``start`` (use :func:`~replog.batch.trim_frames` to drop the extra
        entries).  With ``end``, frames starting at or past ``end`` are left out (the
        last frame may still run past it).  Raises :class:`OffsetOutOfRange` outside
        ``[start_offset, end_offset]``.
        """
        self._check_open()
        log_end = self.end_offset
        if start == log_end:
            return b""
        if not self.start_offset <= start < log_end:
            raise OffsetOutOfRange(start, self.start_offset, log_end)
        end = log_end if end is None else min(end, log_end)
        if end <= start:
            return b""
        cached = self._tail.read(start, end, max_bytes, self.end_offset)
        if cached is not None:
            return cached
        out: list[bytes] = []
        budget = max_bytes
        offset = start
        i = bisect.bisect_right(self._bases, offset) - 1
        while offset < end:
            seg = self._segments[i]
            ensure_indexed(seg, self._index_interval)
            assert seg.base <= offset < seg.end_offset, (seg.path, offset)
            with self._reader(seg) as fd:
                pos, first = find_frame(seg, fd, offset)
                want = max(first.end - pos, min(budget, seg.size - pos))
                buf = pread_exact(fd, want, pos)
            result = scan_frames(buf, expect_offset=first.base_offset)
            if result.error is not None and not (result.torn and result.frames and pos + len(buf) < seg.size):
                raise CorruptLog(str(seg.path), pos + result.end, result.error)
            frames = result.frames
            keep = bisect.bisect_left([f.base_offset for f in frames], end)
            stop = frames[keep - 1].end
            out.append(buf if stop == len(buf) else buf[:stop])
            budget -= stop
            offset = frames[keep - 1].next_offset
            if budget <= 0 or stop < len(buf):
                break
            i += 1
        return out[0] if len(out) == 1 else b"".join(out)

    def batches(self, start: int, end: int | None = None, *, chunk_bytes: int = 4 * MiB) -> Iterator[Batch]:
        """Yield validated :class:`~replog.batch.Batch` views covering ``[start, end)`` (whole batches)."""
        stop = self.end_offset if end is None else end
        if not (self.start_offset <= start <= stop <= self.end_offset):
            raise OffsetOutOfRange(
                start if start < self.start_offset else stop, self.start_offset, self.end_offset
            )
        offset = start
        while offset < stop:
            raw = self.read(offset, chunk_bytes)
            for f in scan_frames(raw).frames:  # read() validated them already
                if f.base_offset >= stop:
                    return
                yield Batch(raw, f.start)
                offset = f.next_offset

    def read_entries(self, start: int, end: int) -> list[Entry]:
        """``(offset, epoch, type, payload)`` for every entry in ``[start, end)``: the apply path.

        Raises :class:`OffsetOutOfRange` unless ``start_offset <= start <= end <= end_offset``.
        """
        out: list[Entry] = []
        for batch in self.batches(start, end):
            entries = batch.offset_entries()
            lo = max(0, start - batch.base_offset)
            hi = min(batch.count, end - batch.base_offset)
            out.extend(entries if lo == 0 and hi == batch.count else entries[lo:hi])
        assert len(out) == end - start, (len(out), start, end)
        return out

    @contextlib.contextmanager
    def _reader(self, seg: Segment) -> Iterator[int]:
        """A file descriptor to read ``seg``: the active one, or a short-lived one for a sealed segment."""
        if seg is self._segments[-1]:
            yield self._fd
            return
        fd = os.open(seg.path, os.O_RDONLY)
        try:
            yield fd
        finally:
            os.close(fd)

    def verify(self) -> None:
        """Check every segment now (CRC, layout, contiguity); raise :class:`CorruptLog` at the first problem."""
        self._check_open()
        for seg in self._segments:
            ensure_indexed(seg, self._index_interval)

    # ------------------------------------------------------ truncation/retention

    def truncate(self, offset: int) -> None:
        """Drop every entry ``>= offset``; afterwards ``end_offset == offset`` (no-op if ``offset >= end_offset``).

        A cut inside a batch (KIP-101 divergence points can land there) re-encodes
        the kept prefix of that batch.  Crash safety: segments above the cut go
        first (newest first), then the cut segment is shortened with ``ftruncate``,
        or, for a mid-batch cut, replaced atomically by a rewritten copy (temp file,
        fsync, rename, directory fsync).  A crash leaves either the old or the new
        state of every file, always a contiguous log; the caller redoes the
        truncation after restart (it is idempotent).  ``offset <= start_offset``
        empties the log like :meth:`reset`.
        """
        self._check_open()
        if offset >= self.end_offset:
            return
        if offset <= self.start_offset:
            self.reset(offset)
            return
        self._tail.forget(offset)
        i = bisect.bisect_right(self._bases, offset) - 1
        if self._segments[i].base == offset:
            i -= 1  # the cut falls on a segment boundary: segment i-1 ends exactly there
        self._drop_segments_after(i)
        seg = self._segments[i]
        ensure_indexed(seg, self._index_interval)
        if seg.end_offset > offset:
            pos, frame = find_frame(seg, self._fd, offset)
            if frame.base_offset == offset:
                os.ftruncate(self._fd, pos)
                sync_data(self._fd)
            else:
                raw = pread_exact(self._fd, frame.size, pos)
                self._replace_tail(seg, pos, truncate_frame(raw, offset - frame.base_offset))
            self._reindex_active()
        self._flushed = min(self._flushed, offset)
        assert self.end_offset == offset, (self.end_offset, offset)
        self._check_invariants()

    def _drop_segments_after(self, i: int) -> None:
        """Delete segments ``i+1..`` (newest first) and make segment ``i`` the active one."""
        if i == len(self._segments) - 1:
            return
        os.close(self._fd)
        while len(self._segments) > i + 1:
            seg = self._segments.pop()
            self._bases.pop()
            seg.path.unlink()
        self._sync_dir()
        self._unsynced_sealed = [p for p in self._unsynced_sealed if p.exists()]
        seg = self._segments[i]
        ensure_indexed(seg, self._index_interval)
        self._fd = self._open_active()

    def _replace_tail(self, seg: Segment, pos: int, new_tail: bytes) -> None:
        """Atomically replace ``seg``'s bytes from ``pos`` on with ``new_tail`` (copy, fsync, rename)."""
        swap = seg.path.with_name(seg.path.name + SWAP_SUFFIX)
        out = os.open(swap, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            copied = 0
            while copied < pos:
                chunk = pread_exact(self._fd, min(_COPY_CHUNK, pos - copied), copied)
                if not chunk:
                    raise CorruptLog(str(seg.path), copied, "segment shorter than its index says")
                write_all(out, [chunk])
                copied += len(chunk)
            write_all(out, [new_tail])
            os.fsync(out)
        finally:
            os.close(out)
        os.replace(swap, seg.path)
        self._sync_dir()
        os.close(self._fd)
        self._fd = os.open(seg.path, os.O_RDWR)

    def _reindex_active(self) -> None:
        """Rebuild the active segment's index after a cut by re-reading it whole.

        Truncation is rare (leader changes), so one sequential re-read of one segment
        is cheaper than code that patches the index and the running epoch in place.
        """
        seg = self._segments[-1]
        seg.clear_index()
        size = os.fstat(self._fd).st_size
        result = scan_into(seg, self._fd, size, self._index_interval)
        if result.error is not None:
            raise CorruptLog(str(seg.path), result.end, result.error)
        seg.indexed = True
        os.lseek(self._fd, seg.size, os.SEEK_SET)

    def reset(self, offset: int) -> None:
        """Drop every segment and start an empty log at ``offset``.

        For a follower that installed a far-horizon checkpoint up to ``offset - 1``,
        or whose truncation point falls below what it still holds.
        """
        self._check_open()
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        self._tail.forget()
        os.close(self._fd)
        for seg in reversed(self._segments):
            seg.path.unlink()
        self._unsynced_sealed.clear()
        fresh = Segment(self._dir / segment_name(offset), offset, 0, offset, indexed=True)
        self._segments = [fresh]
        self._bases = [offset]
        self._fd = self._open_active()
        self._sync_dir()
        self._flushed = offset
        self._check_invariants()

    def delete_segments_below(self, offset: int) -> int:
        """Delete whole segments whose entries are all below ``offset``; return the bytes freed.

        Retention (docs/replication.md): the caller passes the lowest offset still
        needed (min applied offset over the ISR, bounded by the near-horizon
        window).  The active segment is never deleted, so ``start_offset`` may stay
        below ``offset``.
        """
        self._check_open()
        freed = 0
        while len(self._segments) > 1 and self._segments[1].base <= offset:
            seg = self._segments.pop(0)
            self._bases.pop(0)
            freed += seg.size if seg.indexed else seg.path.stat().st_size
            seg.path.unlink()
            if seg.path in self._unsynced_sealed:
                self._unsynced_sealed.remove(seg.path)
        if freed:
            if self._fsync != "none":
                self._sync_dir()
            else:
                self._dir_dirty = True
        self._check_invariants()
        return freed

    # -------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Flush (whatever the policy: a clean shutdown loses nothing) and release the directory."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._tail.forget()
            os.close(self._fd)
            os.close(self._lock_fd)

    def __enter__(self) -> Log:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Log({str(self._dir)!r}, [{self.start_offset}, {self.end_offset}), {len(self._segments)} segment(s))"

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"replog {self._dir} is closed")

    def _check_invariants(self) -> None:
        """TigerBeetle-style: state that must always hold, checked after every structural change."""
        segs = self._segments
        assert segs, "a log always has an active segment"
        assert self._bases == [s.base for s in segs]
        for a, b in itertools.pairwise(segs):
            assert a.base < b.base, f"segments out of order: {a.path} {b.path}"
            assert a.end_offset == b.base, f"{a.path} ends at {a.end_offset} but {b.path} starts at {b.base}"
        active = segs[-1]
        assert active.indexed, "the active segment is always indexed"
        assert active.base <= active.end_offset
        assert (active.size == 0) == (active.end_offset == active.base)
        assert self._flushed <= self.end_offset

