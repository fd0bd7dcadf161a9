"""pstate's dataflow storage: savepoints of a change set, the outbox, inbox positions, what an entry did."""

from __future__ import annotations

from pathlib import Path as FsPath

import pytest

from pstate import Map, P, TaskGroupStore, outbox
from pstate.changes import ChangeSet
from pstate.store import META, OUTBOX


@pytest.fixture
def store(tmp_path: FsPath) -> TaskGroupStore:
    s = TaskGroupStore(tmp_path / "state", {"$$counts": Map(str, int)}, depots=["*log"])
    yield s  # type: ignore[misc]
    s.close()


def test_rollback_forgets_writes_after_the_savepoint_and_keeps_the_rest(store: TaskGroupStore) -> None:
    b = store.changes()
    b.set("$$counts", "kept", 1)
    mark = b.writes.savepoint()
    b.set("$$counts", "kept", 2)  # same run as before the mark: cut inside it
    b.depot_append("*log", 0, ["gone"])  # a new column family after the mark
    b.transform("$$counts", P.key("gone").null_to_val(0).update(lambda n: n + 1))
    assert b.select("$$counts", P.key("gone")) == [1]  # the overlay saw the writes...
    b.writes.rollback(mark)
    assert b.select("$$counts", P.key("gone")) == [None]  # ...and no longer does
    assert b.select("$$counts", P.key("kept")) == [1]
    b.set("$$counts", "after", 3)
    assert len(b) == 2
    store.apply(0, b.encode())
    assert store.select_one("$$counts", "kept") == 1
    assert store.select_one("$$counts", "after") == 3
    assert store.select_one("$$counts", "gone") is None
    assert store.depot("*log").partition_info(0).end == 0


def test_rollback_to_an_empty_builder_and_twice(store: TaskGroupStore) -> None:
    b = store.changes()
    empty = b.writes.savepoint()
    b.set("$$counts", "a", 1)
    mid = b.writes.savepoint()
    b.set("$$counts", "b", 2)
    b.writes.rollback(mid)
    assert b.select("$$counts", P.key("b")) == [None]
    b.writes.rollback(empty)
    assert len(b) == 0 and b.writes.cfs == [] and b.select("$$counts", P.key("a")) == [None]
    b.set("$$counts", "c", 3)
    store.apply(0, b.encode())
    assert store.select("$$counts", P.all()) == [("c", 3)]


def test_outbox_numbers_envelopes_per_destination_through_staged_entries(store: TaskGroupStore) -> None:
    b = store.changes()
    assert [outbox.put_envelope(b, 3, b"x" * 10), outbox.put_envelope(b, 3, b"y"),
            outbox.put_envelope(b, 1, b"z")] == [0, 1, 0]
    store.stage(0, b)
    b2 = store.changes()  # builds on the staged entry, like depot offsets do
    assert outbox.put_envelope(b2, 3, b"w") == 2
    store.apply(0, b.encode())
    store.apply(1, b2.encode())
    r = store.applied_reader()
    assert outbox.bounds(r, 3) == outbox.OutboxBounds(0, 3, 12)
    assert outbox.destinations(r) == {1: outbox.OutboxBounds(0, 1, 1), 3: outbox.OutboxBounds(0, 3, 12)}
    assert outbox.read_envelopes(r, 3, 1) == [(1, b"y"), (2, b"w")]
    assert outbox.read_envelopes(r, 3, 0, end=2, max_bytes=5) == [(0, b"x" * 10)]  # at least one


def test_trim_clamps_counts_bytes_and_survives_reopen(tmp_path: FsPath) -> None:
    s = TaskGroupStore(tmp_path / "s", {})
    b = s.changes()
    for i in range(5):
        outbox.put_envelope(b, 0, bytes(i + 1))
    s.apply(0, b.encode())
    b = s.changes()
    assert outbox.trim(b, 0, 3) == 3
    assert outbox.trim(b, 0, 2) == 0  # below the start: nothing
    s.apply(1, b.encode())
    s.close()
    s = TaskGroupStore(tmp_path / "s", {})
    r = s.applied_reader()
    assert outbox.bounds(r, 0) == outbox.OutboxBounds(3, 5, 4 + 5)
    assert [seq for seq, _ in outbox.iter_envelopes(r, 0, 0)] == [3, 4]
    b = s.changes()
    assert outbox.trim(b, 0, 99) == 2  # clamped to the end
    s.apply(2, b.encode())
    assert outbox.bounds(s.applied_reader(), 0) == outbox.OutboxBounds(5, 5, 0)
    s.close()


def test_inbox_positions_dead_letters_and_flow_of_an_entry(store: TaskGroupStore) -> None:
    b = store.changes()
    outbox.set_inbox_position(b, 2, 7)
    outbox.set_inbox_position(b, 0, 1)
    outbox.put_envelope(b, 5, b"e")
    outbox.count_dead_letters(b, 2)
    b.set("$$counts", "k", 1)
    cs = ChangeSet.decode(b.encode())
    assert outbox.flow_of(cs) == ({2: 7, 0: 1}, [(5, 0, b"e")])
    store.apply(0, cs)
    r = store.applied_reader()
    assert outbox.inbox_positions(r) == {0: 1, 2: 7}
    assert outbox.inbox_position(r, 9) == 0
    assert outbox.dead_letters(r) == 2
    b = store.changes()
    outbox.count_dead_letters(b, 1)
    store.apply(1, b.encode())
    assert outbox.dead_letters(store.applied_reader()) == 3


def test_outbox_has_its_own_column_family(store: TaskGroupStore) -> None:
    b = store.changes()
    outbox.put_envelope(b, 0, b"e")
    cs = b.changeset()
    assert set(cs.cfs) == {OUTBOX, META}
    with pytest.raises(ValueError, match="task group"):
        outbox.put_envelope(b, -1, b"e")
