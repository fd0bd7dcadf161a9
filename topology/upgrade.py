"""What an update from one module version to another changes, and whether it may: :func:`plan_update`.

``conductor update`` compares the running version's definition with the new
one before anything is shipped. Allowed without ceremony: new depots, PStates,
topologies and handlers; changed topology code; removed topologies. A removed
depot or PState loses its data, so it needs ``allow_drop``. A changed
partitioner would move records another version put elsewhere, and the task
count is fixed at deploy, so both are refused. A PState whose schema changed
needs a :class:`~topology.module.Migration` with a new id (a rollback needs one
back); a new id on an unchanged schema is a migration of the values' meaning.

Migrations rewrite each top-level value of a map on its own, so they are
offered where a value is one stored blob: a top-level ``Map`` with the same
key schema whose value schemas (old and new) are plain and not subindexed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pstate.schema import Map, check_top_level
from topology.module import DEAD_LETTERS, ModuleDefinition, ModuleDefinitionError


class UpdateRefused(ModuleDefinitionError):
    """The new version cannot replace the running one; the message lists every reason and the fix."""

    def __init__(self, module: str, reasons: list[str]) -> None:
        self.module = module
        self.reasons = list(reasons)
        super().__init__(f"module {module} was not updated: " + "; ".join(reasons)
                         + ". The running version keeps running")


@dataclass
class UpdatePlan:
    """The differences between two versions of a module (names, in declaration order)."""

    added_depots: list[str] = field(default_factory=list)
    removed_depots: list[str] = field(default_factory=list)
    added_pstates: list[str] = field(default_factory=list)
    removed_pstates: list[str] = field(default_factory=list)
    added_topologies: list[str] = field(default_factory=list)
    removed_topologies: list[str] = field(default_factory=list)
    #: PState -> id of the migration the switch starts
    migrations: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """What an operator reads before the switch."""
        out = []
        for what, names in (("new depots", self.added_depots), ("dropped depots", self.removed_depots),
                            ("new PStates", self.added_pstates), ("dropped PStates", self.removed_pstates),
                            ("new topologies", self.added_topologies),
                            ("removed topologies", self.removed_topologies)):
            if names:
                out.append(f"{what}: {', '.join(names)}")
        for p, mid in self.migrations.items():
            out.append(f"migrating {p} ({mid})")
        return out or ["same declarations; new code for its topologies and handlers"]


def _schema_text(name: str, schema: Any) -> str:
    return check_top_level(name, schema).describe()


def migratable(name: str, old: Any, new: Any) -> str | None:
    """Why a migration of PState ``name`` from schema ``old`` to ``new`` is not offered (None: it is)."""
    o, n = check_top_level(name, old), check_top_level(name, new)
    if not (isinstance(o, Map) and isinstance(n, Map)):
        return f"{name}: only a top-level Map's values can be migrated (a Set holds keys only)"
    if o.key.describe() != n.key.describe():
        return (f"{name}: its key schema changed ({o.key.describe()} -> {n.key.describe()}); migrations change "
                "values, not keys (declare a new PState and fill it from a topology)")
    for which, s in (("old", o.value), ("new", n.value)):
        if s.storage or not s.plain:
            return (f"{name}: the {which} value schema {s.describe()} is not one plain value (tuples, sets or "
                    "subindexed parts); migrations rewrite plain values")
    return None


def plan_update(old: ModuleDefinition, new: ModuleDefinition, *, allow_drop: bool = False) -> UpdatePlan:
    """The plan from ``old`` to ``new``; :class:`UpdateRefused` naming every problem if it may not run."""
    if old.name != new.name:
        raise UpdateRefused(old.name, [f"the new code declares module {new.name!r}, not {old.name!r}"])
    plan = UpdatePlan()
    reasons: list[str] = []
    for name, decl in new.depots.items():
        before = old.depots.get(name)
        if before is None:
            plan.added_depots.append(name)
        elif before.partitioner.name != decl.partitioner.name:
            reasons.append(f"depot {name} changed its partitioner ({before.partitioner.name} -> "
                           f"{decl.partitioner.name}); records already appended were placed by the old one, so "
                           "declare a new depot instead")
    plan.removed_depots = [d for d in old.depots if d not in new.depots and d != DEAD_LETTERS]
    plan.added_pstates = [p for p in new.pstates if p not in old.pstates]
    plan.removed_pstates = [p for p in old.pstates if p not in new.pstates]
    if (plan.removed_depots or plan.removed_pstates) and not allow_drop:
        dropped = plan.removed_depots + plan.removed_pstates
        reasons.append(f"the new version drops {', '.join(dropped)} and their data; pass --allow-drop to delete "
                       "them")
    for name, pdecl in new.pstates.items():
        prev = old.pstates.get(name)
        if prev is None:
            continue
        old_id = prev.migration.id if prev.migration else None
        new_id = pdecl.migration.id if pdecl.migration else None
        changed = _schema_text(name, prev.schema) != _schema_text(name, pdecl.schema)
        if new_id is not None and new_id != old_id:
            why = migratable(name, prev.schema, pdecl.schema)
            if why is not None:
                reasons.append(why)
            else:
                plan.migrations[name] = new_id
        elif changed:
            reasons.append(f"PState {name} changed its schema ({_schema_text(name, prev.schema)} -> "
                           f"{_schema_text(name, pdecl.schema)}) without a new migration: declare "
                           f"m.pstate({name!r}, ..., migration=Migration('<new id>', fn)) with fn(old) -> new")
    plan.added_topologies = [t for t in new.topologies if t not in old.topologies]
    plan.removed_topologies = [t for t in old.topologies if t not in new.topologies]
    if reasons:
        raise UpdateRefused(old.name, reasons)
    return plan
