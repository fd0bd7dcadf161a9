"""What a scale, a node replacement or a decommission asks for: the reassignment plans to store.

Each function reads the metastore once and returns plans (``conductor.metastore.plans``)
for the conductor's executor (``conductor.reassigning``); the targets come from
the pure rules in ``conductor.placement``. Nothing is written here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from conductor.metastore import Metastore, ModuleNotFound
from conductor.metastore.plans import ReassignmentPlan
from conductor.placement import replace_targets, scale_targets

#: groups reassigning at once by default (each copies a replica while writers go on)
DEFAULT_CONCURRENCY = 2


class PlanRefused(ValueError):
    """A scale or a replacement that cannot be planned (the message says why and what to do)."""


THREADS_REFUSED = ("changing --threads is not a reassignment: task t lives in task group t % threads, so a new "
                   "thread count moves every task's depot records and PStates to another group (a data "
                   "migration, not a copy of replicas), which Millrace does not do online; deploy the module "
                   "again with the new --threads, or keep {threads}")


def _load(ms: Metastore) -> Counter[str]:
    """Replicas per node over every deployed module."""
    load: Counter[str] = Counter()
    for module in ms.modules.names():
        try:
            for st, _ in ms.groups.all(module).values():
                load.update(st.replicas)
        except ModuleNotFound:
            continue
    return load


def scale_plan(ms: Metastore, module: str, workers: int | None = None, replication_factor: int | None = None,
               threads: int | None = None, concurrency: int = DEFAULT_CONCURRENCY) -> ReassignmentPlan:
    """The plan moving ``module`` to ``workers`` workers with ``replication_factor`` replicas per group.

    The module keeps the live workers it is on (as many as fit), then takes the
    least-loaded other live workers; the replicas move as little as
    possible (``placement.scale_targets``). PlanRefused when it cannot.
    """
    spec, _ = ms.modules.get(module)
    if threads is not None and threads != spec.threads:
        raise PlanRefused(THREADS_REFUSED.format(threads=spec.threads))
    rf = replication_factor or spec.replication_factor
    count = workers or max(spec.workers, rf)
    if count < rf:
        raise PlanRefused(f"replication factor {rf} needs at least {rf} workers (replicas of a group never share "
                          f"a worker); asked for {count}")
    live = set(ms.nodes.sessions())
    if count > len(live):
        raise PlanRefused(f"{count} workers asked for but only {len(live)} are live ({', '.join(sorted(live))}); "
                          "start more workers first")
    groups = {g: st for g, (st, _) in ms.groups.all(module).items()}
    reassigning = sorted(g for g, st in groups.items() if st.reassigning)
    if reassigning:
        raise PlanRefused(f"task groups {reassigning} of {module} are being reassigned already")
    used = Counter(r for st in groups.values() for r in st.replicas)
    load = _load(ms)
    nodes = sorted(live, key=lambda n: (-used[n], load[n], n))[:count]
    targets = scale_targets({g: st.replicas for g, st in groups.items()}, nodes, rf)
    moved = {g: tuple(t) for g, t in targets.items() if set(t) != set(groups[g].replicas)}
    plan = ReassignmentPlan("scale", moved, replication_factor=rf, workers=count, concurrency=concurrency)
    plan.spec_after(spec)  # (SpecError: a min-ISR option above the new factor, say)
    if not moved and plan.spec_after(spec) == spec:
        raise PlanRefused(f"{module} already runs RF {rf} on {count} workers: nothing to do")
    return plan


def replace_plans(ms: Metastore, node: str, kind: str, force: bool = False,
                  concurrency: int = DEFAULT_CONCURRENCY, candidates: Iterable[str] | None = None,
                  ) -> dict[str, ReassignmentPlan]:
    """Plans re-placing every replica ``node`` holds on the other live workers, by module.

    ``kind`` is ``replace-node`` (the node is gone: refused while it is live,
    unless ``force``) or ``decommission`` (a live node drained before it is
    stopped). ``candidates`` (default: every other live worker) are where
    replicas may go. PlanRefused when a module has a plan in progress or a
    group has nowhere to go.
    """
    sessions = ms.nodes.sessions()
    if kind == "replace-node" and node in sessions and not force:
        raise PlanRefused(f"{node} is live: `conductor decommission {node}` moves a live worker's replicas "
                          "away (or pass --force to replace it anyway)")
    pool = [n for n in (candidates if candidates is not None else sorted(sessions)) if n != node and n in sessions]
    load = _load(ms)
    plans: dict[str, ReassignmentPlan] = {}
    for module in ms.modules.names():
        try:
            groups = {g: st for g, (st, _) in ms.groups.all(module).items()}
        except ModuleNotFound:
            continue
        if not any(node in st.replicas for st in groups.values()):
            continue
        if ms.plans.get(module) is not None:
            raise PlanRefused(f"module {module} is being reassigned already: wait for it or cancel it "
                              f"(`conductor scale {module} --cancel`)")
        try:
            targets = replace_targets({g: st.replicas for g, st in groups.items()}, node, pool, load)
        except ValueError as e:
            raise PlanRefused(f"module {module}: {e}") from None
        for t in targets.values():
            load.update(t[-1:])
        plans[module] = ReassignmentPlan(kind, {g: tuple(t) for g, t in targets.items()}, concurrency=concurrency)
    if not plans:
        known = sorted(set(sessions) | set(load))
        raise PlanRefused(f"{node} holds no replica of any module; nodes holding replicas or live: "
                          f"{', '.join(known) or 'none'}")
    return plans
