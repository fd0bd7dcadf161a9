"""The replication state machine of one replica of one task group (sans-IO).

One object per replica, leader or follower (roles change with epochs, and a
single object makes the hand-over explicit instead of copying state between
two). ``handle(event, now_ms) -> list[Action]`` is the only entry point; the
vocabulary and the driver's obligations are in :mod:`replog.messages`.

What the object tracks is log *metadata*, never entry bytes: the log end, the
durable (flushed) end, the epoch of every range (:class:`EpochCache`), the
apply offset known from the leader, and what this replica applied. The driver
holds the bytes, which is what lets the simulator model slow disks and crashes
that lose unflushed entries.

Rules, and why:

* An entry counts as *held* only once flushed, on the leader too. Otherwise a
  crash of every ISR member could lose an applied entry.
* The leader advances the apply offset to ``n`` only when every ISR member
  (the leader's own durable end included) holds ``n`` and ``|ISR| >= min-ISR``.
  Since new leaders come only from the ISR and the ISR only gains members that
  hold the whole log, every applied entry survives every election.
* An ISR member lagging more than ``max_time_lag_ms`` is removed by a
  compare-and-set *before* the smaller ISR is used for anything; while the CAS
  is in flight the leader counts both the old and the proposed members. If the
  ISR would drop below min-ISR it stays as is and the group stalls: appends
  then fail after the append timeout instead of being applied unsafely.
* A follower that sees a new epoch stops accepting entries until it has
  reconciled its log with the leader's by epoch (KIP-101/KIP-279): it asks for
  the end of its latest epoch in the leader's log, truncates to the smaller of
  the two ends, and repeats with its new latest epoch until both agree. It never
  truncates to the apply offset (high watermark), which loses applied entries
  or keeps divergent ones when leaders change quickly.
* Messages from older epochs are dropped; a message from a newer epoch makes a
  follower (or a deposed leader that did not notice yet) adopt that epoch.
* Retention keeps every entry some replica may still need from this log: above
  the durably applied offset (the store's own recovery replays from there), the
  last ``max_near_sync_message_lag`` entries (the near-horizon window), and on a
  leader everything an ISR member has not acknowledged. A follower that needs
  entries below the log start (an OSR member that fell behind, or one whose
  lag exceeds the window) is caught up by far horizon instead.
* The epoch cache is never cut from the start: a returning follower's epoch
  question about entries long deleted still gets the exact answer, so it
  truncates only what diverged, never something it applied.
* Leadership balancing is a coordinated hand-off, not an election: the leader of
  the requested epoch (a request naming another epoch, itself, or a replica
  outside its ISR is stale and ignored) *resigns*: it refuses new appends with
  NotLeader naming the successor, keeps replicating, and once everything it
  appended is applied (``apply_offset == log_end - 1``, so every ISR member, the
  successor included, holds its whole log and no client waits) it makes the
  successor leader of the next epoch with its own compare-and-set. Nothing is
  truncated and no accepted append fails. If that does not happen within
  ``append_timeout_ms`` (a stalled ISR, a lost successor) it gives up and takes
  appends again; a CAS in flight is always awaited first, since it may land.

Assertions state invariants the protocol guarantees; a failing one is a bug in
the protocol or the driver, not bad input (bad input is rejected by the event
constructors or answered with typed errors).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

from replog.config import ReplicationConfig
from replog.epochs import UNDEFINED_EPOCH, EpochCache
from replog.errors import Backpressure, NotLeader, StalledGroup
from replog.messages import (
    Ack,
    Action,
    AppendLocal,
    Apply,
    ChangeIsr,
    ClientAppend,
    ConfigChanged,
    EpochRequest,
    EpochResponse,
    Event,
    GroupState,
    HandOff,
    IsrChanged,
    IsrChangeFailed,
    LocalFlushed,
    LogStartAdvanced,
    MetastoreChanged,
    PersistEpochs,
    Replicate,
    ReplicateAck,
    Reply,
    ResignRequested,
    Role,
    RoleChanged,
    Send,
    SendEntries,
    SessionExpired,
    SessionStarted,
    StartFarHorizon,
    Tick,
    Truncate,
)


@dataclass(slots=True)
class _Peer:
    """What the leader knows about one follower in the current epoch."""

    held: int = -1  #: highest offset the follower reported durable in this epoch
    acked_end: int = 0  #: follower log end as last reported
    next: int = 0  #: next offset to send
    reconciled: bool = False  #: has acknowledged anything in this epoch (so its log is a prefix of ours)
    sent_apply: int = -1  #: apply offset last sent to it
    last_send_ms: int = -(10**18)
    last_progress_ms: int = 0  #: last time acked_end advanced (or a resend started)
    far: bool = False  #: far-horizon catchup in progress
    far_since_ms: int = 0


@dataclass(slots=True)
class _Pending:
    request_id: int
    first: int
    count: int
    deadline_ms: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1


@dataclass(slots=True)
class _Resign:
    """A hand-off in progress: leadership goes to ``to`` (under ``to_session``) unless ``deadline_ms`` passes."""

    to: str
    to_session: int
    deadline_ms: int


@dataclass(slots=True)
class _LeaderState:
    isr: tuple[str, ...]
    osr: tuple[str, ...]
    version: int
    peers: dict[str, _Peer]
    #: proposed znode of an in-flight ChangeIsr (at most one at a time)
    pending_change: GroupState | None = None
    #: ends and append times of batches not yet applied, for the time-lag rule
    batch_ends: list[int] = field(default_factory=list)
    batch_times: list[int] = field(default_factory=list)
    #: cumulative bytes of entries appended under this leadership, from ``bytes_base``
    bytes_base: int = 0
    cum_bytes: list[int] = field(default_factory=lambda: [0])
    wait_append: deque[_Pending] = field(default_factory=deque)
    wait_applied: deque[_Pending] = field(default_factory=deque)
    stalled: bool = False
    #: set while resigning (coordinated hand-off): appends are refused until it lands or is given up
    resign: _Resign | None = None


class Replica:
    """Leader or follower of one task group on one node.

    Construct with what the replica recovered from disk (``log_end`` of the
    recovered log, all of it durable; the epoch checkpoint; ``_meta.applied``)
    and the metastore session it runs under, then feed it the current
    :class:`GroupState` as a :class:`MetastoreChanged` event.
    """

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
    ) -> None:
        assert applied < log_end or (applied == -1 and log_end >= 0), (
            f"applied offset {applied} is not in the recovered log [0, {log_end})"
        )
        assert 0 <= log_start <= applied + 1, (
            f"log starts at {log_start} but only [0, {applied}] is applied: entries in between are lost"
        )
        self.node_id = node_id
        self.group = group
        self.config = config
        self.session = session
        self.session_ok = True
        self.epochs = EpochCache(epoch_pairs)
        # The checkpoint may name epochs whose entries the crash took with it.
        self.epochs.truncate_from_end(log_end)
        self.log_start = log_start
        self.log_end = log_end
        self.flushed_end = log_end
        self.applied = applied
        #: highest offset known to be applied group-wide (the leader's apply offset)
        self.apply_offset = applied
        latest = self.epochs.latest_epoch()
        self.epoch = latest if latest is not None else 0
        self.leader: str | None = None
        self.role = Role.UNATTACHED
        # follower state
        self.reconciled = False
        self._requested_epoch: int | None = None
        self._request_sent_ms = 0
        #: follower: when we last acknowledged (beats are answered at most once per heartbeat interval)
        self._last_ack_ms = -(1 << 62)
        # leader state
        self._ls: _LeaderState | None = None
        self._out: list[Action] = []
        self._now = 0

    # ------------------------------------------------------------------------------------ public API

    def handle(self, event: Event, now_ms: int) -> list[Action]:
        """Feed one event; returns the actions to perform, in order."""
        self._now = now_ms
        self._out = []
        if isinstance(event, Replicate):
            self._on_replicate(event)
        elif isinstance(event, ReplicateAck):
            self._on_ack(event)
        elif isinstance(event, LocalFlushed):
            self._on_flushed(event)
        elif isinstance(event, ClientAppend):
            self._on_client_append(event)
        elif isinstance(event, Tick):
            self._on_tick()
        elif isinstance(event, EpochRequest):
            self._on_epoch_request(event)
        elif isinstance(event, EpochResponse):
            self._on_epoch_response(event)
        elif isinstance(event, MetastoreChanged):
            self._on_metastore(event.state)
        elif isinstance(event, IsrChanged):
            self._on_isr_changed(event.state)
        elif isinstance(event, IsrChangeFailed):
            self._on_isr_change_failed(event)
        elif isinstance(event, SessionExpired):
            self._on_session_expired()
        elif isinstance(event, SessionStarted):
            self.session = event.session
            self.session_ok = True
        elif isinstance(event, LogStartAdvanced):
            self._on_log_start(event.start)
        elif isinstance(event, ResignRequested):
            self._on_resign_requested(event)
        elif isinstance(event, ConfigChanged):
            self._on_config(event.config)
        else:  # pragma: no cover - the Event union is closed
            raise TypeError(f"not a replication event: {event!r}")
        out, self._out = self._out, []
        return out

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def isr(self) -> tuple[str, ...]:
        """The leader's confirmed ISR (empty on followers)."""
        return self._ls.isr if self._ls is not None else ()

    @property
    def resigning_to(self) -> str | None:
        """The successor while this leader resigns (it refuses appends meanwhile), else None."""
        return self._ls.resign.to if self._ls is not None and self._ls.resign is not None else None

    @property
    def accepts_appends(self) -> bool:
        """A leader that is not resigning: drivers build entries only then (others are refused anyway)."""
        return self._ls is not None and self._ls.resign is None and self.session_ok

    @property
    def stalled(self) -> bool:
        """Nothing can be applied: a laggard may not be removed, or the ISR is below min-ISR."""
        return self._ls is not None and (self._ls.stalled or len(self._ls.isr) < self.config.effective_min_isr)

    @property
    def held(self) -> int:
        return self.flushed_end - 1

    def follower_offsets(self) -> dict[str, int]:
        """Leader only: the highest offset each follower reported durable in this epoch (-1 = none)."""
        return {} if self._ls is None else {name: peer.held for name, peer in self._ls.peers.items()}

    def retention_point(self, durable_applied: int) -> int:
        """The lowest offset this log must keep; whole segments below it may be deleted.

        ``durable_applied`` is the applied offset the store holds durably (after
        a flush), which may trail ``applied``: a crash replays from there.
        """
        assert durable_applied <= self.applied, (durable_applied, self.applied)
        keep = min(durable_applied + 1, self.log_end - self.config.max_near_sync_message_lag)
        ls = self._ls
        if ls is not None:
            for r in self._effective_isr():
                if r == self.node_id:
                    continue
                p = ls.peers[r]
                if not p.reconciled:
                    return self.log_start  # unknown need (reconciles within a round trip): keep all
                keep = min(keep, p.held + 1, p.acked_end)
        return max(self.log_start, keep)

    def far_horizon_refusal(self, leader: str, epoch: int, upto: int | None = None,
                            in_isr: bool = False) -> str | None:
        """Why this replica must not take (``upto`` None) or install a far-horizon checkpoint; None if it may.

        A checkpoint belongs to one leadership: only a follower of ``leader`` in
        ``epoch`` takes it. It is installed only outside the ISR (``in_isr`` as
        the driver last saw the znode) and only if it covers the whole log
        (``upto >= log_end - 1``), so no entry this replica acknowledged is
        dropped, and only if it brings something not yet applied.
        """
        if self.role is not Role.FOLLOWER or self.leader != leader or self.epoch != epoch:
            return f"no longer following {leader} in epoch {epoch}"
        if upto is None:
            return None
        if in_isr:
            return "this replica is in the ISR"
        if upto < self.log_end - 1 or upto <= self.applied:
            return f"the checkpoint (offset {upto}) does not cover this log (end {self.log_end}, applied {self.applied})"
        return None

    def _on_config(self, config: ReplicationConfig) -> None:
        """New limits apply at once; a leader re-evaluates its ISR and apply offset under them.

        Safety does not depend on the values (the rules hold for any min-ISR,
        lag or timeout): lowering min-ISR is how an operator chooses to unstall
        a group with fewer copies, as Kafka's dynamic min.insync.replicas.
        """
        assert config.replication_factor == self.config.replication_factor, (
            f"replication factor cannot change live ({self.config.replication_factor} -> {config.replication_factor})")
        self.config = config
        if self._ls is not None:
            self._maybe_change_isr()
            self._advance_apply()
            self._pump_all()

    def _on_log_start(self, start: int) -> None:
        assert start >= self.log_start, f"log start went back from {self.log_start} to {start}"
        assert start <= self.applied + 1, f"entries [{self.applied + 1}, {start}) deleted before being applied"
        self.log_start = start

    # ------------------------------------------------------------------------------- role changes

    def _on_metastore(self, st: GroupState) -> None:
        if st.epoch < self.epoch:
            return  # a stale watch notification
        if st.epoch == self.epoch:
            if self._ls is not None and st.leader == self.node_id and st.version > self._ls.version:
                self._adopt_znode(st)
            elif self.role is Role.UNATTACHED and self.leader is None and st.leader not in (None, self.node_id):
                # e.g. restarted with this epoch recovered from the checkpoint
                self._become_follower(st.epoch, st.leader)
            return
        if st.leader == self.node_id and st.leader_session == self.session and self.session_ok:
            self._become_leader(st)
        elif st.leader is None or st.leader == self.node_id:
            # Elected under a session this incarnation does not own: do not lead.
            self._step_down(st.epoch, None)
        else:
            self._become_follower(st.epoch, st.leader)

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
        changed = self.role is not Role.UNATTACHED
        self.role = Role.UNATTACHED
        if changed and announce:
            self._out.append(RoleChanged(Role.UNATTACHED, epoch, leader))

    def _become_follower(self, epoch: int, leader: str) -> None:
        assert leader != self.node_id
        self._step_down(epoch, None, announce=False)
        self.leader = leader
        self.role = Role.FOLLOWER
        self._out.append(RoleChanged(Role.FOLLOWER, epoch, leader))
        if self.epochs.latest_epoch() is None:
            assert self.log_end == 0, f"log of {self.log_end} entries without epochs"
            self._finish_reconcile()
        else:
            self._request_epoch_end()

    def _become_leader(self, st: GroupState) -> None:
        assert self.node_id in st.isr, f"{self.node_id} elected leader of epoch {st.epoch} outside ISR {st.isr}"
        assert st.epoch > self.epoch, f"elected for epoch {st.epoch} but already at epoch {self.epoch}"
        self._step_down(st.epoch, self.node_id, announce=False)
        self.role = Role.LEADER
        self.reconciled = True
        if self.epochs.assign(st.epoch, self.log_end):
            self._persist_epochs()
        peers = {r: _Peer(last_progress_ms=self._now) for r in st.replicas if r != self.node_id}
        self._ls = _LeaderState(isr=st.isr, osr=st.osr, version=st.version, peers=peers,
                                batch_ends=[self.log_end], batch_times=[self._now],
                                bytes_base=self.log_end)
        # The apply offset learnt from the previous leader is group-wide: every ISR
        # member (this one included) holds it durably.
        self.apply_offset = max(self.applied, min(self.apply_offset, self.flushed_end - 1))
        self._out.append(RoleChanged(Role.LEADER, st.epoch, self.node_id))
        self._apply_to(self.apply_offset)
        self._pump_all()

    def _adopt_znode(self, st: GroupState) -> None:
        ls = self._ls
        assert ls is not None and st.epoch == self.epoch and st.leader == self.node_id
        ls.isr, ls.osr, ls.version = st.isr, st.osr, st.version
        assert self.node_id in ls.isr, f"leader {self.node_id} removed from its own ISR {st.isr}"
        for r in st.replicas:
            if r != self.node_id and r not in ls.peers:
                ls.peers[r] = _Peer(last_progress_ms=self._now)
        self._advance_apply()

    def _on_session_expired(self) -> None:
        self.session_ok = False
        if self._ls is not None:
            # A zombie must not write or apply: another leader may already exist.
            self._step_down(self.epoch, None)

    # ------------------------------------------------------------------------------------ follower

    def _request_epoch_end(self) -> None:
        latest = self.epochs.latest_epoch()
        assert latest is not None and self.leader is not None
        self._requested_epoch = latest
        self._request_sent_ms = self._now
        self._out.append(Send(EpochRequest(self.node_id, self.leader, self.epoch, latest)))

    def _on_epoch_response(self, m: EpochResponse) -> None:
        if (self.role is not Role.FOLLOWER or m.epoch != self.epoch or m.src != self.leader
                or self.reconciled or m.requested_epoch != self._requested_epoch):
            return  # stale or duplicate
        trunc = self._truncation_point(m.found_epoch, m.end_offset)
        assert trunc > self.applied, (
            f"{self.node_id} would truncate applied entries: cut at {trunc}, applied {self.applied}"
        )
        if trunc < self.log_end:
            self._truncate(trunc)
        elif self.epochs.truncate_from_end(trunc):
            # An epoch this replica led without writing anything starts at the log end;
            # it has no entries, so it must go or the exchange would never agree.
            self._persist_epochs()
        latest = self.epochs.latest_epoch()
        if m.found_epoch == UNDEFINED_EPOCH or latest is None or latest == m.found_epoch:
            self._finish_reconcile()
        else:
            assert latest < m.found_epoch, (latest, m.found_epoch)
            self._request_epoch_end()  # KIP-279: iterate until both logs agree on the latest epoch

    def _truncation_point(self, found_epoch: int, leader_end: int) -> int:
        """Where this log must be cut given the leader's ``end_offset_for`` answer (KIP-101/279)."""
        if found_epoch == UNDEFINED_EPOCH:
            return min(leader_end, self.log_end)
        own_end = self.epochs.end_offset_for(found_epoch, self.log_end)[1]
        return min(leader_end, own_end, self.log_end)

    def _truncate(self, end: int) -> None:
        assert self.applied < end <= self.log_end, (self.applied, end, self.log_end)
        self._out.append(Truncate(end))
        self.log_end = end
        self.flushed_end = min(self.flushed_end, end)
        if self.epochs.truncate_from_end(end):
            self._persist_epochs()

    def _finish_reconcile(self) -> None:
        self.reconciled = True
        self._requested_epoch = None
        self._send_ack(reset=True)

    def _send_ack(self, reset: bool = False) -> None:
        assert self.leader is not None
        self._last_ack_ms = self._now
        self._out.append(Send(ReplicateAck(self.node_id, self.leader, self.epoch, self.flushed_end - 1,
                                           self.log_end, reset)))

    def _on_replicate(self, m: Replicate) -> None:
        if m.epoch < self.epoch:
            return  # from a deposed leader
        if m.epoch > self.epoch:
            # Only the metastore creates epochs, so a newer one proves m.src leads it.
            self._become_follower(m.epoch, m.src)
            return
        assert self.role is not Role.LEADER, f"{m.src} and {self.node_id} both lead epoch {m.epoch}"
        if self.role is Role.UNATTACHED and self.leader is None:
            self._become_follower(m.epoch, m.src)  # our epoch has a leader we had not heard of
            return
        if self.role is not Role.FOLLOWER or not self.reconciled:
            return
        assert m.src == self.leader, f"epoch {m.epoch} led by {self.leader} and {m.src}"
        n = len(m.entry_epochs)
        end = m.start + n
        if m.start > self.log_end:
            self._send_ack(reset=True)  # a frame was lost: resend from our end
            return
        if end > self.log_end:
            skip = self.log_end - m.start
            if skip > 0:
                assert self.epochs.epoch_at(self.log_end - 1) == m.entry_epochs[skip - 1], (
                    f"{self.node_id}: overlapping entry {self.log_end - 1} has a different epoch"
                )
            new = m.entry_epochs[skip:]
            changed = False
            for i, e in enumerate(new):
                assert e <= m.epoch, f"entry of epoch {e} sent in epoch {m.epoch}"
                latest = self.epochs.latest_epoch()
                if latest is None or e > latest:
                    changed = self.epochs.assign(e, self.log_end + i) or changed
                else:
                    assert e == latest, f"entry epoch {e} after epoch {latest}"
            self._out.append(AppendLocal(self.log_end, new, m.data, m.start))
            self.log_end = end
            if changed:
                self._persist_epochs()
        if m.apply_offset > self.apply_offset:
            self.apply_offset = m.apply_offset
        self._follower_apply()
        # A frame with entries (new, or resent because the leader missed our ack) is answered. A beat
        # (apply offset or heartbeat only) tells the leader nothing it needs: answering each one cost a
        # message each way per append. Once per heartbeat interval it is answered anyway, which repairs
        # a lost ack (the leader's view of what we hold) even when no entries flow.
        if n or self._now - self._last_ack_ms >= self.config.heartbeat_interval_ms:
            self._send_ack()

    def _follower_apply(self) -> None:
        self._apply_to(min(self.apply_offset, self.flushed_end - 1))

    # ------------------------------------------------------------------------------------- common

    def _on_flushed(self, ev: LocalFlushed) -> None:
        assert ev.end <= self.log_end, f"flushed end {ev.end} beyond log end {self.log_end}"
        if ev.end <= self.flushed_end:
            return
        self.flushed_end = ev.end
        if self._ls is not None:
            self._reply_appended()
            self._advance_apply()
            self._pump_all()
            self._maybe_hand_off()
        elif self.role is Role.FOLLOWER and self.reconciled:
            self._follower_apply()
            self._send_ack()

    def _apply_to(self, up_to: int) -> None:
        if up_to <= self.applied:
            return
        assert up_to < self.flushed_end, f"apply {up_to} beyond durable end {self.flushed_end}"
        assert up_to <= self.apply_offset
        self.applied = up_to
        self._out.append(Apply(up_to))

    def _persist_epochs(self) -> None:
        self._out.append(PersistEpochs(tuple(self.epochs.to_pairs())))

    def _on_tick(self) -> None:
        if self._ls is not None:
            self._leader_tick()
        elif (self.role is Role.FOLLOWER and not self.reconciled and self._requested_epoch is not None
              and self._now - self._request_sent_ms >= self.config.request_timeout_ms):
            self._request_epoch_end()

    # ------------------------------------------------------------------------------------- leader

    def _on_client_append(self, ev: ClientAppend) -> None:
        ls = self._ls
        if ls is None or not self.session_ok:
            self._out.append(Reply(ev.request_id, -1, ev.count, NotLeader(self.group, self.leader, self.epoch)))
            return
        if ls.resign is not None:  # handing off: the successor is the likely leader by the time the client retries
            self._out.append(Reply(ev.request_id, -1, ev.count, NotLeader(self.group, ls.resign.to, self.epoch)))
            return
        cfg = self.config
        unapplied = self.log_end - 1 - self.apply_offset
        if unapplied + ev.count > cfg.max_unapplied_entries:
            self._out.append(Reply(ev.request_id, -1, ev.count, Backpressure(
                self.group, f"{unapplied} entries wait to be applied, limit "
                            f"replication.max.unapplied.entries={cfg.max_unapplied_entries}")))
            return
        unapplied_bytes = self._bytes_between(self.apply_offset + 1, self.log_end)
        if unapplied_bytes + ev.nbytes > cfg.max_unapplied_bytes:
            self._out.append(Reply(ev.request_id, -1, ev.count, Backpressure(
                self.group, f"{unapplied_bytes} bytes wait to be applied, limit "
                            f"replication.max.unapplied.bytes={cfg.max_unapplied_bytes}")))
            return
        first = self.log_end
        self._out.append(AppendLocal(first, (self.epoch,) * ev.count, ev.data, first))
        self.log_end += ev.count
        ls.cum_bytes.append(ls.cum_bytes[-1] + ev.nbytes)
        ls.cum_bytes.extend([ls.cum_bytes[-1]] * (ev.count - 1))
        ls.batch_ends.append(self.log_end)
        ls.batch_times.append(self._now)
        p = _Pending(ev.request_id, first, ev.count, self._now + cfg.append_timeout_ms)
        if ev.ack is Ack.NONE:
            self._out.append(Reply(ev.request_id, first, ev.count))
        elif ev.ack is Ack.APPEND:
            ls.wait_append.append(p)
        else:
            ls.wait_applied.append(p)
        self._pump_all()

    def _bytes_between(self, a: int, b: int) -> int:
        """Bytes of entries ``[a, b)`` appended under this leadership (older ones count as 0)."""
        ls = self._ls
        assert ls is not None
        a = max(a, ls.bytes_base)
        if b <= a:
            return 0
        return ls.cum_bytes[b - ls.bytes_base] - ls.cum_bytes[a - ls.bytes_base]

    def _reply_appended(self) -> None:
        ls = self._ls
        assert ls is not None
        while ls.wait_append and ls.wait_append[0].last < self.flushed_end:
            p = ls.wait_append.popleft()
            self._out.append(Reply(p.request_id, p.first, p.count))

    def _effective_isr(self) -> tuple[str, ...]:
        """Members whose acks the apply offset needs: the ISR plus any member an in-flight CAS adds."""
        ls = self._ls
        assert ls is not None
        if ls.pending_change is None:
            return ls.isr
        return ls.isr + tuple(r for r in ls.pending_change.isr if r not in ls.isr)

    def _apply_candidate(self) -> int | None:
        """Highest offset every ISR member holds, or None if some member has not reported yet."""
        ls = self._ls
        assert ls is not None
        candidate = self.flushed_end - 1
        for r in self._effective_isr():
            if r == self.node_id:
                continue
            p = ls.peers[r]
            if not p.reconciled:
                return None
            candidate = min(candidate, p.held)
        return candidate

    def _advance_apply(self) -> None:
        ls = self._ls
        assert ls is not None
        if not self.session_ok:
            return
        # min-ISR counts members the metastore has recorded: one whose join is still in flight holds the
        # entries (the candidate waits for it) but is not electable yet, so it adds no durability.
        if len(ls.isr) < self.config.effective_min_isr:
            return
        candidate = self._apply_candidate()
        if candidate is None or candidate <= self.apply_offset:
            return
        self.apply_offset = candidate
        self._apply_to(candidate)
        while ls.wait_applied and ls.wait_applied[0].last <= self.apply_offset:
            p = ls.wait_applied.popleft()
            self._out.append(Reply(p.request_id, p.first, p.count))
        # Forget bookkeeping of applied batches (the ISR holds them, so the time-lag rule needs them no more).
        k = bisect_right(ls.batch_ends, self.apply_offset + 1)
        if k > 1:
            del ls.batch_ends[:k - 1]
            del ls.batch_times[:k - 1]
        cut = self.apply_offset + 1 - ls.bytes_base
        if cut > 4096 and cut > len(ls.cum_bytes) // 2:
            lowest = min([p.acked_end for p in ls.peers.values() if not p.far] + [self.apply_offset + 1])
            cut = min(cut, lowest - ls.bytes_base)
            if cut > 0:
                base_bytes = ls.cum_bytes[cut]
                ls.cum_bytes = [c - base_bytes for c in ls.cum_bytes[cut:]]
                ls.bytes_base += cut

    def _lag_ms(self, r: str) -> int:
        """How long the oldest entry follower ``r`` does not hold has existed (0 if it holds all)."""
        ls = self._ls
        assert ls is not None
        p = ls.peers[r]
        first_missing = p.held + 1 if p.reconciled else 0
        if first_missing >= self.log_end:
            return 0
        k = bisect_right(ls.batch_ends, first_missing)
        if k >= len(ls.batch_ends):
            return 0
        return self._now - ls.batch_times[k]

    def _on_ack(self, m: ReplicateAck) -> None:
        ls = self._ls
        if ls is None or m.epoch != self.epoch or m.src not in ls.peers:
            return
        assert m.held < self.log_end and m.log_end <= self.log_end, (
            f"{m.src} acks {m.held}/{m.log_end} beyond leader log end {self.log_end} in epoch {self.epoch}"
        )
        p = ls.peers[m.src]
        p.reconciled = True
        if m.reset:
            p.acked_end = m.log_end
            p.next = m.log_end
            p.last_progress_ms = self._now
            p.far = False  # it (re)started fetching: an earlier far-horizon offer may have died with it
        elif m.log_end > p.acked_end:
            p.acked_end = m.log_end
            p.last_progress_ms = self._now
            p.next = max(p.next, p.acked_end)
        if m.held > p.held:
            p.held = m.held
        if (p.far and p.acked_end >= self.log_start
                and self.log_end - p.acked_end <= self.config.max_near_sync_message_lag):
            p.far = False
        self._maybe_change_isr()
        self._advance_apply()
        self._pump(m.src, p)
        self._maybe_hand_off()

    def _on_epoch_request(self, m: EpochRequest) -> None:
        ls = self._ls
        if ls is None or m.epoch != self.epoch or m.src not in ls.peers:
            return
        found, end = self.epochs.end_offset_for(m.requested_epoch, self.log_end)
        self._out.append(Send(EpochResponse(self.node_id, m.src, self.epoch, m.requested_epoch, found, end)))

    def _maybe_change_isr(self) -> None:
        """Start at most one ISR compare-and-set: shrink laggards, or re-admit a caught-up follower."""
        ls = self._ls
        assert ls is not None
        if ls.pending_change is not None or not self.session_ok:
            return
        lagging = [r for r in ls.isr if r != self.node_id and self._lag_ms(r) > self.config.max_time_lag_ms]
        if lagging:
            keep = tuple(r for r in ls.isr if r not in lagging)
            if len(keep) >= self.config.effective_min_isr:
                ls.stalled = False
                self._propose(keep, ls.osr + tuple(lagging))
                return
            ls.stalled = True
        else:
            ls.stalled = False
        for r in ls.osr:
            p = ls.peers[r]
            if p.reconciled and p.held + 1 >= self.log_end and p.held >= self.apply_offset:
                self._propose((*ls.isr, r), tuple(o for o in ls.osr if o != r))
                return

    def _propose(self, isr: tuple[str, ...], osr: tuple[str, ...]) -> None:
        ls = self._ls
        assert ls is not None and self.node_id in isr
        new = GroupState(self.node_id, self.epoch, isr, osr, ls.version + 1, self.session)
        ls.pending_change = new
        self._out.append(ChangeIsr(ls.version, new))

    def _on_isr_changed(self, st: GroupState) -> None:
        ls = self._ls
        if ls is None or st != ls.pending_change:
            return  # the answer to an older CAS (perhaps of an earlier leadership)
        ls.pending_change = None
        if st.epoch > self.epoch:  # our hand-off landed: follow the successor
            assert ls.resign is not None and st.leader == ls.resign.to, (self.node_id, st, ls.resign)
            self._on_metastore(st)
            return
        if st.version > ls.version:
            self._adopt_znode(st)
        self._maybe_change_isr()
        self._pump_all()
        self._maybe_hand_off()

    def _on_isr_change_failed(self, ev: IsrChangeFailed) -> None:
        ls = self._ls
        if ls is None or ev.proposed != ls.pending_change:
            return  # the answer to an older CAS (perhaps of an earlier leadership)
        ls.pending_change = None
        if ev.reason == "session_expired":
            self._on_session_expired()
            return
        cur = ev.current
        if cur is not None:
            if cur.epoch > self.epoch:
                self._on_metastore(cur)  # deposed: follow the new leader
            elif cur.epoch == self.epoch and cur.leader == self.node_id and cur.version > ls.version:
                self._adopt_znode(cur)  # our view was stale; the next tick re-evaluates the ISR

    def _leader_tick(self) -> None:
        ls = self._ls
        assert ls is not None
        now = self._now
        self._maybe_change_isr()
        for queue in (ls.wait_append, ls.wait_applied):
            while queue and queue[0].deadline_ms <= now:
                p = queue.popleft()
                self._out.append(Reply(p.request_id, p.first, p.count, self._timeout_error()))
        self._pump_all()
        self._maybe_hand_off()

    # ---------------------------------------------------------------------- coordinated hand-off

    def _on_resign_requested(self, ev: ResignRequested) -> None:
        ls = self._ls
        if ls is None or not self.session_ok or ev.epoch != self.epoch:
            return  # stale: leadership changed since the conductor asked (or we never had it)
        if ev.to == self.node_id or ev.to not in ls.isr:
            return  # only an in-sync replica can take over without losing applied entries
        if ls.resign is not None and ls.resign.to == ev.to:
            return  # a repeated notification keeps the original deadline
        if ls.resign is not None and ls.pending_change is not None and ls.pending_change.epoch > self.epoch:
            return  # the hand-off CAS to the first successor is in flight; its outcome decides
        ls.resign = _Resign(ev.to, ev.to_session, self._now + self.config.append_timeout_ms)
        self._maybe_hand_off()

    def _maybe_hand_off(self) -> None:
        """While resigning: give up past the deadline, or hand off once everything appended is applied."""
        ls = self._ls
        if ls is None or ls.resign is None or ls.pending_change is not None or not self.session_ok:
            return  # one CAS at a time; a hand-off in flight is never abandoned (it may land)
        rs = ls.resign
        if self._now >= rs.deadline_ms or rs.to not in ls.isr:
            ls.resign = None  # resume taking appends; the conductor may ask again
            return
        peer = ls.peers[rs.to]
        if not self._caught_up(peer):
            return
        assert not ls.wait_append and not ls.wait_applied, (
            f"{self.node_id} hands off {self.group} with clients waiting: every accepted append must be answered"
        )
        new = GroupState(rs.to, self.epoch + 1, ls.isr, ls.osr, ls.version + 1, rs.to_session)
        ls.pending_change = new
        self._out.append(HandOff(ls.version, new))

    def _caught_up(self, successor: _Peer) -> bool:
        """Everything this leader appended is applied and durably held by the successor."""
        end = self.log_end
        return self.apply_offset == end - 1 and successor.reconciled and successor.held >= end - 1

    def _timeout_error(self) -> StalledGroup | Backpressure:
        ls = self._ls
        assert ls is not None
        if ls.stalled or len(ls.isr) < self.config.effective_min_isr:
            # Stalled by a laggard we may not remove, or handed an ISR already below min-ISR
            # (the controller drops a dead leader from the ISR): either way nothing can apply.
            healthy = [r for r in ls.isr
                       if r == self.node_id or self._lag_ms(r) <= self.config.max_time_lag_ms]
            return StalledGroup(self.group, healthy, self.config.effective_min_isr)
        return Backpressure(self.group, f"append waited replication.depot.append.timeout.millis="
                                        f"{self.config.append_timeout_ms} for replication")

    def _pump_all(self) -> None:
        ls = self._ls
        assert ls is not None
        for r, p in ls.peers.items():
            self._pump(r, p)

    def _pump(self, r: str, p: _Peer) -> None:
        """Send follower ``r`` what it lacks, within its in-flight bounds, or a heartbeat."""
        ls = self._ls
        assert ls is not None
        if not self.session_ok:
            return
        cfg = self.config
        now = self._now
        if p.reconciled:
            if p.next > p.acked_end and now - p.last_progress_ms >= cfg.request_timeout_ms:
                p.next = p.acked_end  # frames or acks were lost: go back
                p.last_progress_ms = now
            lag = self.log_end - p.acked_end
            # A checkpoint holds the applied state only: for an OSR member it is worth its cost when it skips
            # more than the near window. A group stalled below min-ISR applies nothing, so its checkpoints
            # skip nothing and the follower must replay what it lacks to rejoin (found by the simulator
            # once min-ISR could be raised live: offers of the same checkpoint forever, a stall forever).
            skip = self.apply_offset + 1 - p.acked_end
            near = cfg.max_near_sync_message_lag
            if p.acked_end < self.log_start or (r in ls.osr and lag > near and skip > near):
                if not p.far or now - p.far_since_ms >= cfg.far_horizon_retry_ms:
                    p.far = True
                    p.far_since_ms = now
                    self._out.append(StartFarHorizon(r, self.epoch, self.apply_offset))
            else:
                p.far = False
            if not p.far:
                while p.next < self.log_end:
                    if p.next - p.acked_end >= cfg.max_inflight_entries:
                        break
                    if self._bytes_between(p.acked_end, p.next) >= cfg.max_inflight_bytes:
                        break
                    end = min(self.log_end, p.next + cfg.max_batch_entries,
                              p.acked_end + cfg.max_inflight_entries)
                    assert p.next >= self.log_start, (r, p.next, self.log_start)
                    self._out.append(SendEntries(r, self.epoch, p.next, end, self.apply_offset))
                    p.next = end
                    p.sent_apply = self.apply_offset
                    p.last_send_ms = now
        if p.sent_apply < self.apply_offset or now - p.last_send_ms >= cfg.heartbeat_interval_ms:
            start = p.next if p.reconciled else self.log_end
            self._out.append(SendEntries(r, self.epoch, start, start, self.apply_offset))
            p.sent_apply = self.apply_offset
            p.last_send_ms = now
