"""Trim and retention entries (:func:`build_depot_trim`, :func:`build_retention_check`).

The leader builds them like any entry, on its task thread, so their reads see every entry appended before
them; a retention check planned off the task thread (:func:`plan_retention_check`) carries its decisions, and
each is written only if what it read is still so (:func:`pstate.retention.write_planned`). The rules are in
:mod:`pstate.retention` (where a partition may start) and :mod:`pstate.compaction` (which records key
compaction keeps). What is key compaction's key is the depot's partitioner's
(``hash_by(key_fn)``), from the group's build version.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from pstate import compaction, retention
from pstate.engine import Reader
from pstate.store import ChangeSetBuilder, TaskGroupStore
from topology.entries.requests import DepotTrim, RetentionCheck
from topology.stream import StreamRunner

log = logging.getLogger("millrace.node")


def build_depot_trim(store: TaskGroupStore, request: DepotTrim) -> tuple[ChangeSetBuilder, int]:
    """The trim entry and the partition's new start (a trim at or below the start writes nothing)."""
    store.depot(request.depot)  # DepotNotFound names the depots there are
    builder = store.changes()
    start = retention.trim(builder, request.depot, request.task, request.before, store.applied_reader())
    return builder, start


def build_retention_check(store: TaskGroupStore, runner: StreamRunner | None, request: RetentionCheck
                          ) -> tuple[ChangeSetBuilder | None, int]:
    """One check of every partition of the group's depots with a policy; None when it writes nothing."""
    builder = store.changes()
    applied = store.applied_reader()
    deleted = sum(retention.write_planned(builder, plan) for plan in request.planned if plan.depot in store.depots)
    per_partition = max(1, request.limit // max(1, len(request.tasks) * len(request.policies)))
    for depot, policy in sorted(request.policies.items()):
        if depot not in store.depots:
            continue
        key_of, tombstone = _compaction_key(runner, depot) if policy.compaction else (None, None)
        for task in request.tasks:
            deleted += retention.check(builder, depot, task, policy, request.now_ms, applied)
            if key_of is not None:
                deleted += compaction.compact(builder, depot, task, key_of, tombstone, request.now_ms,
                                              policy.delete_retention_ms, per_partition, applied)
    return (builder if len(builder) else None), deleted


def plan_retention_check(applied: Reader, depots: Collection[str], now_ms: int, tasks: Sequence[int],
                         policies: Mapping[str, retention.RetentionPolicy], limit: int) -> RetentionCheck | None:
    """The retention check to post to a leader, its reads done here, off the task thread, over ``applied`` (the
    leader's applied state): the marks and trims of depots bounded by age or size are decided here
    (:func:`pstate.retention.plan_check`), so the task thread only writes them; depots with key compaction are
    checked whole on the task thread (a round reads up to ``limit`` records). None: nothing to write."""
    planned = [plan for depot, policy in sorted(policies.items()) if depot in depots and not policy.compaction
               for task in tasks if (plan := retention.plan_check(applied, depot, task, policy, now_ms)) is not None]
    inline = {d: p for d, p in policies.items() if p.compaction}
    if not planned and not inline:
        return None
    return RetentionCheck(now_ms, tasks, inline, limit, planned)


_warned: set[str] = set()


def _compaction_key(runner: StreamRunner | None, depot: str
                    ) -> tuple[Callable[[Any], Any] | None, Callable[[Any], bool] | None]:
    decl = runner.definition.depots.get(depot) if runner is not None else None
    part = decl.partitioner if decl is not None else None
    if part is None or part.key is None:
        if depot not in _warned:
            _warned.add(depot)
            log.warning("depot %s has depot.compaction=1 but its partitioner has no key (use hash_by(key_fn)); "
                        "it is not compacted", depot)
        return None, None
    return part.key, part.tombstone
