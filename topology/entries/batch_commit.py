"""A microbatch's share for one task group as one entry: where the microbatch ops are interpreted.

The Spark side routes each change to the group owning its task
(:mod:`topology.spark.microbatch`); the group's leader turns them into one
change set tagged ``(topology, batch_id)``, and a batch at or below the last
committed one is skipped (``TaskGroupStore.batch_committed``), so a replayed
batch changes nothing twice. ``add`` is resolved against the state the leader
sees, never in Spark, for the same reason.
"""

from __future__ import annotations

from typing import Any

from pstate import P
from pstate.store import ChangeSetBuilder, TaskGroupStore
from topology.dataflow.entries import Sends, append_through_topologies, decode_record
from topology.entries.requests import OP_ADD, OP_APPEND, OP_REMOVE, OP_SET, BatchCommit
from topology.stream import StreamRunner


def build_batch_commit(store: TaskGroupStore, runner: StreamRunner | None,
                       request: BatchCommit) -> ChangeSetBuilder | None:
    """The batch's changes as one change set tagged (topology, batch_id); None if this group committed it already.

    A record appended to a depot that stream topologies subscribe to goes
    through them, as a hop to this group (see ``append_through_topologies``).
    An unknown op is a :class:`ValueError`: that request fails alone.
    """
    if store.batch_committed(request.topology, request.batch_id):
        return None
    b = store.changes(request.topology, request.batch_id)
    sends = Sends()
    for c in request.changes:
        key = decode_record(c.target, c.task, c.key) if c.key else None
        value = decode_record(c.target, c.task, c.value) if c.value else None
        if c.op == OP_SET:
            b.transform(c.target, P.key(key).set(value))
        elif c.op == OP_ADD:
            b.update(c.target, key, _adder(value))
        elif c.op == OP_REMOVE:
            b.transform(c.target, P.key(key).remove())
        elif c.op == OP_APPEND:
            if runner is not None and c.target in runner.by_depot:
                append_through_topologies(runner, sends, c.target, c.task, value)
            else:
                b.depot_append(c.target, c.task, [value])
        else:
            raise ValueError(f"unknown microbatch change op {c.op!r}; use set, add, remove or append")
    sends.write(b)
    return b


def _adder(delta: Any) -> Any:
    def add(old: Any) -> Any:
        return (old or 0) + delta
    return add
