"""Stream topologies: user functions run per depot record on task-group leaders.

Execution model (why it looks like this):

* Every task group's leader runs every stream topology over every record of the
  depots it subscribes to, and keeps only the PState changes for keys its own
  tasks own. The group that owns the record's partition (its *home*) runs the
  function while it builds the replog entry of the append itself, so the depot
  append and its colocated effects are one atomic entry: ``ack="applied"`` covers
  them and the function's return value is the append's ack value. Other groups
  read the applied records of partitions they do not own and run the same
  function for their keys, saving their read position in ``_meta`` in the same
  entry as the effects: a crash or failover never applies a record's effects
  twice or loses them.
* So work never moves between tasks as a pickled closure: what moves is the
  record (plain values), and the code is the module's, deployed on every node.
  ``ctx.update(counts, word, lambda n: (n or 0) + 1)`` runs on the group that owns
  ``word``, wherever the sentence was appended.
* The function must be deterministic given the record and the state it reads,
  and may read only keys owned by the group running it (a read of another
  group's key raises :class:`ForeignRead`, because the value would differ from
  run to run).
* A record's changes are buffered and written only if the function returns, so
  a failing record leaves nothing half-applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pstate import P
from pstate.path import Path, Transform
from pstate.store import ChangeSetBuilder
from topology.errors import ForeignRead, TopologyError
from topology.module import ModuleDefinition, TopologyDecl
from topology.partitioners import random as random_partitioner
from topology.partitioners import task_for_key

log = logging.getLogger("millrace.topology")


@dataclass
class _Op:
    kind: str  # "transform" | "append"
    target: str
    arg: Any


@dataclass
class StreamContext:
    """What a stream topology function receives as `ctx`."""

    topology: str
    record_task: int
    _runner: StreamRunner
    _builder: ChangeSetBuilder
    _ops: list[_Op] = field(default_factory=list)
    _task: int = -1

    def __post_init__(self) -> None:
        self._task = self.record_task

    @property
    def task(self) -> int:
        """The task the code is "on": the record's, or the last `hash_partition` target."""
        return self._task

    @property
    def tasks(self) -> int:
        return self._runner.tasks

    def hash_partition(self, key: Any) -> int:
        """Move to the task that owns `key` (as PState keys and `hash_by` depots are routed)."""
        self._task = task_for_key(key, self._runner.tasks)
        return self._task

    def _owns(self, key: Any) -> bool:
        return self._runner.owns_task(task_for_key(key, self._runner.tasks))

    # ---- writes (routed by key; kept only on the group that owns the key) ----

    def transform(self, pstate: str, key: Any, t: Transform) -> None:
        """Apply a path transform under `key` (e.g. ``P.key("a").set(1)`` built with :data:`pstate.P`)."""
        self._runner.check_pstate(self.topology, pstate)
        if self._owns(key):
            self._ops.append(_Op("transform", pstate, (key, t)))

    def set(self, pstate: str, key: Any, value: Any) -> None:
        self.transform(pstate, key, P.key(key).set(value))

    def update(self, pstate: str, key: Any, fn: Callable[[Any], Any]) -> None:
        """`fn(old)` (None when absent) becomes the new value; runs where `key` lives."""
        self.transform(pstate, key, P.key(key).update(fn))

    def remove(self, pstate: str, key: Any) -> None:
        self.transform(pstate, key, P.key(key).remove())

    def depot_append(self, depot: str, record: Any) -> None:
        """Append to another depot of this module; its partitioner must be deterministic (not `random`)."""
        decl = self._runner.definition.depots.get(depot)
        if decl is None:
            raise TopologyError(self.topology, f"unknown depot {depot!r}; declared: "
                                f"{self._runner.definition.depot_names()}")
        if decl.partitioner is random_partitioner:
            task = self._task  # `random` from a topology means "here": every group must agree on one task
        else:
            task = decl.partitioner(record, self._runner.tasks)
        if self._runner.owns_task(task):
            self._ops.append(_Op("append", depot, (task, record)))

    # ---- reads (only keys of the running group) ----

    def select_one(self, pstate: str, key: Any, path: Path | None = None) -> Any:
        self._runner.check_pstate(self.topology, pstate)
        if not self._owns(key):
            raise ForeignRead(self.topology, f"read of {pstate}[{key!r}] on a task group that does not own it; "
                              "read only keys colocated with the record (partition the depot by the same key)")
        full = P.key(key) if path is None else Path(P.key(key).navs + path.navs)
        out = self._builder.select(pstate, full)
        return out[0] if out else None


class StreamRunner:
    """Runs a module's stream topologies on one task group, writing into a change set."""

    def __init__(self, definition: ModuleDefinition, tasks: int, groups: int, group: int) -> None:
        self.definition = definition
        self.tasks = tasks
        self.groups = groups
        self.group = group
        self.by_depot: dict[str, list[TopologyDecl]] = {}
        for t in definition.topologies.values():
            if t.kind == "stream":
                for d in t.depots:
                    self.by_depot.setdefault(d, []).append(t)

    @property
    def active(self) -> bool:
        return bool(self.by_depot)

    def owns_task(self, task: int) -> bool:
        return task % self.groups == self.group

    def foreign_tasks(self) -> list[int]:
        return [t for t in range(self.tasks) if not self.owns_task(t)]

    def check_pstate(self, topology: str, pstate: str) -> None:
        if pstate not in self.definition.pstates:
            raise TopologyError(topology, f"unknown PState {pstate!r}; declared: {self.definition.pstate_names()}")

    def run(self, builder: ChangeSetBuilder, depot: str, task: int, records: Sequence[Any],
            strict: bool, only: str | None = None) -> dict[str, list[Any]]:
        """Run every topology on `depot` over `records` of partition `task`; returns ack values per topology.

        `strict` (the home run): a failing record fails the whole call, so the
        client's append is refused and can be retried. Otherwise (a group
        consuming another group's partition) the failing record is logged and
        skipped here after its retries, so one poison record cannot stop a group.
        """
        acks: dict[str, list[Any]] = {}
        for topo in self.by_depot.get(depot, ()):
            if only is not None and topo.name != only:
                continue
            values = acks[topo.name] = []
            for record in records:
                ctx = StreamContext(topo.name, task, self, builder)
                try:
                    values.append(topo.fn(ctx, record))
                except ForeignRead:
                    if strict:
                        raise
                    values.append(None)  # the home run reports it to the client
                    continue
                except TopologyError:
                    raise
                except Exception as e:
                    if strict:
                        raise TopologyError(topo.name, f"{type(e).__name__}: {e} (record {record!r:.200}); "
                                            "the append was not accepted, fix the topology or the record") from e
                    log.error("topology %s failed on %s[%d] record %.200r: %s: %s; skipped on group %d",
                              topo.name, depot, task, record, type(e).__name__, e, self.group)
                    values.append(None)
                    continue
                for op in ctx._ops:
                    if op.kind == "transform":
                        _key, t = op.arg
                        builder.transform(op.target, t)
                    else:
                        ptask, rec = op.arg
                        builder.depot_append(op.target, ptask, [rec])
        return acks
