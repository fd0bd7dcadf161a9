"""A client's depot append as one entry, answered once per producer sequence (:func:`build_depot_append`).

The entry itself (records, the topologies' effects, the hops they send) is
:func:`topology.dataflow.entries.build_client_append`; this adds the
idempotence window of :mod:`pstate.producers`: a retried request gets an entry
with no writes and the original reply. That entry reaches its ack level only
after the original one did, since the log is applied in order, so the answer is
as durable as the first one would have been.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pstate import producers
from pstate.store import ChangeSetBuilder, TaskGroupStore
from topology.dataflow.entries import build_client_append
from topology.entries.requests import DepotAppend
from topology.stream import StreamRunner

log = logging.getLogger("millrace.node")

#: what a depot append answers: each partition's first depot offset, and the topologies' ack values
AppendReply = tuple[list[int], dict[str, list[Any]]]


def build_depot_append(store: TaskGroupStore, runner: StreamRunner | None, request: DepotAppend
                       ) -> tuple[ChangeSetBuilder, AppendReply, bool]:
    """The entry of ``request``, its reply, and True when it is a retry answered from the window (no writes).

    A sequence reused for a request of another shape is a :class:`ValueError` (that request fails alone).
    """
    producer, sequence, appends = request.producer, request.sequence, request.appends
    seen = producers.lookup(store.leader_reader(), producer, sequence) if producer else None
    if seen is not None and seen.previous is not None:
        prev = seen.previous
        if len(prev.firsts) != len(appends):
            raise ValueError(f"producer {producer:#x} reused sequence {sequence} for another request "
                             f"({len(appends)} partition(s), the first had {len(prev.firsts)})")
        log.info("answered a retried append (producer %#x, sequence %d) with its original offsets",
                 producer, sequence)
        return store.changes(), (prev.firsts, prev.acks), True
    builder, firsts, acks = build_client_append(store, runner, appends, request.timestamp_ms)
    if seen is not None and not producers.record(builder, seen, firsts, acks, int(time.time() * 1000)):
        log.warning("producer %#x sequence %d is past the idempotence window of %d: appended again "
                    "(at-least-once)", producer, sequence, producers.WINDOW)
    return builder, (firsts, acks), False
