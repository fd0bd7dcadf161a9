"""Deliberately broken replicas (and drivers): the simulator must catch each of them.

They live in test code (subclasses overriding one rule) so the product has no
switch that could turn a rule off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from replog.election import next_leadership
from replog.eligibility import StorageMarks, check_storage, unsure_of
from replog.messages import EpochResponse, GroupState, RecordStorage
from replog.reassignment import Step, advance_reassignment, cancel_reassignment, min_isr_for
from replog.replica import Replica
from tests.sim.membership import PlanRules
from tests.sim.sim import Node, Sim


class TruncateToHighWatermark(Replica):
    """Pre-KIP-101 Kafka: a follower cuts its log at the high watermark instead of asking by epoch."""

    def _truncation_point(self, found_epoch: int, leader_end: int) -> int:
        return min(self.apply_offset + 1, self.log_end)


class ApplyWithoutAllIsrAcks(Replica):
    """The leader applies once *some* follower holds an entry (a majority rule in an ISR protocol)."""

    def _apply_candidate(self) -> int | None:
        ls = self._ls
        assert ls is not None
        helds = [ls.peers[r].held for r in self._effective_isr()
                 if r != self.node_id and ls.peers[r].reconciled]
        return min(self.flushed_end - 1, max(helds, default=self.flushed_end - 1))


class SingleRoundEpochExchange(Replica):
    """KIP-101 without KIP-279: the follower truncates once and trusts the rest of its log."""

    def _on_epoch_response(self, m: EpochResponse) -> None:
        if (m.epoch != self.epoch or m.src != self.leader or self.reconciled
                or m.requested_epoch != self._requested_epoch):
            return
        trunc = self._truncation_point(m.found_epoch, m.end_offset)
        if trunc < self.log_end:
            self._truncate(trunc)
        self._finish_reconcile()


class HandOffWithoutCatchUp(Replica):
    """A resigning leader hands off at once, before its successor holds everything it appended."""

    def _caught_up(self, successor: object) -> bool:
        return True


class ReasksOnlyAfterTheTimeout(Replica):
    """A follower whose epoch question reached the new leader before it knew it leads waits out
    ``request_timeout_ms`` to ask again, instead of asking on the leader's first frame (the hand-off stall)."""

    def _reask_epoch_end(self) -> None:
        self._leader_heard = True


class DropsEarlyResetAcks(Replica):
    """A leader that drops a new replica's reset ack when it arrives before the znode recording its storage
    does, instead of taking it once that record arrives: the replica re-sends it only after
    ``request_timeout_ms`` (each replica a reassignment adds waited a second for its checkpoint offer)."""

    def _adopt_znode(self, st: GroupState) -> None:
        if self._ls is not None:
            self._ls.early_resets.clear()
        super()._adopt_znode(st)


class ElectsEmptiedReplica(Replica):
    """A replica whose storage lost what it acknowledged records its new storage but stays in the ISR
    (no KIP-966 eligibility): an emptied replica remains electable."""

    def _propose_storage(self, st: GroupState) -> None:
        me = self.node_id
        assert self.incarnation is not None
        if (self._recording is not None or not self.session_ok
                or (st.incarnation_of(me), st.storage_session(me)) == (self.incarnation, self.session)):
            return
        self._recording = replace(st, version=st.version + 1, storage=st.with_storage(me, self.incarnation, self.session))
        self._recording_ms = self._now
        self._out.append(RecordStorage(st.version, self._recording))


class AppliesWhileElrHoldsBack(Replica):
    """A new leader applies before its CAS empties the ELR: a deposed leader still electable may lack what
    it applies, so electing it would lose applied entries."""

    def _advance_apply(self) -> None:
        ls = self._ls
        assert ls is not None
        elr, ls.elr = ls.elr, ()
        try:
            super()._advance_apply()
        finally:
            ls.elr = elr


class ForgetsAppliedFloor(Replica):
    """A replica ignores its storage's applied floor: after a crash it re-applies only what the commit rule
    allows, so a leader below min-ISR serves less than it acknowledged as applied (campaign seed 504)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["applied_floor"] = -1
        super().__init__(*args, **kwargs)


# ------------------------------------------------------------------------------------------------ membership


class ApplyWithoutAddedReplicaAcks(Replica):
    """The leader keeps waiting only for the original replicas: an added replica that joined the ISR is
    electable, yet entries are applied without its acknowledgement."""

    def _effective_isr(self) -> tuple[str, ...]:
        ls = self._ls
        assert ls is not None
        return tuple(r for r in super()._effective_isr() if r not in ls.adding)


class CountsRemovingTowardMinIsr(Replica):
    """min-ISR counted over the whole ISR during a reassignment (no joint rule): an entry may be applied that
    only the acknowledgement of a replica whose data the end of the plan deletes made count."""

    def _min_isr_met(self, isr: tuple[str, ...]) -> bool:
        ls = self._ls
        assert ls is not None
        replicas = ls.isr + ls.osr
        target = sum(r not in ls.removing for r in replicas)
        original = sum(r not in ls.adding for r in replicas)
        return len(isr) >= min(min_isr_for(self.config, target), min_isr_for(self.config, original))


class CompleteBeforeCaughtUp(PlanRules):
    """The conductor completes a reassignment as soon as leadership is off the removed replicas, without
    waiting for the added ones to join the ISR: the group runs below its new replication factor, and the
    removed replicas' data, deleted, was still needed."""

    @staticmethod
    def advance(state: GroupState, live: dict[str, int], order: Sequence[str]) -> Step:
        if not state.reassigning or state.leader in state.removing or not set(state.isr) & set(state.target):
            return advance_reassignment(state, live, order)
        return Step(new=replace(state, version=state.version + 1, placement=state.target,
                                isr=tuple(r for r in state.isr if r in state.target),
                                osr=tuple(r for r in state.osr if r in state.target),
                                elr=tuple(r for r in state.elr if r in state.target),
                                storage=tuple(x for x in state.storage if x[0] in state.target),
                                adding=(), removing=()))


class DeletesAtCompletion(PlanRules):
    """The conductor ends a plan by deleting the copies it drops instead of retiring them (the rule before
    replog.retirement): a plan completing on a replica that just found damage, not yet recorded, deletes the
    last intact copies."""

    @staticmethod
    def advance(state: GroupState, live: dict[str, int], order: Sequence[str]) -> Step:
        return _without_retiring(advance_reassignment(state, live, order))

    @staticmethod
    def cancel(state: GroupState, live: dict[str, int], order: Sequence[str]) -> Step:
        return _without_retiring(cancel_reassignment(state, live, order))


def _without_retiring(step: Step) -> Step:
    if step.new is None or not step.new.retired:
        return step
    return Step(new=replace(step.new, retired=(), reconfirming=()))


class AppliesWhileCopiesRetired(Replica):
    """A leader applies while the last plan's copies are retired: a copy taken back then lacks what it applied."""

    def _advance_apply(self) -> None:
        ls = self._ls
        assert ls is not None
        retired, ls.retired = ls.retired, ()
        try:
            super()._advance_apply()
        finally:
            ls.retired = retired


def ignores_page_cache_rule(marks: StorageMarks | None, *, log_end: int, applied: int, boot: int = 0) -> str | None:
    """replication.fsync=interval without KIP-966's unclean-shutdown rule: a storage that acknowledged from the
    page cache and lost it with the machine's power is judged by its (equally stale) marks alone."""
    if marks is not None:
        marks = replace(marks, volatile=False)
    return check_storage(marks, log_end=log_end, applied=applied, boot=boot)


# ----------------------------------------------------------------------- driver: where the marks' fsync goes
# (issue 32: the storage marks' fsync left the path of every flush; docs/data-on-disk.md, "Why the mark claims
# the flush in flight", says what each write must say, and these are the two naive ways, as drivers)


class MarksBesideTheLog(Sim):
    """The marks fsynced in parallel with the replog, their acknowledged mark claiming the flush in flight: a crash
    before the replog's fsync finishes leaves a mark ahead of the log, so an intact storage counts as lost; a group
    whose last ISR member crashed so is left without an electable replica."""

    def _flush_later(self, n: Node) -> None:
        super()._flush_later(n)
        if not n.replica.config.acks_from_page_cache:
            n.disk.acked = n.disk.acked_synced = max(n.disk.acked, len(n.disk.entries) - 1)


class MarksTrailingTheLog(Sim):
    """The marks written beside the log's fsync without the claim (only the flushes reported before): a storage that
    lost the tail of its last acknowledged flush passes the open-time check as sure."""

    def _flush_later(self, n: Node) -> None:
        super()._flush_later(n)
        n.disk.claimed = -1


def trusts_the_driver(marks: StorageMarks | None, *, log_end: int, applied: int, boot: int = 0) -> str | None:
    """replog's own check, under another name: the simulator then judges its verdicts by their consequences
    only (it compares check_storage's verdicts with the storages it damaged)."""
    return check_storage(marks, log_end=log_end, applied=applied, boot=boot)


# ------------------------------------------------------------------- unsure storage (replog.eligibility, issue 32)


class ElectsUnsureAtOnce(Sim):
    """The controller elects an unsure ISR member like a sure one (no witnesses): a replica whose lying disk dropped
    the flush it had acknowledged, back first, leads without the applied entries it lost."""

    def _elect(self) -> None:
        self.electing = False
        live = {m: n.session for m, n in self.nodes.items() if n.alive and n.session_live}
        order = list(self.ids)
        self.rng.shuffle(order)
        z = self.znode
        new = next_leadership(replace(z, unsure=()), live, order=order)
        if new is not None:
            self._write_znode(replace(new, unsure=tuple(r for r in z.unsure if r[0] != new.leader)))
        if self.znode.leader is None:
            self._elect_later(20)


def up_to_date_without_waiting(state: GroupState, live: dict[str, int]) -> list[str] | None:
    """The most up-to-date of the unsure members registered so far, without waiting for the others (for
    ``replog.election.most_up_to_date``): the first back may be the one whose disk lost what it acknowledged."""
    ready = tuple(m for m in state.isr + state.elr
                  if m in live and state.storage_session(m) == live[m] and (unsure_of(state, m) or (0, 0, -1))[2] == state.epoch)
    if not ready or state.leader is not None:
        return None
    best = max(unsure_of(state, m)[:2] for m in ready)  # type: ignore[index]
    return [m for m in ready if unsure_of(state, m)[:2] == best]  # type: ignore[index]


class KeepsWhatAnUnsureFollowerAcked(Replica):
    """The leader keeps what it knew of a follower whose storage came back unsure (under a new incarnation): it counts
    that follower's old acknowledgement of an entry its disk has since dropped."""

    def _adopt_znode(self, st: GroupState) -> None:
        ls = self._ls
        assert ls is not None
        kept = dict(ls.peers)
        super()._adopt_znode(st)
        for r, *_log in st.unsure:
            if r in kept and r in ls.peers:
                ls.peers[r] = kept[r]
