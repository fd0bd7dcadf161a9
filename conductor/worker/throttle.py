"""Pacing a copy to a byte rate (:class:`CopyThrottle`): a reassignment's far-horizon copies leave room for writers."""

from __future__ import annotations

import time
from collections.abc import Callable


class CopyThrottle:
    """Paces a stream of chunks to at most ``limit()`` bytes per second.

    ``limit`` is read at every chunk, so an option changed while a copy runs
    applies at once (0 or less: unpaced). The pace is measured from the first
    chunk at the current limit: a burst never exceeds one chunk beyond it.
    ``wait(seconds)`` sleeps (a stop event's ``wait`` makes the copy stoppable).
    """

    def __init__(self, limit: Callable[[], int], wait: Callable[[float], object] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._wait = wait
        self._clock = clock
        self._rate = 0
        self._start = 0.0
        self._bytes = 0
        #: seconds spent waiting in total (progress reports it)
        self.waited_s = 0.0

    def pace(self, nbytes: int) -> None:
        """``nbytes`` were just copied: wait as long as the limit asks."""
        rate, now = self._limit(), self._clock()
        if rate <= 0:
            self._rate = 0
            return
        if rate != self._rate:
            self._rate, self._start, self._bytes = rate, now, 0
        self._bytes += nbytes
        ahead = self._bytes / rate - (now - self._start)
        if ahead > 0:
            self.waited_s += ahead
            self._wait(ahead)
