"""The conductor's reassignments in the simulator: plans started, advanced and cancelled (the nemesis that starts
them at random is `_schedule_membership` in sim.py).

It plays the conductor's role with the pure functions of
:mod:`replog.reassignment` and versioned compare-and-sets on the simulated
group znode (a write computed from one version lands only if the znode is
still at it; otherwise the next round reads again), and asks leaders to hand
off with resign requests, as the conductor's balancer does. On each write it
checks what a removal promises: every target replica is in the ISR and holds
every applied entry durably, so the group has its new replication factor
before any copy is deleted. The write that ends a plan retires the copies it
drops (replog.retirement); the loop goes on until they are released, or taken
back, after which it starts the plan again towards the same target.

:class:`PlanRules` names the functions the simulator calls, so a mutant
(``tests/sim/mutants.py``) can break one rule without a switch in the product.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from replog.messages import GroupState
from replog.reassignment import (
    ReassignmentRefused,
    Step,
    advance_reassignment,
    cancel_reassignment,
    start_reassignment,
)

if TYPE_CHECKING:
    from tests.sim.sim import Sim


class PlanRules:
    """The reassignment rules the simulated conductor runs (those of replog.reassignment)."""

    @staticmethod
    def start(state: GroupState, target: Sequence[str]) -> GroupState:
        return start_reassignment(state, target)

    @staticmethod
    def advance(state: GroupState, live: dict[str, int], order: Sequence[str]) -> Step:
        return advance_reassignment(state, live, order)

    @staticmethod
    def cancel(state: GroupState, live: dict[str, int], order: Sequence[str]) -> Step:
        return cancel_reassignment(state, live, order)


class Reassigner:
    """The conductor's reassignment loop over one simulated group.

    ``start`` begins a plan; every ``period_ms`` the loop advances the plan in
    progress (or cancels it, if it was told to) by one step, until it is done.
    """

    def __init__(self, sim: Sim, rng: random.Random, rules: type[PlanRules] = PlanRules,
                 period_ms: tuple[int, int] = (10, 40)) -> None:
        self.sim = sim
        self.rng = rng
        self.rules = rules
        self.period_ms = period_ms
        self.cancelling = False
        self.started = self.completed = self.cancelled = self.taken_back = 0
        self.target: tuple[str, ...] = ()  #: the target of the last plan started
        self._looping = False
        self._asked: tuple[str, int, int] | None = None  #: the last hand-off asked for: (to, epoch, when)

    def start(self, target: Sequence[str], cancel: bool = False) -> bool:
        """Start a plan towards ``target`` (False if one is in progress or nothing would change)."""
        sim = self.sim
        try:
            new = self.rules.start(sim.znode, target)
        except ReassignmentRefused:
            return False
        sim.note(f"reassign {sim.znode.replicas} -> {tuple(target)}" + (" (to be cancelled)" if cancel else ""))
        self.target = tuple(target)
        self._write_later(new, "start")
        self.cancelling = cancel
        self._loop_later()
        return True

    def cancel(self) -> None:
        """From now on the plan in progress is rolled back instead of completed."""
        self.cancelling = True
        self._loop_later()

    def _loop_later(self) -> None:
        if not self._looping:
            self._looping = True
            self.sim.at(self.sim.now + self.rng.randint(*self.period_ms), self._round)

    def _round(self) -> None:
        self._looping = False
        sim = self.sim
        z = sim.znode
        if not z.reassigning and not z.retired:
            self.cancelling = False
            return
        live = {m: n.session for m, n in sim.nodes.items() if n.alive and n.session_live}
        order = list(z.replicas)
        self.rng.shuffle(order)
        step = (self.rules.cancel if self.cancelling else self.rules.advance)(z, live, order)
        if step.new is not None:
            self._write_later(step.new, "cancel" if self.cancelling else "advance")
        elif step.resign_to is not None and z.leader is not None:
            asked = self._asked
            # (a leader that could not hand off in time gives up; the conductor asks again)
            if (asked is None or asked[:2] != (step.resign_to, z.epoch)
                    or sim.now - asked[2] > sim.config.append_timeout_ms):
                self._asked = (step.resign_to, z.epoch, sim.now)
                sim.request_resign(step.resign_to)
        self._loop_later()

    def _write_later(self, new: GroupState, why: str) -> None:
        lo, hi = self.sim.metastore_ms
        self.sim.at(self.sim.now + self.rng.randint(lo, hi), self._cas, new, why)

    def _cas(self, new: GroupState, why: str) -> None:
        """The conductor's versioned compare-and-set: lands only on the version it was computed from."""
        sim = self.sim
        z = sim.znode
        if z.version != new.version - 1:
            return  # a conflict: the next round reads the znode again
        if z.reassigning and not new.reassigning:
            self._check_completion(z, new, why)
            if why == "cancel":
                self.cancelled += 1
            else:
                self.completed += 1
        elif new.reassigning and not z.reassigning:
            self.started += 1
        taken_back = z.retired and not new.retired and set(new.replicas) != set(z.replicas)
        sim._write_znode(new)
        if taken_back:
            # The retired copies are members again: the plan (not a cancelled one) is started anew, as the
            # conductor's PlanExecutor does from its stored plan.
            self.taken_back += 1
            sim.note(f"retired copies {[r[0] for r in z.retired]} taken back")
            if not self.cancelling and self.target:
                self.start(self.target)
        if new.reassigning or new.retired:
            self._loop_later()

    def _check_completion(self, old: GroupState, new: GroupState, why: str) -> None:
        """A plan ends: the replicas it keeps are all in sync and hold every applied entry; none leads if removed."""
        sim = self.sim
        keep = old.original if why == "cancel" else old.target
        if set(new.replicas) != set(keep):
            sim.fail(f"the {why} of a reassignment left replicas {new.replicas}, expected {keep}")
        if old.leader is not None and old.leader not in keep:
            sim.fail(f"the {why} of a reassignment removed its leader {old.leader}: {old} -> {new}")
        if why == "cancel":
            return
        behind = [m for m in keep if m not in new.isr]
        if behind:
            sim.fail(f"a reassignment completed with target replica(s) {behind} out of sync ({old} -> {new}): "
                     f"the removed replicas' copies were still needed")
        for m in keep:
            if sim.intact(m):
                sim._check_holds_committed(sim.nodes[m], "is a target replica of a completed reassignment")
