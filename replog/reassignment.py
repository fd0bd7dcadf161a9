"""Changing a task group's replicas while it runs: the steps of a reassignment and the joint min-ISR (pure).

Modelled on Kafka's partition reassignment (KIP-455). The conductor asks these
functions what the group znode should become and writes the answer with a
versioned compare-and-set, as it does with :mod:`replog.election`; the
simulator (``tests/sim``) calls the same functions. Nothing here talks to
ZooKeeper.

A plan moves a group from its *original* replicas to a *target* list:

1. :func:`start_reassignment`: the replicas become target plus original; the
   znode records ``adding`` (target, not original) and ``removing``
   (original, not target). Added replicas start in the OSR: they hold
   nothing. Their workers open them; they follow the leader, catch up (near
   horizon replay, or a far-horizon checkpoint when what they lack is gone
   from the leader's log), and the leader admits each to the ISR by its usual
   rejoin rule (it holds the whole log, by a CAS).
2. :func:`advance_reassignment`, called again until it completes: it waits
   until every target replica is in the ISR (so the group has its new
   replication factor in sync before any copy is deleted); if the leader is
   being removed it names an in-sync target replica to hand leadership to
   (the leader's coordinated hand-off: nothing truncated, no accepted append
   fails) once every target replica is live with its storage confirmed
   (one that is down or restarting may have lost its disk without the znode
   knowing yet); then it drops the removing replicas from the replicas, the ISR,
   the OSR, the ELR and the storage records. Those replicas learn it from the
   znode and stop serving (the ``Removed`` action).
3. :func:`cancel_reassignment` instead goes back to the original replicas,
   dropping the added ones (after moving leadership off an added replica
   that leads), as long as an original replica is still in the ISR: an
   added replica's copy is then redundant, since every ISR member holds
   every applied entry.
4. The write that ends a plan either way *retires* the copies it drops from
   the ISR or ELR instead of deleting them (:mod:`replog.retirement`): they
   are deleted once the kept replicas recorded their storage again after
   that write, and taken back if those turn out to have lost it. Until then
   nothing is applied, no other plan starts, and :func:`settle_retired` (which
   advancing or cancelling returns) releases or takes them back.

**The joint min-ISR rule** (:func:`min_isr_met`). With the all-ISR apply rule
every ISR member, an added replica that joined or a replica being removed
alike, must hold an entry before it is applied: all of them are electable.
What changes during a plan is how many members are *enough*. An entry is
applied only while the ISR has at least

* ``min-ISR(original)`` members among the original replicas, and
* ``min(min-ISR(target), min-ISR(original))`` members among the target
  replicas,

where ``min-ISR(n)`` is the option if set (capped at ``n``), else ``n - 1``
and at least 1: the default follows the replica count, so a completed plan
runs with its target's. A removing replica's acknowledgement counts only
toward the original configuration's quorum, the one that keeps it; an added
replica's only toward the target's, the one that keeps it. Whichever way
the plan ends (completed: the target stays; cancelled: the original does),
each entry applied during it is held by at least what the surviving
configuration's own rule promised, and no entry needed the vote of a replica
whose data is then deleted. The target's quorum is the smaller of the two
min-ISRs so that growing the replication factor does not stall appends until
the first added replica has caught up (an added replica starts outside the
ISR); the target reaches its full strength at completion, which waits for
every target replica to be in sync. Outside a plan both sets are the
replicas and the rule is the usual ``|ISR| >= min-ISR``. The leader also
shrinks the ISR only to a set that still meets this rule (otherwise the
group stalls, as without a plan).

**Elections during a plan** (:mod:`replog.election`): an added replica is
electable once it is in the ISR (it then holds every applied entry); a
replica being removed is elected only when no other ISR member can lead (it
does hold every applied entry: leaving the group leaderless instead would
only stall it), and the plan then moves leadership off it before removing it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from replog.config import ReplicationConfig
from replog.eligibility import eligible
from replog.messages import GroupState, InvalidGroupState
from replog.retirement import released, retire, take_back, waiting_reason


class ReassignmentRefused(InvalidGroupState):
    """A plan that cannot start (another is in progress, an empty or duplicate target, nothing changes)."""


@dataclass(frozen=True, slots=True)
class Step:
    """The next step of a plan: exactly one of a znode to write, a hand-off to request, or why to wait.

    ``new`` is written with a compare-and-set from the version it was computed
    from (its own ``version`` minus one). ``resign_to`` asks the current leader
    to hand leadership to that in-sync replica (the resign znode); the plan is
    advanced again once it has. ``waiting`` says why nothing can be done yet.
    """

    new: GroupState | None = None
    resign_to: str | None = None
    waiting: str | None = None

    def __post_init__(self) -> None:
        assert sum(x is not None for x in (self.new, self.resign_to, self.waiting)) == 1, self


def min_isr_for(config: ReplicationConfig, replicas: int) -> int:
    """min-ISR of a configuration of ``replicas`` replicas: the option if set (at most ``replicas``), else
    ``replicas - 1`` and at least 1 (Rama's default, following the replica count, not the placed factor)."""
    if config.min_isr is not None:
        return max(1, min(config.min_isr, replicas))
    return max(1, replicas - 1)


def min_isr_met(isr: Iterable[str], replicas: Iterable[str], adding: Iterable[str], removing: Iterable[str],
                config: ReplicationConfig) -> bool:
    """The joint min-ISR rule (module docstring): may a leader whose ISR is ``isr`` apply?

    ``replicas`` is every replica of the group (target plus original during a plan).
    """
    members, add, rem = set(isr), set(adding), set(removing)
    everyone = list(replicas)
    target = [r for r in everyone if r not in rem]
    original = [r for r in everyone if r not in add]
    need_target, need_original = min_isr_for(config, len(target)), min_isr_for(config, len(original))
    in_target = sum(r in members for r in target)
    if not add and not rem:
        return in_target >= need_target
    in_original = sum(r in members for r in original)
    return in_original >= need_original and in_target >= min(need_target, need_original)


def required_min_isr(st: GroupState, config: ReplicationConfig) -> tuple[int, int]:
    """(copies needed on target replicas, copies needed on original replicas) for an entry applied under
    ``st`` (the simulator checks every ``applied`` acknowledgement against it)."""
    t, o = min_isr_for(config, len(st.target)), min_isr_for(config, len(st.original))
    return (min(t, o), o) if st.reassigning else (t, t)


def start_reassignment(state: GroupState, target: Sequence[str]) -> GroupState:
    """The znode starting a move from ``state``'s replicas to ``target`` (in preference order).

    The replicas become ``target`` followed by the removed ones; added
    replicas join the OSR (they hold nothing yet); leadership, epoch, ISR
    and storage records are unchanged. Raises :class:`ReassignmentRefused`
    if a plan is in progress (complete or cancel it first) or if ``target``
    is empty, repeats a node, or equals the current replicas.
    """
    if state.reassigning:
        raise ReassignmentRefused(f"a reassignment is in progress (adding {list(state.adding)}, removing "
                                  f"{list(state.removing)}): complete or cancel it first")
    if state.retired:
        raise ReassignmentRefused(f"the last plan's retired copies are still kept: {waiting_reason(state)}")
    target = tuple(target)
    if not target or len(set(target)) != len(target):
        raise ReassignmentRefused(f"a target needs distinct replicas, got {list(target)}")
    current = state.replicas
    if set(target) == set(current):
        raise ReassignmentRefused(f"the group already has the replicas {list(current)}")
    adding = tuple(r for r in target if r not in current)
    removing = tuple(r for r in current if r not in target)
    return replace(state, version=state.version + 1, placement=target + removing,
                   osr=state.osr + adding, adding=adding, removing=removing)


def advance_reassignment(state: GroupState, live_nodes: Mapping[str, int] | Iterable[str],
                         order: Sequence[str] = ()) -> Step:
    """The next step of the plan in progress: wait for the added replicas, move leadership, or complete.

    Completing drops the removing replicas (replicas, ISR, OSR, ELR, storage
    records) in one write that keeps the epoch: leadership did not change,
    and the removed replicas are fenced by no longer being replicas (the
    leader stops sending to them and ignores what they send). It requires
    every target replica in the ISR and a leader that is not being removed
    (a leaderless group may complete: its ISR keeps every target replica).
    ``order`` is the preference order for the new leader (default: the
    target's).
    """
    if not state.reassigning:
        return settle_retired(state) if state.retired else Step(waiting="no reassignment in progress")
    behind = [r for r in state.target if r not in state.isr]
    if behind:
        return Step(waiting=f"target replica(s) {behind} not in sync yet (catching up to join the ISR)")
    live = _live(live_nodes)
    unconfirmed = [r for r in state.target if r not in live or not eligible(state, r, live[r])]
    if unconfirmed:
        # An ISR member that is down, or restarted and has not confirmed its storage yet, may have lost its
        # disk without the znode knowing: removing the other copies now could delete the last intact one.
        return Step(waiting=f"target replica(s) {unconfirmed} not live with confirmed storage")
    if state.leader is not None and state.leader in state.removing:
        return _move_leadership(state, state.target, live_nodes, order)
    return Step(new=_keep_only(state, state.target))


def cancel_reassignment(state: GroupState, live_nodes: Mapping[str, int] | Iterable[str],
                        order: Sequence[str] = ()) -> Step:
    """The next step of cancelling the plan in progress: back to the original replicas.

    Waits while no original replica is in the ISR, live and confirmed (an
    added one may then hold the only intact copies of applied entries: the
    plan must complete instead, or an original catch up). Moves leadership off an added replica that
    leads first. The added replicas then learn they were removed and delete
    their data.
    """
    if not state.reassigning:
        return settle_retired(state) if state.retired else Step(waiting="no reassignment in progress")
    live = _live(live_nodes)
    if not any(r in state.isr and r in live and eligible(state, r, live[r]) for r in state.original):
        return Step(waiting=f"no original replica of {list(state.original)} is in sync, live and confirmed: "
                            f"cancelling now could drop the only intact copies of applied entries")
    if state.leader is not None and state.leader in state.adding:
        return _move_leadership(state, state.original, live_nodes, order)
    return Step(new=_keep_only(state, state.original))


def settle_retired(state: GroupState) -> Step:
    """The next step for the copies the last write of a plan retired (:mod:`replog.retirement`): release them once
    no ISR or ELR member is left to reconfirm (a leader moved it out), take them back if every ISR member lost its
    storage, else wait for the kept replicas to record their storage again."""
    assert state.retired, state
    if released(state) != state:
        return Step(new=replace(released(state), version=state.version + 1))
    back = take_back(state)
    return Step(new=back) if back is not None else Step(waiting=waiting_reason(state))


def _move_leadership(state: GroupState, pool: Sequence[str], live_nodes: Mapping[str, int] | Iterable[str],
                     order: Sequence[str]) -> Step:
    live = _live(live_nodes)
    for r in order or pool:
        if r in pool and r in state.isr and r in live and eligible(state, r, live[r]):
            return Step(resign_to=r)
    return Step(waiting=f"leader {state.leader} must hand off, but no in-sync replica of {list(pool)} is "
                        f"live and confirmed")


def _live(live_nodes: Mapping[str, int] | Iterable[str]) -> dict[str, int]:
    return dict(live_nodes) if isinstance(live_nodes, Mapping) else dict.fromkeys(live_nodes, 0)


def _keep_only(state: GroupState, keep: Sequence[str]) -> GroupState:
    """``state`` with only ``keep`` as replicas (preference order kept) and no plan; the copies it drops from the
    ISR or ELR retired (replog.retirement)."""
    kept = set(keep)
    new = replace(state, version=state.version + 1, placement=tuple(keep),
                  isr=tuple(r for r in state.isr if r in kept), osr=tuple(r for r in state.osr if r in kept),
                  elr=tuple(r for r in state.elr if r in kept),
                  storage=tuple(rec for rec in state.storage if rec[0] in kept), adding=(), removing=())
    assert new.leader is None or new.leader in kept, new
    return retire(state, new)
