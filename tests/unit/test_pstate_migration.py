"""PState migrations on one store: reads migrate at once, batches rewrite from a cursor, new PStates appear."""

from __future__ import annotations

from pathlib import Path

from pstate import Map, Record, TaskGroupStore
from pstate.families import alias_key
from pstate.migration import ActiveMigration, read_record, rewrite_batch
from pstate.store import META, pstate_cf


def to_cents(v):
    return v if isinstance(v, dict) else {"cents": v * 100}


NEW = Record(cents=int)


def test_reads_migrate_then_batches_rewrite_every_value(tmp_path: Path) -> None:
    store = TaskGroupStore(tmp_path / "db", {"$$p": Map(str, int)})
    b = store.changes()
    for i in range(25):
        b.set("$$p", f"k{i:02}", i)
    store.apply(0, b.changeset())
    store.redefine({"$$p": Map(str, NEW), "$$q": Map(str, int)}, ["*d"])
    store.migrations["$$p"] = ActiveMigration("cents", to_cents, NEW)
    assert store.select_one("$$p", "k03") == {"cents": 300}
    assert store.select_one("$$q", "x") is None
    offset = 1
    while True:
        b = store.changes()
        b.update("$$p", "k01", lambda v: {"cents": v["cents"] + 1})
        rec = rewrite_batch(b.reader, b.writes, pstate_cf("$$p"), "$$p", store.migrations["$$p"], 10)
        store.apply(offset, b.changeset())
        offset += 1
        if rec.done:
            break
    assert rec.rewritten == 25 and read_record(store.applied_reader(), "$$p") == rec
    del store.migrations["$$p"]
    assert store.select_one("$$p", "k01") == {"cents": 100 + offset - 1}
    assert all(isinstance(v, dict) for v in store.select("$$p", __import__("pstate").P.map_vals()))
    store.close()
    again = TaskGroupStore(tmp_path / "db", {"$$p": Map(str, NEW), "$$q": Map(str, int)}, ["*d"])
    assert again.select_one("$$p", "k24") == {"cents": 2400}
    again.close()


def test_a_new_pstate_lives_in_a_spare_column_family_named_in_meta(tmp_path: Path) -> None:
    store = TaskGroupStore(tmp_path / "db", {"$$p": Map(str, int)})
    spare = store.families.free_spares({})[0]
    b = store.changes()
    b.writes.put(META, alias_key(pstate_cf("$$new")), spare.encode())
    store.apply(0, b.changeset())
    store.redefine({"$$p": Map(str, int), "$$new": Map(str, int)}, [])
    assert store.families.handles[pstate_cf("$$new")] is store.families.handles[spare]
    b = store.changes()
    b.set("$$new", "a", 7)
    store.apply(1, b.changeset())
    assert spare not in store.families.free_spares(store.aliases())
    store.close()
    again = TaskGroupStore(tmp_path / "db", {"$$p": Map(str, int), "$$new": Map(str, int)})
    assert again.select_one("$$new", "a") == 7 and "pstate:$$new" not in again._db.list_cf(str(tmp_path / "db"))
    again.close()
