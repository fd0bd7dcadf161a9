"""The leader's rules of the replication state machine (see :mod:`replog.replica` for why they hold).

Appends and backpressure, the apply offset (every ISR member holds it and the
ISR has at least min-ISR members), ISR shrink and rejoin by compare-and-set,
what each follower is sent (entries, beats, far horizon), the coordinated
hand-off, and the timeouts that answer clients of a stalled group.
"""

from __future__ import annotations

from bisect import bisect_right

from replog.errors import Backpressure, NotLeader, StalledGroup
from replog.messages import (
    Ack,
    AppendLocal,
    ChangeIsr,
    ClientAppend,
    EpochRequest,
    EpochResponse,
    GroupState,
    HandOff,
    IsrChangeFailed,
    ReplicateAck,
    Reply,
    ResignRequested,
    Send,
    SendEntries,
    StartFarHorizon,
)
from replog.reassignment import min_isr_for, min_isr_met
from replog.replica_state import Peer, PendingAppend, ReplicaState, Resign
from replog.retirement import released


class LeaderRules(ReplicaState):
    """What a replica does while it leads an epoch (``self._ls`` is set exactly then)."""

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
        p = PendingAppend(ev.request_id, first, ev.count, self._now + cfg.append_timeout_ms)
        if ev.ack is Ack.NONE:
            self._out.append(Reply(ev.request_id, first, ev.count))
        elif ev.ack is Ack.APPEND:
            ls.wait_append.append(p)
        else:
            ls.wait_applied.append(p)
        # The wait queues are bounded by the unapplied entries (which the checks above bound): each waiting
        # append's last entry is unapplied (unflushed, for ack=append) and no two share one.
        assert len(ls.wait_append) + len(ls.wait_applied) <= self.log_end - 1 - self.apply_offset, (
            len(ls.wait_append), len(ls.wait_applied), self.log_end, self.apply_offset)
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
        # (a member a reassignment removed meanwhile is not added: the CAS was computed from an older znode and
        # will fail)
        return ls.isr + tuple(r for r in ls.pending_change.isr if r not in ls.isr and r in ls.peers)

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
        # entries (the candidate waits for it) but is not electable yet, so it adds no durability. During a
        # reassignment it is the joint rule of replog.reassignment (no entry needs the vote of a replica whose
        # data the end of the plan deletes).
        if not self._min_isr_met(ls.isr):
            return
        if ls.elr or ls.retired:
            # An ELR member is electable because it holds every applied entry: applying more first would
            # break that promise. The leader's first CAS empties the ELR (_maybe_change_isr). Likewise a copy
            # the last plan retired may be taken back until the kept replicas reconfirm (replog.retirement).
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
        """How long follower ``r`` has not been known to hold everything (0 if it holds all).

        It held everything until the oldest entry it lacks was appended, and was last known alive when it
        last acknowledged: the lag runs from the earlier of the two. A follower that died holding the whole log
        of a quiet group therefore lags from its last word, not from the first entry after its death, so every
        group it followed drops it within ``max_time_lag_ms`` of its death, not that long after each group's next
        append (which stalled ``applied`` appends group after group).
        """
        ls = self._ls
        assert ls is not None
        p = ls.peers[r]
        first_missing = p.held + 1 if p.reconciled else 0
        if first_missing >= self.log_end:
            return 0
        k = bisect_right(ls.batch_ends, first_missing)
        if k >= len(ls.batch_ends):
            return 0
        return self._now - min(ls.batch_times[k], p.last_heard_ms)

    def _on_ack(self, m: ReplicateAck) -> None:
        ls = self._ls
        if ls is None or m.epoch != self.epoch:
            return
        if m.src not in ls.peers or m.incarnation != (_recorded(ls.storage, m.src) or 0):
            if m.reset:  # (a new replica's, sent before the znode listing it or recording its storage reached
                ls.early_resets[m.src] = m  # us: taken once one does, _adopt_znode)
            return  # from a storage the znode does not record (lost and replaced, or not registered yet)
        assert m.held < self.log_end and m.log_end <= self.log_end, (
            f"{m.src} acks {m.held}/{m.log_end} beyond leader log end {self.log_end} in epoch {self.epoch}"
        )
        p = ls.peers[m.src]
        p.last_heard_ms = self._now
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
            if self._min_isr_met(keep):
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
        for r, *_log in ls.unsure:
            p = ls.peers.get(r, Peer())
            if r in ls.isr and p.reconciled and p.held + 1 >= self.log_end:
                # An unsure member holding this leader's whole log holds every applied entry: no more doubt
                # (replog.eligibility). (Its acks count meanwhile: they come from its new incarnation.)
                self._propose(ls.isr, ls.osr, vouch=r)
                return
        if ls.elr:
            self._propose(ls.isr, ls.osr)  # empties the ELR (every proposal does), so applying may go on

    def _propose(self, isr: tuple[str, ...], osr: tuple[str, ...], vouch: str | None = None) -> None:
        """One ISR compare-and-set; the state it proposes has an empty ELR: this leader's ISR now carries
        every applied entry. ``vouch``: an unsure member whose record it drops (it holds the whole log)."""
        ls = self._ls
        assert ls is not None and self.node_id in isr
        new = released(GroupState(self.node_id, self.epoch, isr, osr, ls.version + 1, self.session,
                                  storage=ls.storage, adding=ls.adding, removing=ls.removing, retired=ls.retired,
                                  reconfirming=ls.reconfirming,  # (moving the last unconfirmed one out releases)
                                  unsure=tuple(r for r in ls.unsure if r[0] != vouch)))
        ls.pending_change = new
        self._out.append(ChangeIsr(ls.version, new))

    def _min_isr_met(self, isr: tuple[str, ...]) -> bool:
        """The ISR ``isr`` is enough to apply (replog.reassignment's joint rule; ``|ISR| >= min-ISR`` without a
        reassignment)."""
        ls = self._ls
        assert ls is not None
        return min_isr_met(isr, ls.isr + ls.osr, ls.adding, ls.removing, self.config)

    @property
    def min_isr(self) -> int:
        """The min-ISR of the replicas this group will have (the target of a reassignment in progress); the
        module's option otherwise (a replica that does not lead does not know its group's size)."""
        ls = self._ls
        if ls is None:
            return self.config.effective_min_isr
        return min_isr_for(self.config, sum(r not in ls.removing for r in ls.isr + ls.osr))

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

    def _leader_next_tick(self) -> int | None:
        """See :meth:`Replica.next_tick_ms`: only a quiescent leader has a tick to wait for, its heartbeats.

        Quiescent: every follower in sync, holding and acknowledging all of the
        log, nothing applied left to announce, nobody waiting, no ISR change or
        hand-off under way. Then the ISR rules, resends, far-horizon offers and
        append deadlines have nothing to act on until an event arrives, and a
        tick only sends heartbeats (None: no follower to beat). Any other state answers "now" (the
        driver's cadence).
        """
        ls = self._ls
        assert ls is not None
        end = self.log_end
        if (not self.session_ok or ls.wait_append or ls.wait_applied or ls.resign is not None
                or ls.pending_change is not None or ls.stalled or ls.osr or ls.elr or ls.unsure
                or self.apply_offset != end - 1
                or self.flushed_end != end):
            return self._now
        due = None
        for p in ls.peers.values():
            if (not p.reconciled or p.far or p.next != end or p.acked_end != end or p.held != end - 1
                    or p.sent_apply != self.apply_offset):
                return self._now
            beat = p.last_send_ms + self.config.heartbeat_interval_ms
            due = beat if due is None else min(due, beat)
        return due

    def _adopt_znode(self, st: GroupState) -> None:
        ls = self._ls
        assert ls is not None and st.epoch == self.epoch and st.leader == self.node_id
        ls.isr, ls.osr, ls.version, ls.elr = st.isr, st.osr, st.version, st.elr
        ls.adding, ls.removing, ls.retired, ls.reconfirming = st.adding, st.removing, st.retired, st.reconfirming
        ls.unsure = st.unsure
        assert self.node_id in ls.isr, f"leader {self.node_id} removed from its own ISR {st.isr}"
        for r in [r for r in ls.peers if r not in st.replicas]:
            del ls.peers[r]  # removed by a reassignment: nothing more is sent to it, nothing it sends counts
        for r in st.replicas:
            if r != self.node_id and (r not in ls.peers or
                                      _recorded(ls.storage, r) != st.incarnation_of(r)):
                ls.peers[r] = Peer(last_progress_ms=self._now, last_heard_ms=self._now)  # new, or another storage: it knows nothing yet
        ls.storage = st.storage
        self._advance_apply()
        # A reset ack that came before the record of its storage, now recorded: taken as if it arrived now
        # (a new follower would otherwise re-send it only after request_timeout_ms: a second's wait per added
        # replica of a reassignment).
        for r, ack in list(ls.early_resets.items()):
            if r not in ls.peers or _recorded(ls.storage, r) == ack.incarnation:
                del ls.early_resets[r]
                if r in ls.peers:
                    self._on_ack(ack)

    # ---------------------------------------------------------------------- coordinated hand-off

    def _on_resign_requested(self, ev: ResignRequested) -> None:
        ls = self._ls
        if ls is None or not self.session_ok or ev.epoch != self.epoch:
            return  # stale: leadership changed since the conductor asked (or we never had it)
        joining = ls.pending_change is not None and ev.to in ls.pending_change.isr
        if ev.to == self.node_id or (ev.to not in ls.isr and not joining):
            return  # only an in-sync replica can take over without losing applied entries
        # (one this leader's CAS in flight admits counts: the conductor asked after reading that CAS's znode, and
        # is not told again; _maybe_hand_off waits for the CAS and gives up if it failed. Sim seed 14013316.)
        if ls.resign is not None and ls.resign.to == ev.to:
            return  # a repeated notification keeps the original deadline
        if ls.resign is not None and ls.pending_change is not None and ls.pending_change.epoch > self.epoch:
            return  # the hand-off CAS to the first successor is in flight; its outcome decides
        ls.resign = Resign(ev.to, ev.to_session, self._now + self.config.append_timeout_ms)
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
        new = GroupState(rs.to, self.epoch + 1, ls.isr, ls.osr, ls.version + 1, rs.to_session,
                         storage=ls.storage, adding=ls.adding, removing=ls.removing, retired=ls.retired,
                         reconfirming=ls.reconfirming,  # (the successor holds the whole log: no doubt about it)
                         unsure=tuple(r for r in ls.unsure if r[0] != rs.to))
        ls.pending_change = new
        self._out.append(HandOff(ls.version, new))

    def _caught_up(self, successor: Peer) -> bool:
        """Everything this leader appended is applied and durably held by the successor."""
        end = self.log_end
        return self.apply_offset == end - 1 and successor.reconciled and successor.held >= end - 1

    def _timeout_error(self) -> StalledGroup | Backpressure:
        ls = self._ls
        assert ls is not None
        if ls.stalled or not self._min_isr_met(ls.isr):
            # Stalled by a laggard we may not remove, or handed an ISR already below min-ISR
            # (the controller drops a dead leader from the ISR): either way nothing can apply.
            healthy = [r for r in ls.isr
                       if r == self.node_id or self._lag_ms(r) <= self.config.max_time_lag_ms]
            return StalledGroup(self.group, healthy, self.min_isr)
        return Backpressure(self.group, f"append waited replication.depot.append.timeout.millis="
                                        f"{self.config.append_timeout_ms} for replication")

    def _pump_all(self) -> None:
        ls = self._ls
        assert ls is not None
        for r, p in ls.peers.items():
            self._pump(r, p)

    def _pump(self, r: str, p: Peer) -> None:
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
            far = p.acked_end < self.log_start or (r in ls.osr and lag > near and skip > near)
            if far and not ls.elr:  # (a checkpoint would cut an ELR member's log: offered once the ELR is empty)
                if not p.far or now - p.far_since_ms >= cfg.far_horizon_retry_ms:
                    p.far = True
                    p.far_since_ms = now
                    self._out.append(StartFarHorizon(r, self.epoch, self.apply_offset))
            elif not far:
                p.far = False
            if not far:
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
        # A follower that has not reconciled in this epoch (new storage, or a new leadership) ignores apply
        # offsets: it gets a beat (which tells it the epoch and the leader) per heartbeat interval, not one per
        # apply-offset advance, which only queue up for it in the transport (campaign seed 2016).
        if (p.reconciled and p.sent_apply < self.apply_offset) or now - p.last_send_ms >= cfg.heartbeat_interval_ms:
            start = p.next if p.reconciled else self.log_end
            self._out.append(SendEntries(r, self.epoch, start, start, self.apply_offset))
            p.sent_apply = self.apply_offset
            p.last_send_ms = now


def _recorded(storage: tuple[tuple[str, int, int], ...], node: str) -> int | None:
    """The incarnation ``storage`` records for ``node`` (as GroupState.incarnation_of)."""
    return next((inc for name, inc, _session in storage if name == node), None)
