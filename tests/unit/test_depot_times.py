"""Record times of depots: stamped by the leader (or an event time), runs in ``_meta``, offset for a time."""

from __future__ import annotations

import random
from pathlib import Path as FsPath

import pytest

from pstate import SchemaMismatch, TaskGroupStore
from pstate.depots import META, check_partition, depot_meta_key, time_key


@pytest.fixture
def store(tmp_path: FsPath) -> TaskGroupStore:
    s = TaskGroupStore(tmp_path / "state", {}, depots=["*log"])
    yield s  # type: ignore[misc]
    s.close()


def _append(store: TaskGroupStore, offset: int, *batches: tuple[int, list[object], int | None],
            leader_ms: int = 1_000) -> None:
    """One entry at replog ``offset``: each batch (partition, records, event time or None for the leader's)."""
    cs = store.changes()
    cs.time_ms = leader_ms
    for partition, records, time_ms in batches:
        cs.depot_append("*log", partition, records, time_ms)
    store.apply(offset, cs.encode())


def _meta_keys(store: TaskGroupStore, prefix: bytes) -> list[bytes]:
    return [k for k, _v in store.applied_reader().scan(META, prefix, prefix + b"\xff")]


def test_every_record_gets_the_entrys_leader_time_or_its_event_time(store: TaskGroupStore) -> None:
    _append(store, 0, (0, ["a", "b"], None), (1, ["x"], 5), leader_ms=1_000)
    _append(store, 1, (0, ["c"], None), leader_ms=1_000)  # the same time: no new run
    _append(store, 2, (0, ["d"], 700), leader_ms=2_000)  # an event time older than the last one
    d = store.depot("*log")
    assert [d.time_of(0, o) for o in range(4)] == [1_000, 1_000, 1_000, 700]
    assert d.time_of(1, 0) == 5
    assert d.time_of(0, 4) is None  # not in the partition
    assert d.time_runs(0, 1, 4) == [(1, 1_000), (3, 700)]
    assert d.time_runs(0, 3, 4) == [(3, 700)]
    assert d.time_runs(0, 2, 2) == []
    assert len(_meta_keys(store, b"dt:*log\x00" + check_partition(0))) == 2  # runs at offsets 0 and 3
    # max-so-far: the late record at offset 3 does not pull the answer back below it
    assert d.offset_for_time(0, 0) == 0
    assert d.offset_for_time(0, 1_000) == 0
    assert d.offset_for_time(0, 1_001) is None
    assert d.offset_for_time(1, 5) == 0 and d.offset_for_time(1, 6) is None
    assert d.offset_for_time(2, 0) is None  # a partition never written


def test_bad_event_time_fails_the_append_and_writes_nothing(store: TaskGroupStore) -> None:
    cs = store.changes()
    for bad in (-1, 2**63, 1.5, "now"):
        with pytest.raises(SchemaMismatch):
            cs.depot_append("*log", 0, ["a"], bad)  # type: ignore[arg-type]
    assert len(cs) == 0
    with pytest.raises(SchemaMismatch):
        store.depot("*log").offset_for_time(0, -5)


def test_offset_for_time_is_the_first_offset_whose_max_so_far_time_reaches_it(store: TaskGroupStore) -> None:
    rng = random.Random(28)
    times: list[int] = []
    for entry in range(60):
        batches = []
        for _ in range(rng.randint(1, 3)):
            n = rng.randint(1, 5)
            t = rng.choice([None, rng.randint(0, 500)])  # leader time or an event time, backwards at times
            batches.append((0, list(range(n)), t))
        leader = 200 + entry * rng.randint(0, 3)
        _append(store, entry, *batches, leader_ms=leader)
        for _p, records, t in batches:
            times += [leader if t is None else t] * len(records)
    d = store.depot("*log")
    assert [d.time_of(0, o) for o in range(len(times))] == times
    most, running = [], -1
    for t in times:
        running = max(running, t)
        most.append(running)
    for probe in range(-1, 520, 7):
        probe = max(probe, 0)
        want = next((o for o, m in enumerate(most) if m >= probe), None)
        assert d.offset_for_time(0, probe) == want, probe
        if want is not None:
            assert all(t < probe for t in times[:want])  # what retention by age may delete


def test_a_trim_keeps_the_run_of_the_new_start_and_the_staged_last_run(store: TaskGroupStore) -> None:
    _append(store, 0, (0, ["a", "b"], 10))
    _append(store, 1, (0, ["c", "d"], 20))
    _append(store, 2, (0, ["e"], 30))
    cs = store.changes()
    cs.depot_trim("*log", 0, 3)
    store.apply(3, cs.encode())
    d = store.depot("*log")
    runs = [int.from_bytes(k[-8:], "big") for k in _meta_keys(store, b"dt:*log\x00")]
    assert runs == [2, 4]  # offset 3 is in the run starting at 2
    assert [d.time_of(0, o) for o in range(6)] == [None, None, None, 20, 30, None]
    assert d.offset_for_time(0, 0) == 3 and d.offset_for_time(0, 25) == 4
    # a staged (appended, not applied) entry's last run is what the next one builds on
    staged = store.changes()
    staged.depot_append("*log", 0, ["f"], 30)  # same time as the last run: no new run
    payload = store.stage(4, staged)
    later = store.changes()
    later.depot_append("*log", 0, ["g"], 25)
    store.apply(4, payload)
    store.apply(5, later.encode())
    assert [d.time_of(0, o) for o in range(3, 7)] == [20, 30, 30, 25]
    assert d.offset_for_time(0, 26) == 4  # the record at 6 (25) is late: max-so-far stays 30


def test_records_stored_without_times_stay_readable(store: TaskGroupStore) -> None:
    """Older code stored no time runs and a 16-byte partition value: those records have no time."""
    cs = store.changes()
    p = check_partition(0)
    cs.writes.put_many("depot:*log", [p + o.to_bytes(8, "big") for o in range(3)], [b"\xa1a"] * 3)
    cs.writes.put(META, depot_meta_key("*log", p), (0).to_bytes(8, "big") + (3).to_bytes(8, "big"))
    store.apply(0, cs.encode())
    d = store.depot("*log")
    assert d.read(0, 0) == [(0, "a"), (1, "a"), (2, "a")]
    assert d.time_of(0, 1) is None and d.time_runs(0, 0, 3) == [(0, -1)]
    assert d.offset_for_time(0, 0) is None
    _append(store, 1, (0, ["b"], 50))
    assert d.time_runs(0, 1, 4) == [(1, -1), (3, 50)]
    assert d.offset_for_time(0, 0) == 3  # untimed records count as older than any time
    assert store.applied_reader().get(META, time_key("*log", p, 3)) is not None
