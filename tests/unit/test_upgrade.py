"""What `conductor update` allows, refuses and migrates, from two module definitions (topology.upgrade)."""

from __future__ import annotations

from typing import Any

import pytest

from pstate import Map, Record, Set
from topology import Migration, Module, hash_by, random
from topology.upgrade import UpdateRefused, plan_update


def by_id(r: Any) -> Any:
    return r["id"]


def by_user(r: Any) -> Any:
    return r["user"]


def to_cents(v: Any) -> Any:
    return v if isinstance(v, dict) else {"cents": v * 100}


def module(**decls: Any) -> Any:
    class M(Module):
        name = "M"

        def define(self, m: Any) -> None:
            m.depot("*events", decls.get("partitioner", hash_by(by_id)))
            for name, schema in decls.get("pstates", {"$$p": Map(str, int)}).items():
                m.pstate(name, schema, migration=decls.get("migrations", {}).get(name))
            for d in decls.get("depots", []):
                m.depot(d, random)

            @m.stream("*events")
            def count(ctx: Any, r: Any) -> None:
                pass

    return M.build()


def test_additions_are_planned_and_drops_need_allow_drop() -> None:
    old = module()
    new = module(pstates={"$$p": Map(str, int), "$$q": Set(str)}, depots=["*more"])
    plan = plan_update(old, new)
    assert (plan.added_pstates, plan.added_depots, plan.migrations) == (["$$q"], ["*more"], {})
    with pytest.raises(UpdateRefused, match=r"drops \*more, \$\$q and their data; pass --allow-drop"):
        plan_update(new, old)
    back = plan_update(new, old, allow_drop=True)
    assert (back.removed_depots, back.removed_pstates) == (["*more"], ["$$q"])


def test_a_changed_partitioner_is_refused() -> None:
    with pytest.raises(UpdateRefused, match=r"depot \*events changed its partitioner \(hash_by\(by_id\) -> "
                                            r"hash_by\(by_user\)\)"):
        plan_update(module(), module(partitioner=hash_by(by_user)))


def test_a_changed_schema_needs_a_new_migration_and_a_rollback_one_back() -> None:
    old = module()
    cents = {"$$p": Map(str, Record(cents=int))}
    with pytest.raises(UpdateRefused, match=r"\$\$p changed its schema .* without a new migration"):
        plan_update(old, module(pstates=cents))
    new = module(pstates=cents, migrations={"$$p": Migration("cents", to_cents)})
    assert plan_update(old, new).migrations == {"$$p": "cents"}
    assert plan_update(new, new).migrations == {}  # the same id again: nothing new
    with pytest.raises(UpdateRefused, match="without a new migration"):
        plan_update(new, old)  # back to ints needs a migration back


def test_migrations_are_refused_where_values_are_not_one_plain_blob() -> None:
    old = module()
    keys = {"$$p": Map(int, int)}
    with pytest.raises(UpdateRefused, match="key schema changed"):
        plan_update(old, module(pstates=keys, migrations={"$$p": Migration("keys", to_cents)}))
    sets = {"$$p": Set(str)}
    with pytest.raises(UpdateRefused, match="only a top-level Map"):
        plan_update(old, module(pstates=sets, migrations={"$$p": Migration("set", to_cents)}))
