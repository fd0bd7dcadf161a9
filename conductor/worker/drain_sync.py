"""A drain's fsync, on the task thread or ahead of time on a helper thread (a shared task thread's pass).

A replica fsyncs once per drain, before it acknowledges anything the drain wrote
(:class:`~conductor.worker.durability.LogDurability`). A task thread shared by
several replicas overlaps those fsyncs (:meth:`TaskThread._pass`): it has one
replica's done on a helper thread, :meth:`DrainSync.ahead`, while it goes on with
the next replica's drain, and that replica's drain ends with :meth:`DrainSync.take`,
which finds the fsync done. Nothing else touches the replica in between (its task
thread waits for the helper before it goes on with it), so the fsync is the same
one at the same point of the drain, only on another thread.
"""

from __future__ import annotations

from conductor.worker.durability import LogDurability
from conductor.worker.task_clock import now_ms
from replog.config import ReplicationConfig
from replog.log import Log


class DrainSync:
    """One replica's drain fsyncs (see the module docstring)."""

    def __init__(self, durability: LogDurability, log: Log) -> None:
        self._durability = durability
        self._log = log
        #: what `ahead` did, for `take`: (the log end it covered, seconds spent, its error)
        self._ahead: tuple[int, tuple[float, float], Exception | None] | None = None

    def ahead(self, config: ReplicationConfig) -> None:
        """Any thread, while nothing else touches the replica: the drain's fsync, kept for :meth:`take` (so is
        its error: the replica's fault, raised on its task thread)."""
        assert self._ahead is None, "one fsync ahead per drain"
        end = self._log.end_offset
        try:
            self._ahead = (end, self._durability.written(config, now_ms()), None)
        except Exception as e:
            self._ahead = (end, (0.0, 0.0), e)

    def take(self, config: ReplicationConfig) -> tuple[float, float]:
        """Task thread: the drain's fsync (seconds in the replog's, then the marks'), done ahead or now."""
        done, self._ahead = self._ahead, None
        if done is not None and done[0] == self._log.end_offset:
            if done[2] is not None:
                raise done[2]
            return done[1]
        return self._durability.written(config, now_ms())
