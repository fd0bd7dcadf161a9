"""``/millrace/plans/<module>``: a module's reassignment plan (one at a time), the whole of it in one znode.

`conductor scale`, `replace-node` and `decommission` store the target replicas
of every task group they move here; the active conductor executes the plan
(``conductor.reassigning``), a step at a time, each step a versioned
compare-and-set of a group znode computed by ``replog.reassignment``. Since
everything the executor needs is here and in the group znodes, a standby
conductor that takes over resumes the plan where the last one left it.
``--cancel`` sets ``cancel`` with a CAS; the plan's end (the module spec's new
replication factor and worker count, and the plan's deletion) is one transaction.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from conductor.metastore.errors import MetastoreError, ModuleNotFound, raise_tx_failure
from conductor.metastore.layout import PLANS_PATH, module_path, plan_path
from conductor.metastore.module_spec import ModuleSpec
from conductor.metastore.watch import WatchHandle

if TYPE_CHECKING:
    from conductor.metastore.session import Metastore


class PlanInProgress(MetastoreError):
    """A module has one reassignment plan at a time."""

    def __init__(self, module: str, plan: ReassignmentPlan) -> None:
        self.module = module
        super().__init__(f"module {module!r} is already being reassigned ({plan.kind}, requested "
                         f"{time.ctime(plan.requested)}): wait for it, or `conductor scale {module} --cancel`")


class PlanChanged(MetastoreError):
    """The plan (or the module spec) changed since it was read: re-read it."""


@dataclass(frozen=True)
class ReassignmentPlan:
    """What a module's task groups move to: ``targets`` (group -> its replicas, preference order).

    ``replication_factor`` and ``workers`` become the module spec's once every
    group reached its target (None: unchanged). ``concurrency`` is how many
    groups may be reassigning at once (each copies a replica: fewer throttle
    the copies). ``cancel`` asks the executor to roll back what has not completed.
    """

    kind: str
    targets: Mapping[int, tuple[str, ...]]
    replication_factor: int | None = None
    workers: int | None = None
    concurrency: int = 2
    cancel: bool = False
    requested: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        assert self.concurrency >= 1, self.concurrency
        assert all(len(set(t)) == len(t) > 0 for t in self.targets.values()), self.targets

    def to_json(self) -> bytes:
        return json.dumps({"kind": self.kind, "targets": {str(g): list(t) for g, t in self.targets.items()},
                           "replicationFactor": self.replication_factor, "workers": self.workers,
                           "concurrency": self.concurrency, "cancel": self.cancel, "requested": self.requested},
                          sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> ReassignmentPlan:
        try:
            doc: dict[str, Any] = json.loads(raw)
            return cls(kind=str(doc["kind"]), targets={int(g): tuple(str(x) for x in t)
                                                       for g, t in dict(doc["targets"]).items()},
                       replication_factor=doc.get("replicationFactor"), workers=doc.get("workers"),
                       concurrency=int(doc.get("concurrency", 2)), cancel=bool(doc.get("cancel", False)),
                       requested=float(doc.get("requested", 0.0)))
        except (KeyError, TypeError, AttributeError, AssertionError) as e:
            raise ValueError(f"malformed reassignment plan {raw!r}: {e}") from None

    def spec_after(self, spec: ModuleSpec) -> ModuleSpec:
        """The module spec once the plan completed (validated: a min-ISR option above the new factor fails)."""
        return replace(spec, replication_factor=self.replication_factor or spec.replication_factor,
                       workers=self.workers or spec.workers)


class Plans:
    """Reassignment plans: created once per module, cancelled by CAS, finished with the spec in one transaction."""

    def __init__(self, ms: Metastore) -> None:
        self.ms = ms

    def create(self, module: str, plan: ReassignmentPlan) -> None:
        """Store ``plan`` for ``module``; PlanInProgress if it has one, ModuleNotFound if it is not deployed."""
        if self.ms.call(self.ms.zk.exists, module_path(module)) is None:
            raise ModuleNotFound(module)
        try:
            self.ms.call(self.ms.zk.create, plan_path(module), plan.to_json(), makepath=True)
        except NodeExistsError:
            found = self.get(module)
            if found is not None and found[0] == plan:
                return  # (our own create, whose reply was lost)
            raise PlanInProgress(module, found[0] if found is not None else plan) from None

    def get(self, module: str) -> tuple[ReassignmentPlan, int] | None:
        """The module's plan and its znode version (None: no plan)."""
        try:
            data, stat = self.ms.call(self.ms.zk.get, plan_path(module))
        except NoNodeError:
            return None
        return ReassignmentPlan.from_json(data), int(stat.version)

    def modules(self) -> list[str]:
        """Modules with a plan."""
        try:
            return sorted(self.ms.call(self.ms.zk.get_children, PLANS_PATH))
        except NoNodeError:
            return []

    def cancel(self, module: str) -> ReassignmentPlan | None:
        """Ask the executor to roll the plan back (what completed stays); None if there is no plan."""
        while True:
            found = self.get(module)
            if found is None:
                return None
            plan, version = found
            cancelled = replace(plan, cancel=True)
            try:
                self.ms.cas(plan_path(module), cancelled.to_json(), version)
                return cancelled
            except BadVersionError:
                continue
            except NoNodeError:
                return None

    def finish(self, module: str, plan_version: int, spec: tuple[ModuleSpec, int] | None) -> None:
        """Delete the plan read at ``plan_version`` and, with ``spec`` (new spec, the version it was computed
        from), write the module spec, in one transaction; PlanChanged if either changed meanwhile."""
        tx = self.ms.zk.transaction()
        if spec is not None:
            tx.set_data(module_path(module), spec[0].to_json(), version=spec[1])
        tx.delete(plan_path(module), version=plan_version)
        results = self.ms.call(tx.commit)
        if any(isinstance(r, NoNodeError) for r in results) and self.get(module) is None:
            return  # (finished by another conductor, or the module destroyed)
        raise_tx_failure(results, on_conflict=lambda: PlanChanged(f"the plan or the spec of {module} changed"))

    def delete(self, module: str) -> None:
        """Drop the plan of a module that is gone."""
        try:
            self.ms.call(self.ms.zk.delete, plan_path(module))
        except NoNodeError:
            pass

    def watch(self, callback: Callable[[Sequence[str]], None]) -> WatchHandle:
        """Call ``callback(modules with a plan)`` now and whenever a plan is created or deleted."""
        handle = WatchHandle()
        self.ms.call(self.ms.zk.ensure_path, PLANS_PATH)

        def on_children(children: list[str]) -> bool:
            if handle.cancelled or self.ms.closed:
                return False
            self.ms.submit(lambda: callback(sorted(children)), key=handle)
            return True

        self.ms.zk.ChildrenWatch(PLANS_PATH, on_children)
        return handle
