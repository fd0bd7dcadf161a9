"""A replica's inbox (:class:`ReplicaInbox`): what other threads post to its task thread, typed and bounded.

Every item is one of a closed set of message types (:data:`InboxItem`), and each kind has its own bound and
its own behaviour when that bound is reached:

* **appends** (:class:`~conductor.worker.pending_entry.PendingEntry`: client appends, microbatch commits, the
  code lifecycle's entries) are *refused* with :class:`replog.errors.Backpressure` once more than
  ``replication.max.unapplied.entries`` of them, or ``replication.max.unapplied.bytes`` of their records, wait
  to be built. The state machine refuses an append beyond those same bounds after it is built (the leader's
  lead over its apply offset), so refusing it here gives the same answer earlier, without building it, and
  without holding the requests' records in memory meanwhile. The client retries it as any Backpressure.
* **peer messages** (replication and dataflow messages from other workers, :data:`PeerMessage`) are *dropped
  and counted* (``dropped``, the ``millrace_inbox_dropped_peer_messages`` metric) once :data:`PEER_BOUND` wait.
  The protocols resend what is lost, as after a broken link: a leader resends unacknowledged frames after
  ``replication.request.timeout.millis`` (``replog/replica_leader.py``), a follower re-asks for them with a
  reset ack and resends its epoch requests likewise (``replog/replica_follower.py``, ``replog/replica.py``),
  a leader re-offers a checkpoint after ``replication.far.horizon.retry.millis``, and a destination repeats its
  pull every second (``topology/dataflow/shipping.py``), which a source answers with the batch again.
* **control** (metastore changes, session events, options, the CAS outcomes, a fault report, a checkpoint to
  install, a dataflow to attach) is *never dropped*. Those are few: the group-state ones are coalesced so the
  latest wins (:data:`COALESCED`: a newer znode state, option set or resign request replaces a waiting one, as
  a ZooKeeper watch that fired once for several changes would), a session event equal to the newest waiting
  one is a duplicate, one fault report is enough; what is left is asserted to stay under :data:`CONTROL_BOUND`.

Items keep the order they were posted in, but for appends, which a drain builds after everything else (as
it always did: one entry per ack level for all of them).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conductor.worker.dataflow import DataflowDriver, Inflow
from conductor.worker.pending_entry import PendingEntry
from conductor.worker.store_swap import PreparedStore
from replog.errors import Backpressure
from replog.messages import (
    ConfigChanged,
    EpochRequest,
    EpochResponse,
    FarHorizonOffer,
    IsrChanged,
    IsrChangeFailed,
    MetastoreChanged,
    RawReplicate,
    ReplicateAck,
    ResignRequested,
    SessionExpired,
    SessionStarted,
)

if TYPE_CHECKING:
    from topology.dataflow.group import GroupDataflow
    from topology.group_code import GroupCode
    from topology.stream import StreamRunner

#: peer messages that may wait: as many as one peer's send queue holds (``transport.MAX_QUEUED_MESSAGES``);
#: a backlog that long means the task thread is stalled, and what is dropped is resent (module docstring)
PEER_BOUND = 10_000
#: control items that may wait once coalesced: one of each coalesced kind, the outcome of the state machine's
#: one CAS in flight, a fault report, a checkpoint install, a dataflow per prepared version, and two session
#: events per ZooKeeper session lost (each takes a session timeout, seconds): far below this
CONTROL_BOUND = 64


@dataclass(frozen=True, eq=False)
class Fail:
    """Stop the replica on ``error`` (a read found its data damaged): its task thread raises it, as a fault."""

    error: BaseException


@dataclass(frozen=True, eq=False)
class InstallCheckpoint:
    """Install a fetched far-horizon checkpoint (``ReplicaHost._start_install``, conductor.worker.checkpoint_install);
    ``done`` gets its answer."""

    prepared: PreparedStore  #: its files verified and its store opened by the transfer's thread (store_swap)
    pairs: list[tuple[int, int]]
    leader: str
    epoch: int
    done: concurrent.futures.Future[str | None]


@dataclass(frozen=True, eq=False)
class AttachDataflow:
    """A code version prepared off the task thread runs topologies: the replica starts its dataflow, unless it
    has one already (then nothing changes)."""

    flow: GroupDataflow
    driver: DataflowDriver
    code: GroupCode
    runner: StreamRunner

    def bind(self) -> None:
        """On the task thread: the flow runs the replica's current code, and the code knows its flow."""
        self.flow.runner = self.code.runner or self.runner
        self.code.flow = self.flow


#: messages from other workers: replication (``Replicate`` still encoded) and dataflow
PeerMessage = RawReplicate | ReplicateAck | EpochRequest | EpochResponse | FarHorizonOffer | Inflow
#: the state machine's events from the metastore, the session and the operator
ControlEvent = (MetastoreChanged | IsrChanged | IsrChangeFailed | SessionExpired | SessionStarted | ResignRequested
                | ConfigChanged)
#: work for the task thread that is not a state-machine event
TaskWork = Fail | InstallCheckpoint | AttachDataflow
#: everything but appends, in the order posted
Ordered = PeerMessage | ControlEvent | TaskWork
#: everything a replica's inbox takes
InboxItem = PendingEntry | Ordered

PEER_TYPES = (RawReplicate, ReplicateAck, EpochRequest, EpochResponse, FarHorizonOffer, Inflow)
#: control kinds of which only the latest waiting one matters
COALESCED = (MetastoreChanged, ConfigChanged, ResignRequested)


class ReplicaInbox:
    """The bounded inbox of one replica (see the module docstring); any thread puts, its task thread drains."""

    def __init__(self, name: str, peer_bound: int = PEER_BOUND, control_bound: int = CONTROL_BOUND) -> None:
        self.name = name
        self.peer_bound = peer_bound
        self.control_bound = control_bound
        self._lock = threading.Lock()
        self._appends: deque[PendingEntry] = deque()
        self._append_bytes = 0
        self._ordered: deque[Ordered] = deque()
        self._peers = 0
        self._control = 0
        #: the waiting item of each coalesced kind, and the newest waiting session event
        self._latest: dict[type, Ordered] = {}
        self._session: SessionExpired | SessionStarted | None = None
        #: peer messages dropped because PEER_BOUND were waiting (metrics)
        self.dropped = 0

    def put_append(self, p: PendingEntry, max_entries: int, max_bytes: int) -> Backpressure | None:
        """Queue an append, or the error to refuse it with when ``max_entries`` or ``max_bytes`` wait already."""
        with self._lock:
            if len(self._appends) >= max_entries:
                return Backpressure(self.name, f"{len(self._appends)} appends wait to be built, limit "
                                               f"replication.max.unapplied.entries={max_entries}")
            if self._appends and self._append_bytes + p.nbytes > max_bytes:
                return Backpressure(self.name, f"{self._append_bytes} bytes of appends wait to be built, limit "
                                               f"replication.max.unapplied.bytes={max_bytes}")
            self._appends.append(p)
            self._append_bytes += p.nbytes
            return None

    def put(self, item: Ordered) -> bool:
        """Queue a peer message or a control item; False when a peer message was dropped (the bound is full)."""
        with self._lock:
            if isinstance(item, PEER_TYPES):
                if self._peers >= self.peer_bound:
                    self.dropped += 1
                    return False
                self._peers += 1
            elif isinstance(item, COALESCED):
                waiting = self._latest.get(type(item))
                if waiting is not None:
                    _remove(self._ordered, waiting)
                    self._control -= 1
                self._latest[type(item)] = item
                self._control_added()
            elif isinstance(item, SessionExpired | SessionStarted):
                if item == self._session:
                    return True  # the same news is waiting already
                self._session = item
                self._control_added()
            elif isinstance(item, Fail):
                if Fail in self._latest:
                    return True  # one fault stops the replica; the first report says why
                self._latest[Fail] = item
                self._control_added()
            else:
                self._control_added()
            self._ordered.append(item)
            return True

    def _control_added(self) -> None:
        self._control += 1
        assert self._control <= self.control_bound, (self.name, self._control, list(self._ordered)[-8:])

    def drain(self) -> list[InboxItem]:
        """Everything waiting, the appends last (the task thread's step); the inbox is empty after."""
        with self._lock:
            ordered, self._ordered = self._ordered, deque()
            appends, self._appends = self._appends, deque()
            self._append_bytes = self._peers = self._control = 0
            self._latest.clear()
            self._session = None
        return [*ordered, *appends]

    def waiting(self) -> int:
        """Items waiting now (any thread; for tests and status)."""
        with self._lock:
            return len(self._ordered) + len(self._appends)


def _remove(items: deque[Ordered], item: Ordered) -> None:
    """Remove ``item`` itself (not an equal one) from ``items``."""
    for i, x in enumerate(items):
        if x is item:
            del items[i]
            return
    raise AssertionError(f"{item!r} is not waiting")
