"""The newest frames of a log, kept in memory: a leader reads its tail for followers right after writing it."""

from __future__ import annotations

import bisect


class TailCache:
    """Frames just written, contiguous and ending at the log end, up to about ``limit`` bytes.

    Followers that keep up ask for what was appended a moment ago; serving it
    from memory spares a ``pread`` per frame. Anything not contiguous with the
    cache, or cut by a truncation, is dropped rather than patched.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bases: list[int] = []
        self.frames: list[tuple[int, int, bytes | memoryview]] = []
        self.nbytes = 0

    def remember(self, base: int, next_offset: int, frame: bytes | memoryview) -> None:
        """Keep a frame just written for reads of the tail; the oldest go beyond self.limit."""
        if self.frames and self.frames[-1][1] != base:
            self.forget()  # not contiguous with what is cached (never expected): start over
        self.bases.append(base)
        self.frames.append((base, next_offset, frame))
        self.nbytes += len(frame)
        if self.nbytes > 2 * self.limit:
            drop = 0
            while self.nbytes > self.limit:
                self.nbytes -= len(self.frames[drop][2])
                drop += 1
            del self.frames[:drop]
            del self.bases[:drop]

    def forget(self, from_offset: int | None = None) -> None:
        """Drop cached frames holding any entry at or past `from_offset` (all of them by default)."""
        if from_offset is None:
            self.frames.clear()
            self.bases.clear()
            self.nbytes = 0
            return
        while self.frames and self.frames[-1][1] > from_offset:
            self.nbytes -= len(self.frames.pop()[2])
            self.bases.pop()
        if self.frames and self.frames[-1][1] != from_offset:  # a cut inside a batch: its kept prefix is not here
            self.forget()

    def read(self, start: int, end: int, max_bytes: int, log_end: int) -> bytes | None:
        """`read` from the cache: whole frames from the one holding `start`; None if it is not cached."""
        bases = self.bases
        # Only a cache that reaches the log end (what a read of the tail wants) is used.
        if not bases or start < bases[0] or self.frames[-1][1] != log_end:
            return None
        i = bisect.bisect_right(bases, start) - 1
        tail = self.frames
        out = [tail[i][2]]
        size = len(out[0])
        i += 1
        while i < len(tail) and tail[i][0] < end:
            n = len(tail[i][2])
            if size + n > max_bytes:
                break
            out.append(tail[i][2])
            size += n
            i += 1
        return bytes(out[0]) if len(out) == 1 else b"".join(out)
