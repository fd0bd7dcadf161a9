"""A copied file written around the page cache (``O_DIRECT``) where the filesystem allows: :class:`UnbufferedFile`.

Why: a far-horizon copy (or a backup's, or a restore's) writes tens of
megabytes onto a disk that replogs share, and every replica's appends wait for
the replog's fdatasync. Written through the page cache, the copy's dirty pages
go out in writeback bursts and journal commits that those fdatasyncs queue
behind, however often the copy syncs: beside two copies paced to 16 MiB/s each,
a writer's p99 was 2.6-4.4 times its steady one whether the copies synced every
256 KiB, 1 MiB or 4 MiB; with ``O_DIRECT`` writes of 1 MiB, 1.8-1.9 times (one
box, same run, alternately; docs/performance.md, issue 27, session 18). The
bytes go to the device as they are written, so nothing piles up for a later
sync to push out.

``O_DIRECT`` needs aligned buffers, lengths and offsets: the file is written in
whole :data:`BUFFER_BYTES` from one page-aligned buffer, and its last partial
buffer through the page cache (``O_DIRECT`` cleared), before the final sync. A
filesystem that refuses ``O_DIRECT`` (tmpfs before Linux 6.6, some network filesystems) gets
the buffered path, synced every :data:`SYNC_EVERY_BYTES` so that it too
never holds many megabytes for one sync.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from pathlib import Path

#: the alignment ``O_DIRECT`` asks of buffers, lengths and offsets (the largest logical block size in use)
ALIGN = 4096
#: bytes per direct write: large enough that a copy's writes are few, small enough that a replog's fdatasync
#: queued behind one waits about a millisecond
BUFFER_BYTES = 1024 * 1024
#: without ``O_DIRECT``, the file is synced each time this many more bytes are written (RocksDB's
#: ``bytes_per_sync``, for the same reason): one fsync of a whole 24 MB file put 24 MB ahead of every replog
#: fdatasync on the disk
SYNC_EVERY_BYTES = 1024 * 1024

assert BUFFER_BYTES % ALIGN == 0 and mmap.PAGESIZE % ALIGN == 0  # (mmap's buffers start on a page)


class UnbufferedFile:
    """A new file (truncated if it exists), written in order; ``direct`` says whether it bypasses the page cache.

    ``write`` takes any chunk sizes; ``drain`` puts every byte written so far in the file (then only buffered
    writes follow); ``sync`` drains and fsyncs; ``close`` lets go of the descriptor and the buffer.
    """

    def __init__(self, path: Path, *, direct: bool = True) -> None:
        self.path = path
        self.direct = False
        #: bytes in the file (handed to the device or the kernel), not counting what the buffer holds
        self.written = 0
        self._synced = 0
        self._held = 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        fd = -1
        if direct and hasattr(os, "O_DIRECT"):
            try:
                fd = os.open(path, flags | os.O_DIRECT, 0o644)
                self.direct = True
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: this filesystem has no O_DIRECT
                    raise
        self._fd = fd if fd >= 0 else os.open(path, flags, 0o644)
        self._buf = mmap.mmap(-1, BUFFER_BYTES) if self.direct else None

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view and self._buf is not None:
            n = min(len(view), BUFFER_BYTES - self._held)
            self._buf[self._held:self._held + n] = view[:n]
            self._held += n
            view = view[n:]
            if self._held == BUFFER_BYTES:
                self._write_held()  # (which may turn O_DIRECT off: the rest goes buffered)
        if view:
            self._write_all(view)
            if self.written - self._synced >= SYNC_EVERY_BYTES:  # (the writer's own thread waits, nobody else)
                os.fdatasync(self._fd)
                self._synced = self.written

    def drain(self) -> None:
        """Every byte written so far into the file: the buffer's aligned part directly, its tail buffered."""
        if self._buf is None or self._held == 0:
            return
        self._write_held()
        if self._held:  # an unaligned tail: O_DIRECT off for the rest of this file
            self._buffered()

    def sync(self) -> None:
        self.drain()
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._buf is not None:
            self._buf.close()
            self._buf = None

    def _write_held(self) -> None:
        """Write the buffer's whole ALIGN blocks directly; what is left moves to its start."""
        assert self._buf is not None and self.written % ALIGN == 0, self.written
        aligned = self._held - self._held % ALIGN
        if aligned == 0:
            return
        refused = False
        try:
            self._write_all(memoryview(self._buf)[:aligned])
        except OSError as e:
            if e.errno != errno.EINVAL or self.written % ALIGN:
                raise
            refused = True  # (handled below: the traceback holds views of the buffer, which must go first)
        if refused:  # the filesystem took O_DIRECT at open but not at write: the page cache it is
            self._buffered()
            return
        rest = self._held - aligned
        if rest:
            self._buf[:rest] = self._buf[aligned:self._held]
        self._held = rest
        if not self.direct:  # a short write turned O_DIRECT off: the rest goes buffered too
            self._buffered()

    def _buffered(self) -> None:
        """From here on through the page cache: what the buffer holds goes first."""
        assert self._buf is not None
        self._direct_off()
        held, buf = self._held, self._buf
        self._buf, self._held = None, 0
        self._write_all(memoryview(buf)[:held])
        buf.close()

    def _direct_off(self) -> None:
        if self.direct:
            fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            self.direct = False

    def _write_all(self, view: memoryview) -> None:
        while view:
            n = os.write(self._fd, view)
            self.written += n
            view = view[n:]
            if view and self.written % ALIGN:
                self._direct_off()  # a short direct write left an unaligned end: the rest through the page cache
