"""The conductor's reassignment executor: moves task groups to the replicas a stored plan names.

A plan (``conductor.metastore.plans``; made by `conductor scale`,
`replace-node` and `decommission`, ``conductor.cli_scale``) names each moved
group's target replicas. The active conductor runs :meth:`PlanExecutor.run`
after every reconcile and, while a plan is in progress, every half second and
after every change of a group znode (``Conductor._on_group_changed``: a step
that waits for a leader's ISR join, or for the last group's completion, is
taken at once, not a poll later).
Each pass reads the plan and the group znodes and asks :func:`group_step`,
which composes ``replog.reassignment``'s pure steps (Kafka's KIP-455 order):

1. start: the znode lists target plus original, the added replicas in the
   OSR; their workers open them empty and they catch up (far-horizon copy,
   near-horizon replay) until the leader admits them to the ISR;
2. a leader being removed hands leadership to an in-sync target replica (a
   resign request: the coordinated hand-off, no accepted append fails);
3. complete: the removed replicas leave the znode and stop; the copies of
   those that were in sync are *retired* (``replog/retirement.py``), kept
   until the replicas the plan kept record their storage again after that
   write (nothing is applied meanwhile), then deleted (released); if those
   turn out to have lost their storage instead, the retired copies are taken
   back as members and the group's plan starts again from there.

Every write is a versioned compare-and-set of the group znode (a lost race is
re-decided on the next pass), and nothing is kept in memory between passes:
a standby conductor that takes over after a failover resumes the plan from
ZooKeeper. At most ``plan.concurrency`` groups are reassigning at once (each
copies a replica). Once every group reached its target, the module spec gets
the plan's replication factor and worker count and the plan is deleted in one
transaction; leaders are then rebalanced. A cancelled plan rolls back the
groups that have not completed (``cancel_reassignment``) and leaves the spec.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from conductor.metastore import GroupNotFound, GroupState, Metastore, ModuleNotFound, VersionConflict
from conductor.metastore.plans import PlanChanged, ReassignmentPlan
from conductor.ui.metrics import ConductorMetrics
from replog.reassignment import (
    Step,
    advance_reassignment,
    cancel_reassignment,
    settle_retired,
    start_reassignment,
)

log = logging.getLogger("millrace.conductor")

#: a resign request of a plan not served within this long is asked again
RESIGN_RETRY_S = 15.0


def group_step(state: GroupState, target: Sequence[str], live: Mapping[str, int], cancel: bool) -> Step | None:
    """The next step of one group of a plan (None: this group is done).

    A group whose replicas already are the target (in any order) is done once
    the copies its last step retired are released; one reassigning towards
    another target (not this plan's) waits.
    """
    if state.retired:
        return settle_retired(state)
    if cancel:
        return cancel_reassignment(state, live) if state.reassigning else None
    if not state.reassigning:
        if set(state.replicas) == set(target):
            return None
        return Step(new=start_reassignment(state, target))
    if set(state.target) != set(target):
        return Step(waiting=f"a reassignment to {list(state.target)} is in progress (not this plan's)")
    return advance_reassignment(state, live)


@dataclass(frozen=True)
class GroupProgress:
    """Where one group of a plan is: ``phase`` is done, queued, copying (added replicas catching up),
    handing-off, releasing (its retired copies), or waiting; ``detail`` says why it waits."""

    group: int
    phase: str
    detail: str = ""


def plan_progress(plan: ReassignmentPlan, groups: Mapping[int, tuple[GroupState, int]],
                  live: Mapping[str, int]) -> list[GroupProgress]:
    """Every planned group's progress (what the CLI shows while a plan runs)."""
    out = []
    for g, target in sorted(plan.targets.items()):
        st = groups[g][0] if g in groups else None
        step = None if st is None else group_step(st, target, live, plan.cancel)
        if st is None or step is None:
            out.append(GroupProgress(g, "done"))
        elif st.retired:
            out.append(GroupProgress(g, "releasing", step.waiting or "releasing or taking back the retired copies"))
        elif step.new is not None and not st.reassigning:
            out.append(GroupProgress(g, "queued"))
        elif step.resign_to is not None:
            out.append(GroupProgress(g, "handing-off", f"leader {st.leader} -> {step.resign_to}"))
        elif step.waiting is not None and any(r not in st.isr for r in st.target):
            out.append(GroupProgress(g, "copying", f"{[r for r in st.target if r not in st.isr]} catching up"))
        else:
            out.append(GroupProgress(g, "waiting" if step.waiting else "completing", step.waiting or ""))
    return out


class PlanExecutor:
    """Executes every module's plan, one step per group per pass (the active conductor's; see module docstring).

    ``balance(module)`` rebalances a module's leaders once its plan is done.
    """

    def __init__(self, ms: Metastore, balance: Callable[[str], object],
                 metrics: ConductorMetrics | None = None) -> None:
        self.ms = ms
        self._balance = balance
        #: told each step written and each plan finished (the conductor's /metrics)
        self._metrics = metrics

    def run(self) -> bool:
        """One pass over every plan; True while some plan is still in progress (look again soon)."""
        modules = self.ms.plans.modules()
        if not modules:
            return False
        live = self.ms.nodes.sessions()
        active = False
        for module in modules:
            try:
                active |= self._advance(module, live)
            except ModuleNotFound:
                self.ms.plans.delete(module)  # destroyed while it was being reassigned
                log.warning("reassignment of %s dropped: the module is gone", module)
            except PlanChanged:
                active = True  # cancelled (or the spec changed) meanwhile: the next pass re-reads
        return active

    def _advance(self, module: str, live: Mapping[str, int]) -> bool:
        found = self.ms.plans.get(module)
        if found is None:
            return False
        plan, plan_version = found
        groups = self.ms.groups.all(module)
        in_flight = sum(st.reassigning for st, _ in groups.values())
        pending = 0
        for g, target in sorted(plan.targets.items()):
            if g not in groups:
                continue
            st, version = groups[g]
            step = group_step(st, target, live, plan.cancel)
            if step is None:
                continue
            pending += 1
            if step.new is not None and not st.reassigning:
                if in_flight >= plan.concurrency:
                    continue  # queued: throttled to plan.concurrency copies at once
                in_flight += 1
            self._perform(module, g, st, version, step, live)
        if pending:
            return True
        spec, spec_version = self.ms.modules.get(module)
        new_spec = None if plan.cancel else plan.spec_after(spec)
        self.ms.plans.finish(module, plan_version, (new_spec, spec_version) if new_spec != spec and new_spec
                             else None)
        if self._metrics is not None:
            self._metrics.reassignment_done(module, plan.cancel)
        if plan.cancel:
            log.warning("reassignment of %s cancelled: every group not completed is back on its original "
                        "replicas", module)
        else:
            log.warning("reassignment of %s (%s) complete: %d group(s) on their target replicas, RF %d on %d "
                        "workers", module, plan.kind, len(plan.targets), (new_spec or spec).replication_factor,
                        (new_spec or spec).workers)
        self._balance(module)
        return False

    def _perform(self, module: str, g: int, st: GroupState, version: int, step: Step,
                 live: Mapping[str, int]) -> None:
        if step.new is not None:
            try:
                self.ms.groups.cas(module, g, step.new, version)
            except (VersionConflict, GroupNotFound):
                return  # re-decided on the next pass from what is there
            what, kind = _describe(st, step.new)
            if self._metrics is not None:
                self._metrics.reassignment_step(module, kind)
            log.warning("reassignment of %s/%d %s (epoch %d, ISR %s)", module, g, what, step.new.epoch,
                        list(step.new.isr))
        elif step.resign_to is not None:
            request = self.ms.resigns.get(module, g)
            if (request is not None and request.get("epoch") == st.epoch and request.get("to") == step.resign_to
                    and time.time() - float(request.get("requested", 0)) < RESIGN_RETRY_S):
                return  # asked already; the leader hands off once its successor holds everything
            self.ms.resigns.request(module, g, step.resign_to, st.epoch, live[step.resign_to])
            if self._metrics is not None:
                self._metrics.reassignment_step(module, "hand_off")
            log.warning("reassignment of %s/%d: asked %s (being removed) to hand leadership to %s", module, g,
                        st.leader, step.resign_to)


def _describe(old: GroupState, new: GroupState) -> tuple[str, str]:
    """What a plan's write ``old`` -> ``new`` did, and its step's metric label."""
    if new.reassigning:
        return f"started: adding {list(new.adding)}, removing {list(new.removing)}", "start"
    if old.retired and set(new.replicas) != set(old.replicas):
        return (f"took back the retired copies of {[r[0] for r in old.retired]}: a replica it kept lost its storage "
                f"(replicas {list(new.replicas)}; the plan starts again)", "take_back")
    if old.retired:
        return f"released the retired copies of {[r[0] for r in old.retired]}", "release"
    retired = f"; retired copies {[r[0] for r in new.retired]} kept until they reconfirm" if new.retired else ""
    return f"done: replicas {list(new.replicas)}{retired}", "complete"
