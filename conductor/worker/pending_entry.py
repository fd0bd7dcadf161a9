"""What the client API, the code lifecycle and the dataflow post to a leader's task thread to append."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replog.messages import Ack


@dataclass
class PendingEntry:
    """A replog entry to build on the leader's task thread, and whom to tell when it reaches its ack level.

    `build()` returns (change-set builder, result); it runs on the task thread
    because what it writes depends on every entry appended before it (depot
    offsets, read-modify-write transforms, microbatch and progress markers). A
    None builder means there is nothing to append (e.g. a replayed microbatch):
    `done` gets the result at once.
    """

    build: Callable[[], tuple[Any, Any]]
    nbytes: int
    ack: Ack
    done: Callable[[int, Any, Exception | None], None]
    result: Any = None
