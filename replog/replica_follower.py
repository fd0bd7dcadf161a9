"""The follower's rules of the replication state machine (see :mod:`replog.replica` for why they hold).

Reconciling the log with a new leader's by epoch (KIP-101/KIP-279: ask for the
end of the latest epoch, truncate, repeat until both agree, never below what
was applied), then appending what the leader sends, acknowledging what is
durable and applying up to the leader's apply offset.
"""

from __future__ import annotations

from replog.epochs import UNDEFINED_EPOCH
from replog.messages import (
    AppendLocal,
    EpochRequest,
    EpochResponse,
    Replicate,
    ReplicateAck,
    Role,
    Send,
    Truncate,
)
from replog.replica_state import ReplicaState


class FollowerRules(ReplicaState):
    """What a replica does while it follows the leader of its epoch."""

    def _request_epoch_end(self) -> None:
        latest = self.epochs.latest_epoch()
        assert latest is not None and self.leader is not None
        self._requested_epoch = latest
        self._request_sent_ms = self._now
        self._out.append(Send(EpochRequest(self.node_id, self.leader, self.epoch, latest)))

    def _reask_epoch_end(self) -> None:
        """The leader's first frame of the epoch: ask again a question sent before it (once per epoch).

        A replica learns of a new epoch from its own watch or CAS, often before
        the new leader does: a hand-off's CAS tells the resigning leader at once,
        the successor only through its watch. A question that arrives first is
        dropped (it names an epoch its addressee does not lead yet), and until
        the re-ask after ``request_timeout_ms`` the new leader applies nothing
        (its ISR includes this replica, not reconciled): a writer waited a whole
        second at every hand-off. The frame proves the leader knows its epoch
        now; a duplicate question is answered twice, the second answer ignored.
        """
        self._leader_heard = True
        if self._requested_epoch is not None:
            self._request_epoch_end()

    def _on_epoch_response(self, m: EpochResponse) -> None:
        if (self.role is not Role.FOLLOWER or m.epoch != self.epoch or m.src != self.leader
                or self.reconciled or m.requested_epoch != self._requested_epoch):
            return  # stale or duplicate
        self._leader_heard = True
        trunc = self._truncation_point(m.found_epoch, m.end_offset)
        assert trunc > self.applied_floor, (
            f"{self.node_id} would truncate applied entries: cut at {trunc}, applied {self.applied} "
            f"(ever: {self.applied_floor})"
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
        """Where this log must be cut given the leader's ``end_offset_for`` answer (KIP-101/279).

        Entries of the leader's own epoch came from it alone, so they are a
        prefix of its log: nothing to cut. Its answer about that epoch (its log
        end) may also be stale: a reply to the same question asked before a
        far-horizon install rebuilt this replica, and cutting there would drop
        applied entries (found by seed 5050635).
        """
        if found_epoch == self.epoch:
            return self.log_end
        if found_epoch == UNDEFINED_EPOCH:
            return min(leader_end, self.log_end)
        own_end = self.epochs.end_offset_for(found_epoch, self.log_end)[1]
        return min(leader_end, own_end, self.log_end)

    def _truncate(self, end: int) -> None:
        assert self.applied_floor < end <= self.log_end, (self.applied_floor, end, self.log_end)
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
        if reset:
            self._reset_ack_ms = self._now
        self._out.append(Send(ReplicateAck(self.node_id, self.leader, self.epoch, self.flushed_end - 1,
                                           self.log_end, reset, self.incarnation or 0)))

    def _on_replicate(self, m: Replicate) -> None:
        if m.epoch < self.epoch:
            return  # from a deposed leader
        if m.epoch > self.epoch:
            # Only the metastore creates epochs, so a newer one proves m.src leads it.
            self._become_follower(m.epoch, m.src)
            self._leader_heard = True
            return
        assert self.role is not Role.LEADER, f"{m.src} and {self.node_id} both lead epoch {m.epoch}"
        if self.role is Role.UNATTACHED and self.leader is None:
            self._become_follower(m.epoch, m.src)  # our epoch has a leader we had not heard of
            self._leader_heard = True
            return
        if self.role is not Role.FOLLOWER or not self.reconciled:
            if self.role is Role.FOLLOWER and m.src == self.leader and not self._leader_heard:
                self._reask_epoch_end()
            return
        assert m.src == self.leader, f"epoch {m.epoch} led by {self.leader} and {m.src}"
        n = len(m.entry_epochs)
        end = m.start + n
        if m.start > self.log_end:
            # A frame was lost: ask for a resend from our end, at most once per request timeout. Every reset
            # ack makes the leader resend its whole window from our end, and the frames past our end keep
            # coming until that resend arrives: the beats queued for us while we were down or rebuilding
            # (one per apply-offset advance), or the rest of a window. Answering each with a reset ack
            # made the leader resend the window once per frame: tens of seconds of duplicate windows on
            # both task threads before a restarted follower could rejoin (fault campaign seed 2016).
            if self._now - self._reset_ack_ms >= self.config.request_timeout_ms:
                self._send_ack(reset=True)
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
            if changed:
                # The epochs first: a kill right after the write keeps the entries (the page cache has them)
                # but would lose an epoch file written after them, and a log holding entries its epoch file
                # does not know cannot reconcile (`_become_follower`'s assertion failed at every restart of
                # the replica, campaign seed 2016 replayed). An epoch past the log end is cut at open.
                self._persist_epochs()
            self._out.append(AppendLocal(self.log_end, new, m.data, m.start))
            self.log_end = end
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

