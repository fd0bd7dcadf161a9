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
  or keeps divergent ones when leaders change quickly. A question that reached
  the new leader before it knew its epoch was dropped; the leader's first
  frame of the epoch proves it knows now, so the follower asks again then
  (once per epoch) rather than after ``request_timeout_ms``: the new leader
  applies nothing until every ISR member has reconciled, and a hand-off's old
  leader, told by its own CAS, asks too early nearly every time.
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

* What a replica applied stays applied across its restarts: the
  store may come back from a crash below what it applied (its un-flushed state
  is lost), but the driver keeps the highest applied offset durably (the
  *applied floor*, in the storage marks). Those entries were committed, so a
  replica re-applies its log up to the floor as soon as it leads, or follows a
  leader it reconciled with, without waiting for the commit rule: a leader whose
  ISR is below min-ISR still serves everything it acknowledged as applied.
  Truncation never goes below the floor (the KIP-101 rule above keeps it).

* The replicas change only by a reassignment (:mod:`replog.reassignment`,
  KIP-455): an added replica is a follower like any other that starts empty,
  catches up and is admitted to the ISR by the rejoin rule above; min-ISR is
  the joint rule of that module while a plan runs; the leader forgets a
  removed replica (sends it nothing, ignores what it sends), and a replica
  that reads a znode without itself says :class:`Removed` and serves nothing
  more.

* A replica acknowledges, applies and leads nothing until the group znode
  records its storage's incarnation; storage that lost entries it acknowledged
  is recorded in the same CAS that takes it out of the ISR and the leadership,
  and a leader counts only acks of the recorded incarnation
  (:mod:`replog.eligibility`, KIP-966/KIP-903). Storage unsure of its last
  flush (``unsure``) registers its log with its incarnation and keeps its
  place; the leader vouches for it once it holds the leader's whole log.

Assertions state invariants the protocol guarantees; a failing one is a bug in
the protocol or the driver, not bad input (bad input is rejected by the event
constructors or answered with typed errors).
"""

from __future__ import annotations

from replog.config import ReplicationConfig
from replog.eligibility import record_storage, unsure_of
from replog.errors import NotLeader
from replog.messages import (
    Action,
    ClientAppend,
    ConfigChanged,
    EpochRequest,
    EpochResponse,
    Event,
    GroupState,
    IsrChanged,
    IsrChangeFailed,
    LocalFlushed,
    LogStartAdvanced,
    MetastoreChanged,
    RecordStorage,
    Removed,
    Replicate,
    ReplicateAck,
    Reply,
    ResignRequested,
    Role,
    RoleChanged,
    SessionExpired,
    SessionStarted,
    Tick,
)
from replog.replica_follower import FollowerRules
from replog.replica_leader import LeaderRules
from replog.replica_state import LeaderState, Peer


class Replica(LeaderRules, FollowerRules):
    """Leader or follower of one task group on one node.

    Construct with what the replica recovered from disk (``log_end`` of the
    recovered log, all of it durable; the epoch checkpoint; ``_meta.applied``;
    the applied floor of its storage marks)
    and the metastore session it runs under, then feed it the current
    :class:`GroupState` as a :class:`MetastoreChanged` event.

    The rules are split by role: :class:`~replog.replica_leader.LeaderRules`,
    :class:`~replog.replica_follower.FollowerRules`, over the shared
    :class:`~replog.replica_state.ReplicaState`. This class dispatches events
    and changes roles, which needs both.
    """

    # ------------------------------------------------------------------------------------ public API

    def handle(self, event: Event, now_ms: int) -> list[Action]:
        """Feed one event; returns the actions to perform, in order."""
        self._now = now_ms
        self._out = []
        if self._epochs_unsaved:
            self._epochs_unsaved = False
            self._persist_epochs()
        if isinstance(event, IsrChangeFailed) and self._stale_without_me(event.current):
            event = IsrChangeFailed(event.reason, event.proposed, None)  # answered as if nothing was read
        if self.removed or self._stale_without_me(event) or self._leaves_group(event):
            if isinstance(event, ClientAppend):
                self._out.append(Reply(event.request_id, -1, event.count, NotLeader(self.group, None, self.epoch)))
            out, self._out = self._out, []
            return out
        handled = ((self.incarnation is not None and self._storage_event(event))
                   or (not self.registered and self._while_unregistered(event)))
        if handled:
            pass
        elif isinstance(event, Replicate):
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
        return self._ls is not None and (self._ls.stalled or not self._min_isr_met(self._ls.isr))

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
        the driver last saw the znode), or by an ISR member the znode doubts
        (``replog.eligibility``: it promises nothing, and may lack entries the
        leader's log no longer has), and only if it covers the whole log
        (``upto >= log_end - 1``), so no entry this replica acknowledged is
        dropped, and only if it brings something not yet applied.
        """
        if self.role is not Role.FOLLOWER or self.leader != leader or self.epoch != epoch:
            return f"no longer following {leader} in epoch {epoch}"
        if upto is None:
            return None
        if in_isr and (self._seen is None or unsure_of(self._seen, self.node_id) is None):
            return "this replica is in the ISR"
        if upto < self.log_end - 1 or upto <= self.applied:
            return f"the checkpoint (offset {upto}) does not cover this log (end {self.log_end}, applied {self.applied})"
        return None

    def _on_config(self, config: ReplicationConfig) -> None:
        """New limits apply at once; a leader re-evaluates its ISR and apply offset under them.

        Safety does not depend on the values (the rules hold for any min-ISR,
        lag or timeout): lowering min-ISR is how an operator chooses to unstall
        a group with fewer copies, as Kafka's dynamic min.insync.replicas. The
        replication factor may change too: it only says what the conductor
        places; the group's replicas are the znode's (a reassignment changes
        them), and min-ISR's default follows their count
        (:func:`replog.reassignment.min_isr_for`).
        """
        self.config = config
        if self._ls is not None:
            self._maybe_change_isr()
            self._advance_apply()
            self._pump_all()

    def _on_log_start(self, start: int) -> None:
        assert start >= self.log_start, f"log start went back from {self.log_start} to {start}"
        assert start <= self.applied + 1, f"entries [{self.applied + 1}, {start}) deleted before being applied"
        self.log_start = start

    # ------------------------------------------------------------------------------- membership

    def _stale_without_me(self, event: Event | GroupState | None) -> bool:
        """A znode older than one that listed this replica, that does not list it: a stale read from before this
        replica was added (again); nothing in it concerns this replica (dropped; for a failed CAS, its answer
        is taken without the znode read)."""
        st = event.state if isinstance(event, MetastoreChanged) else event
        return (isinstance(st, GroupState) and self.node_id not in st.replicas
                and st.version <= self._member_version)

    def _leaves_group(self, event: Event) -> bool:
        """A znode newer than the last one listing this replica does not list it: a reassignment removed it.

        The replica steps down, says so with :class:`Removed` (the driver
        closes it and deletes its data, or keeps it if the znode retired this
        copy: replog.retirement) and serves nothing more: it is
        terminal, and a node the group takes back later gets a new replica. A
        replica that has never seen a znode listing it (restarted after being
        removed while down) is removed by the first one it reads. An older
        znode (a stale read) changes nothing.
        """
        st = event.state if isinstance(event, MetastoreChanged) else (
            event.current if isinstance(event, IsrChangeFailed) else None)
        if st is None:
            return False
        if self.node_id in st.replicas:
            self._member_version = max(self._member_version, st.version)
            return False
        assert self._ls is None or st.epoch > self.epoch, (
            f"{self.node_id} removed from {self.group} while it leads epoch {self.epoch}: {st}")
        self._step_down(max(self.epoch, st.epoch), st.leader if st.epoch >= self.epoch else None)
        self.removed = True
        self._out.append(Removed(st.version, retired=any(rec[0] == self.node_id for rec in st.retired)))
        return True

    # ------------------------------------------------------------------------------- storage

    def _storage_event(self, event: Event) -> bool:
        """Storage records (replog.eligibility): the outcome of this replica's RecordStorage CAS, and the znodes
        it (re)records its storage from; True if ``event`` is fully handled."""
        if isinstance(event, IsrChanged) and self._recording is not None and event.state == self._recording:
            self._recording = None
            self._on_storage_znode(event.state)
        elif (isinstance(event, IsrChangeFailed) and self._recording is not None
              and event.proposed == self._recording):
            self._recording = None
            if event.current is not None:
                self._on_storage_znode(event.current)
        elif isinstance(event, MetastoreChanged):
            self._on_storage_znode(event.state)
        else:
            if (isinstance(event, Tick) and self._recording is None and self._seen is not None
                    and self._now - self._recording_ms >= self.config.request_timeout_ms):
                self._propose_storage(self._seen)  # after a CAS lost with the session, or a znode not renewed
            return False
        return True

    def _on_storage_znode(self, st: GroupState) -> None:
        if self._seen is None or st.version >= self._seen.version:
            self._seen = st
        if st.incarnation_of(self.node_id) == self.incarnation and self._recording is None:
            self.opened_unsure = False  # registered: from now on the znode says whether its log is doubted
        self._propose_storage(st)
        if st.incarnation_of(self.node_id) == self.incarnation:
            self.registered = True
        if self.registered:
            self._on_metastore(st)

    def _propose_storage(self, st: GroupState) -> None:
        """Record this storage's incarnation under the current session, unless ``st`` does or a CAS is in flight."""
        assert self.incarnation is not None
        if self._recording is not None or not self.session_ok:
            return
        new = self._storage_record(st)
        if new is None:
            return  # recorded already (or lost as the last ISR member: it serves nothing until data is restored)
        self._recording = new
        self._recording_ms = self._now
        self._out.append(RecordStorage(st.version, new))

    def _storage_record(self, st: GroupState) -> GroupState | None:
        """:func:`record_storage` of ``st`` for this replica, with its log when its storage is unsure."""
        assert self.incarnation is not None
        log = None
        if self.opened_unsure or (unsure_of(st, self.node_id) is not None
                                  and st.incarnation_of(self.node_id) == self.incarnation):
            log = (self.epochs.epoch_at(self.flushed_end - 1) or 0, self.flushed_end)  # (what it holds durably)
        return record_storage(st, self.node_id, self.incarnation, self.session, log)

    def _while_unregistered(self, event: Event) -> bool:
        """Until the znode records this storage's incarnation the replica serves nothing; True if ``event`` is done.

        Peer messages, ISR outcomes and resign requests are dropped (unanswered,
        so nothing is acknowledged from a storage the ISR does not know);
        appends are refused.
        """
        if isinstance(event, ClientAppend):
            self._out.append(Reply(event.request_id, -1, event.count, NotLeader(self.group, None, self.epoch)))
            return True
        return isinstance(event, (Tick, Replicate, ReplicateAck, EpochRequest, EpochResponse, ResignRequested,
                                  IsrChanged, IsrChangeFailed))

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
        peers = {r: Peer(last_progress_ms=self._now, last_heard_ms=self._now) for r in st.replicas if r != self.node_id}
        self._ls = LeaderState(isr=st.isr, osr=st.osr, version=st.version, peers=peers, storage=st.storage,
                                elr=st.elr, adding=st.adding, removing=st.removing, retired=st.retired,
                                reconfirming=st.reconfirming, unsure=st.unsure, batch_ends=[self.log_end],
                                batch_times=[self._now],
                                bytes_base=self.log_end)
        # The apply offset learnt from the previous leader is group-wide: every ISR
        # member (this one included) holds it durably.
        self.apply_offset = max(self.applied, min(self.apply_offset, self.flushed_end - 1))
        self._out.append(RoleChanged(Role.LEADER, st.epoch, self.node_id))
        self._apply_to(self.apply_offset)
        if st.elr:
            self._maybe_change_isr()  # empty the ELR at once: nothing new is applied until then
        # An ISR of this replica alone (a group of one, after a reassignment from one or to one) applies what it
        # holds now: no ack or append may ever come to trigger it (sim seed 10000347).
        self._advance_apply()
        self._pump_all()

    def _on_session_expired(self) -> None:
        self.session_ok = False
        if self._ls is not None:
            # A zombie must not write or apply: another leader may already exist.
            self._step_down(self.epoch, None)

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

    def next_tick_ms(self) -> int | None:
        """The earliest time a :class:`Tick` may change anything; None when only another event can.

        A driver may deliver ticks only from then on (a time already past: at
        its usual cadence), so an idle replica sleeps instead of polling. It is
        conservative: a tick before it produces no action and changes nothing,
        which the simulator checks on every tick it delivers.
        """
        if self._epochs_unsaved:
            return 0  # the cut epoch file is persisted by the first event, a tick included
        if self.removed:
            return None
        due = [t for t in (self._storage_next_tick(), self._role_next_tick()) if t is not None]
        return min(due) if due else None

    def _role_next_tick(self) -> int | None:
        if self._ls is not None:
            return self._leader_next_tick()
        if self.role is Role.FOLLOWER and not self.reconciled and self._requested_epoch is not None:
            return self._request_sent_ms + self.config.request_timeout_ms
        return None

    def _storage_next_tick(self) -> int | None:
        """When a tick proposes this storage's record again (``_storage_event``), if one would."""
        if (self.incarnation is None or self._recording is not None or self._seen is None or not self.session_ok
                or self._storage_record(self._seen) is None):
            return None
        return self._recording_ms + self.config.request_timeout_ms

    def _on_tick(self) -> None:
        if self._ls is not None:
            self._leader_tick()
        elif (self.role is Role.FOLLOWER and not self.reconciled and self._requested_epoch is not None
              and self._now - self._request_sent_ms >= self.config.request_timeout_ms):
            self._request_epoch_end()

