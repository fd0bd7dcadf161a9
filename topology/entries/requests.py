"""What a task thread may ask the entry port to build: one frozen request type per kind of replog entry.

The requests are plain values, built by whoever asks for an entry (the gRPC
services from wire requests, the code lifecycle, the dataflow driver) and
carried to the leader's task thread, which hands them to
:meth:`topology.entries.port.EntryPort.build` in log order. The microbatch op
names are defined here, once: the Spark side emits them
(:mod:`topology.spark.microbatch`) and :mod:`topology.entries.batch_commit`
interprets them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (not imported at run time: the Spark side imports this module and stays off RocksDB)
    from pstate.retention import PlannedCheck, RetentionPolicy

#: microbatch change ops: a PState key's value set, a number added to it, the key removed; a depot record appended
OP_SET = "set"
OP_ADD = "add"
OP_REMOVE = "remove"
OP_APPEND = "append"
MICROBATCH_OPS = (OP_SET, OP_ADD, OP_REMOVE, OP_APPEND)


@dataclass(frozen=True)
class DepotAppend:
    """A client's append request: records per (depot, task partition), one entry; result ``(firsts, acks)``.

    With a ``producer`` (idempotent appends, :mod:`pstate.producers`), a retried
    ``sequence`` gets the original reply and appends nothing. ``timestamp_ms`` is
    the records' event time (None: the leader's clock, :mod:`pstate.depots`).
    """

    appends: Sequence[tuple[str, int, Sequence[bytes]]]
    producer: int = 0
    sequence: int = 0
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class BatchChange:
    """One change of a microbatch: ``op`` (one of :data:`MICROBATCH_OPS`) on ``target`` at ``task``.

    ``key`` and ``value`` are msgpack-encoded as the Spark side sent them (empty: none).
    """

    target: str
    task: int
    key: bytes
    op: str
    value: bytes


@dataclass(frozen=True)
class BatchCommit:
    """A microbatch's changes for this group, one entry tagged (topology, batch_id); result: skipped (bool)."""

    topology: str
    batch_id: int
    changes: Sequence[BatchChange]


@dataclass(frozen=True)
class CodeSwitch:
    """The switch entry to code ``version`` (nothing if the group builds with it already); result None."""

    version: str


@dataclass(frozen=True)
class MigrationBatch:
    """One batch rewriting up to ``limit`` values of the first unfinished PState migration; result None."""

    limit: int


@dataclass(frozen=True)
class InboundHops:
    """The inbound entry consuming the envelopes queued by the group's dataflow at ``now_ms``; result None."""

    now_ms: int


@dataclass(frozen=True)
class OutboxTrim:
    """An entry trimming outbox envelopes their destinations completed; result None."""


@dataclass(frozen=True)
class DepotTrim:
    """A client's or operator's trim of ``depot``'s partition ``task`` below ``before`` (clamped by the promise
    rule, :func:`replog.trims.trim_point`); result: the partition's new start offset."""

    depot: str
    task: int
    before: int


@dataclass(frozen=True)
class RetentionCheck:
    """The leader's periodic retention check at ``now_ms`` (its wall clock, kept in the entry): a mark per
    partition, the trims and at most ``limit`` records of key compaction its depots' policies
    (by depot name) ask for; result: records deleted.

    ``planned`` are checks already decided off the task thread (:func:`pstate.retention.plan_check`, the
    worker's retention driver reads the applied state there): the task thread only writes them. ``policies``
    are checked on the task thread (depots with key compaction, whose rounds read what is staged).
    """

    now_ms: int
    tasks: Sequence[int]
    policies: Mapping[str, RetentionPolicy]
    limit: int = 10_000
    planned: Sequence[PlannedCheck] = ()


#: every request the entry port builds
EntryRequest = DepotAppend | BatchCommit | CodeSwitch | MigrationBatch | InboundHops | OutboxTrim | DepotTrim \
    | RetentionCheck
