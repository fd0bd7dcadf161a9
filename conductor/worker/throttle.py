"""Pacing copies to a byte rate (:class:`CopyThrottle`): a reassignment's far-horizon copies leave room for writers.

The rate is the module's ``reassignment.copy.bytes.per.second`` and it is a
budget of the **worker**, not of each copy: every copy a reassignment runs on a
worker for one module draws from the same :class:`CopyBudget`, the one its
:class:`~conductor.worker.runtime.ModuleRuntime` owns (handed to each copy in a
:class:`CopyPacing`), so adding the replicas of two groups at once (the plan's
concurrency) copies no faster than adding one; it goes with the module when the
module closes here. Kafka's reassignment throttle is
a per-broker rate for the same reason: what a writer competes with is the
worker's total copy work (CPU for gRPC and checksums, disk writes), not one
stream's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import NamedTuple

#: credit a budget idle for a while may spend at once, in seconds of its rate: bursts stay one chunk or so
BURST_S = 0.05


class CopyBudget:
    """A byte rate shared by the copies that pace through it (thread-safe; a virtual clock, no thread).

    Each copied chunk reserves ``nbytes / rate`` seconds after the previous
    reservation ends; the caller waits until its reservation starts to be
    due. A budget left idle keeps at most :data:`BURST_S` of credit (a new one, none). The rate
    is passed at every reservation, so a change applies at once.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._free_at: float | None = None  #: when the reservations so far are all due (None: none yet)

    def reserve(self, nbytes: int, rate: int) -> float:
        """Seconds to wait before copying more, ``nbytes`` having just been copied at ``rate`` B/s (> 0)."""
        assert rate > 0 and nbytes >= 0, (rate, nbytes)
        with self._lock:
            now = self._clock()
            start = now if self._free_at is None else max(self._free_at, now - BURST_S)
            self._free_at = start + nbytes / rate
            return max(0.0, self._free_at - now)


class CopyPacing(NamedTuple):
    """What paces one replica's copy: the rate now (``limit()``, B/s, read at every chunk; 0: unpaced) and the
    budget of the worker's copies of the module it draws from (its runtime's)."""

    limit: Callable[[], int]
    budget: CopyBudget


class CopyThrottle:
    """Paces one copy's chunks to at most ``limit()`` bytes per second, drawn from ``budget``.

    ``limit`` is read at every chunk, so an option changed while a copy runs
    applies at once (0 or less: unpaced, and the budget is not drawn from).
    ``budget`` defaults to one of its own; copies that share one share the
    rate. ``wait(seconds)`` sleeps (a stop event's ``wait`` makes the copy stoppable).
    """

    def __init__(self, limit: Callable[[], int], wait: Callable[[float], object] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, budget: CopyBudget | None = None) -> None:
        self._limit = limit
        self._wait = wait
        self._budget = budget if budget is not None else CopyBudget(clock)
        #: seconds spent waiting in total (progress reports it)
        self.waited_s = 0.0

    def limit(self) -> int:
        """The rate now (B/s; 0: unpaced)."""
        return max(0, self._limit())

    def pace(self, nbytes: int) -> None:
        """``nbytes`` were just copied: wait as long as the limit asks."""
        rate = self.limit()
        if rate <= 0:
            return
        ahead = self._budget.reserve(nbytes, rate)
        if ahead > 0:
            self.waited_s += ahead
            self._wait(ahead)
