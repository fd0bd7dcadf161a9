"""What one replica keeps between events, shared by its leader rules and its follower rules (sans-IO).

:class:`ReplicaState` holds the log metadata (never entry bytes: see
:mod:`replog.replica`), the primitives both roles use (apply, persist the epoch
cache, step down) and names the role changes that the rules trigger, which
:class:`replog.replica.Replica` defines. :class:`LeaderState` is what a leader
knows in its current epoch; it dies with the leadership.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replog.config import ReplicationConfig
from replog.epochs import EpochCache
from replog.errors import NotLeader
from replog.messages import Action, Apply, GroupState, PersistEpochs, ReplicateAck, Reply, Role, RoleChanged


@dataclass(slots=True)
class Peer:
    """What the leader knows about one follower in the current epoch."""

    held: int = -1  #: highest offset the follower reported durable in this epoch
    acked_end: int = 0  #: follower log end as last reported
    next: int = 0  #: next offset to send
    reconciled: bool = False  #: has acknowledged anything in this epoch (so its log is a prefix of ours)
    sent_apply: int = -1  #: apply offset last sent to it
    last_send_ms: int = -(10**18)
    last_progress_ms: int = 0  #: last time acked_end advanced (or a resend started)
    last_heard_ms: int = 0  #: last time it acknowledged anything in this epoch (or when it became a peer)
    far: bool = False  #: far-horizon catchup in progress
    far_since_ms: int = 0


@dataclass(slots=True)
class PendingAppend:
    request_id: int
    first: int
    count: int
    deadline_ms: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1


@dataclass(slots=True)
class Resign:
    """A hand-off in progress: leadership goes to ``to`` (under ``to_session``) unless ``deadline_ms`` passes."""

    to: str
    to_session: int
    deadline_ms: int


@dataclass(slots=True)
class LeaderState:
    isr: tuple[str, ...]
    osr: tuple[str, ...]
    version: int
    peers: dict[str, Peer]
    #: storage records of the znode (acks of an incarnation other than the recorded one do not count)
    storage: tuple[tuple[str, int, int], ...] = ()
    #: eligible leader replicas of the znode: nothing is applied (nor a checkpoint offered) until a CAS empties it
    elr: tuple[str, ...] = ()
    #: the reassignment in progress in the znode (replog.reassignment): replicas being added and removed
    adding: tuple[str, ...] = ()
    removing: tuple[str, ...] = ()
    #: the copies the last plan retired and the replicas still to reconfirm (replog.retirement): nothing is
    #: applied while any copy is retired
    retired: tuple[tuple[str, int, int], ...] = ()
    reconfirming: tuple[str, ...] = ()
    #: the znode's unsure records (replog.eligibility): the leader drops one once that member holds its whole log
    unsure: tuple[tuple[str, int, int, int], ...] = ()
    #: proposed znode of an in-flight ChangeIsr (at most one at a time)
    pending_change: GroupState | None = None
    #: ends and append times of batches not yet applied, for the time-lag rule
    batch_ends: list[int] = field(default_factory=list)
    batch_times: list[int] = field(default_factory=list)
    #: cumulative bytes of entries appended under this leadership, from ``bytes_base``
    bytes_base: int = 0
    cum_bytes: list[int] = field(default_factory=lambda: [0])
    wait_append: deque[PendingAppend] = field(default_factory=deque)
    wait_applied: deque[PendingAppend] = field(default_factory=deque)
    stalled: bool = False
    #: set while resigning (coordinated hand-off): appends are refused until it lands or is given up
    resign: Resign | None = None
    #: each peer's last reset ack from a storage the znode did not record yet: a new replica's record reaches
    #: this leader through its watch, often after the ack the replica sent once its own CAS landed; taken
    #: when a znode records that incarnation (``_adopt_znode``), as if it had arrived then (one per peer)
    early_resets: dict[str, ReplicateAck] = field(default_factory=dict)


class ReplicaState:
    """The state of one replica and the steps both roles share; the rules are in the subclasses."""

    def __init__(
        self,
        node_id: str,
        group: str,
        config: ReplicationConfig,
        *,
        session: int = 0,
        log_start: int = 0,
        log_end: int = 0,
        epoch_pairs: tuple[tuple[int, int], ...] | list[tuple[int, int]] = (),
        applied: int = -1,
        incarnation: int | None = None,
        applied_floor: int = -1,
        unsure: bool = False,
    ) -> None:
        assert applied < log_end or (applied == -1 and log_end >= 0), (
            f"applied offset {applied} is not in the recovered log [0, {log_end})"
        )
        assert applied_floor < log_end, f"applied floor {applied_floor} is not in the recovered log [0, {log_end})"
        assert 0 <= log_start <= applied + 1, (
            f"log starts at {log_start} but only [0, {applied}] is applied: entries in between are lost"
        )
        self.node_id = node_id
        self.group = group
        self.config = config
        self.session = session
        self.session_ok = True
        self.epochs = EpochCache(epoch_pairs)
        # The checkpoint may name epochs whose entries the crash took with it, or an epoch this replica led
        # without writing anything. Cut here, the file must be cut too (the first `handle` persists it):
        # entries of an older epoch appended at that offset later would otherwise sit, after the next
        # restart, under the stale epoch, and the replica would answer epoch requests with a wrong history
        # (sim seed 9504344: a truncated applied entries on the word of such a leader).
        self._epochs_unsaved = self.epochs.truncate_from_end(log_end)
        self.log_start = log_start
        self.log_end = log_end
        self.flushed_end = log_end
        self.applied = applied
        #: highest offset this storage ever applied (the driver keeps it in its marks): after a crash the
        #: store may hold less (its un-flushed state is lost), but entries up to it were committed, so they
        #: are re-applied as soon as the replica leads, or follows once reconciled, whatever the ISR's size
        #: (replay is deterministic), and never truncated
        self.applied_floor = max(applied, applied_floor)
        #: highest offset known to be applied group-wide (the leader's apply offset)
        self.apply_offset = self.applied_floor
        latest = self.epochs.latest_epoch()
        self.epoch = latest if latest is not None else 0
        self.leader: str | None = None
        self.role = Role.UNATTACHED
        # follower state
        self.reconciled = False
        self._requested_epoch: int | None = None
        self._request_sent_ms = 0
        #: follower: the leader has spoken in this epoch (a frame or an epoch answer), so it knows it leads it.
        #: A question sent before may have reached it before it did, and been dropped (see _on_replicate)
        self._leader_heard = False
        #: follower: when we last acknowledged (beats are answered at most once per heartbeat interval)
        self._last_ack_ms = -(1 << 62)
        #: follower: when we last asked the leader to resend from our log end (a reset ack; see _on_replicate)
        self._reset_ack_ms = -(1 << 62)
        # leader state
        self._ls: LeaderState | None = None
        #: this storage's incarnation (None: the driver does not track storage, e.g. unit tests of other rules)
        self.incarnation = incarnation
        #: the znode records this incarnation; until then the replica acknowledges, applies and leads nothing
        self.registered = incarnation is None
        #: the open-time check doubts this storage's log (replog.eligibility.storage_unsure): it registers its log
        #: with its storage until the znode does not doubt it (the znode's ``unsure`` record decides from then on)
        self.opened_unsure = unsure
        self._recording: GroupState | None = None
        self._recording_ms = 0
        self._seen: GroupState | None = None
        #: the highest znode version that listed this replica (-1: none yet); a newer znode without it means a
        #: reassignment removed it
        self._member_version = -1
        #: a reassignment removed this replica: it serves nothing more (the driver deletes its data)
        self.removed = False
        self._out: list[Action] = []
        self._now = 0

    def _step_down(self, epoch: int, leader: str | None, announce: bool = True) -> None:
        """Leave the leader role (if held), failing the clients still waiting; become unattached."""
        ls = self._ls
        if ls is not None:
            err = NotLeader(self.group, leader, epoch)
            for p in (*ls.wait_append, *ls.wait_applied):
                self._out.append(Reply(p.request_id, p.first, p.count, err))
            self._ls = None
        assert epoch >= self.epoch
        self.epoch = epoch
        self.leader = leader
        self.reconciled = False
        self._requested_epoch = None
        self._leader_heard = False
        changed = self.role is not Role.UNATTACHED
        self.role = Role.UNATTACHED
        if changed and announce:
            self._out.append(RoleChanged(Role.UNATTACHED, epoch, leader))

    def _apply_to(self, up_to: int) -> None:
        if up_to <= self.applied:
            return
        assert up_to < self.flushed_end, f"apply {up_to} beyond durable end {self.flushed_end}"
        assert up_to <= self.apply_offset
        self.applied = up_to
        self.applied_floor = max(self.applied_floor, up_to)
        self._out.append(Apply(up_to))

    def _persist_epochs(self) -> None:
        self._out.append(PersistEpochs(tuple(self.epochs.to_pairs())))

    if TYPE_CHECKING:
        # Role changes, defined by Replica (they need both roles' rules); declared
        # for the type checker only, so no stub can be called by mistake at run time.

        def _on_metastore(self, st: GroupState) -> None: ...

        def _become_follower(self, epoch: int, leader: str) -> None: ...

        def _on_session_expired(self) -> None: ...
