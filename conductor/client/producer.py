"""This client as an idempotent producer: one random producer id, its requests numbered per task group.

Every append request carries ``(producer, sequence)``; the client's retries
resend the same request, so a leader that already appended it (or a new leader
that holds the entry) answers with the original offsets instead of appending
again (:mod:`pstate.producers` keeps the window on the workers).
"""

from __future__ import annotations

import itertools
import secrets
import threading

from conductor.wire import millrace_pb2 as pb


class Producer:
    """Stamps append requests with this client's producer id and the next sequence number of their group."""

    def __init__(self) -> None:
        #: random, so two clients never share one (0 means "not idempotent" on the wire)
        self.id = secrets.randbits(64) | 1
        self._counters: dict[tuple[str, int], itertools.count[int]] = {}
        self._lock = threading.Lock()

    def stamp(self, request: pb.AppendRequest) -> pb.AppendRequest:
        """Give `request` its identity once, before its first try (retries keep it)."""
        key = (request.module, request.group)
        counter = self._counters.get(key)
        if counter is None:
            with self._lock:
                counter = self._counters.setdefault(key, itertools.count(1))
        request.producer = self.id
        request.sequence = next(counter)  # atomic under the GIL: concurrent callers get distinct numbers
        return request
