"""The one retry policy of calls to a group leader: a deadline, a fresh lookup after a failure, a backoff.

Every call loop (the client's blocking and event-loop calls, its append
streams, Spark's planning calls) drives a :class:`Retry` and differs only in
how it waits, so what is retried and for how long is decided here once.
"""

from __future__ import annotations

import logging
import time

import grpc

from conductor.wire.errors import Unavailable, error_from_rpc
from replog.errors import NotLeader

log = logging.getLogger("millrace.client")


def retryable(err: BaseException) -> bool:
    """Worth another try on a fresh leader: the leader moved, or no node answered."""
    return isinstance(err, NotLeader | Unavailable)


class Retry:
    """One call's retry budget: its deadline, whether to look the leader up again, and the backoff.

    StalledGroup and every other typed error are not retried: the leader
    already waited its append timeout, or the input is wrong.
    """

    __slots__ = ("deadline", "delay", "max_delay", "refresh", "what")

    def __init__(self, timeout_s: float, what: str, *, first_delay: float = 0.02, max_delay: float = 0.5) -> None:
        self.what = what
        self.deadline = time.monotonic() + timeout_s
        #: True once a try failed: the cached leader is not trusted any more
        self.refresh = False
        self.delay = first_delay
        self.max_delay = max_delay

    def remaining(self) -> float:
        """Seconds left, at least 0.1 so that a last call still gets a usable timeout."""
        return max(0.1, self.deadline - time.monotonic())

    def backoff(self, exc: Exception, moved: bool = False) -> float:
        """After a failed try: raise what is not worth another, else the seconds to wait before it.

        ``moved``: the caller's watch reported a new leader state for the group while the try ran, so the cached
        leader already is the new one; the next try goes there at once and without a ZooKeeper read. A planned
        hand-off (a reassignment's or the balancer's) then costs the writer one round trip to the new leader
        instead of the first backoff and a lookup (about 20 ms more). The budget is not spent: a new leader
        that is not ready yet answers NotLeader with no newer move seen, and the usual backoff follows.
        """
        err = error_from_rpc(exc) if isinstance(exc, grpc.RpcError) else exc
        if not retryable(err) or time.monotonic() + (0.0 if moved else self.delay) > self.deadline:
            raise err
        if moved:
            log.debug("%s: %s; the leader moved meanwhile, retrying at the new one", self.what, err)
            return 0.0
        log.debug("%s: %s; looking the leader up again and retrying", self.what, err)
        self.refresh = True
        delay, self.delay = self.delay, min(self.max_delay, self.delay * 2)
        return delay
