"""What the client API, the code lifecycle and the dataflow post to a leader's task thread to append."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replog.messages import Ack
from topology.entries.requests import EntryRequest


@dataclass
class PendingEntry:
    """A replog entry to build on the leader's task thread, and whom to tell when it reaches its ack level.

    The task thread has ``request`` built by its replica's entry port
    (:class:`topology.entries.port.EntryPort`), which returns (change-set
    builder, result): on the task thread, because what an entry writes depends
    on every entry appended before it. A None builder means there is nothing to
    append (e.g. a replayed microbatch): ``done`` gets the result at once.
    """

    request: EntryRequest
    nbytes: int
    ack: Ack
    done: Callable[[int, Any, Exception | None], None]
    result: Any = None
    #: when the request reached the worker (perf_counter seconds; 0: not timed), for the append-to-ack histogram
    received: float = 0.0
