"""Depot retention (pstate.retention) and key compaction (pstate.compaction) on one store, against models; and
retention checks planned off the task thread (``plan_check``/``write_planned``): the same decisions as a check
built on the task thread, and a plan that is stale by the time it is written writes nothing."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pstate.compaction import compact
from pstate.depots import META
from pstate.retention import (
    MAX_MARKS,
    RetentionPolicy,
    check,
    partition_size,
    partition_sizes,
    plan_check,
    read_state,
    trim,
    write_planned,
)
from pstate.store import TaskGroupStore
from tests.unit.depot_store import Applier, D
from topology.entries.retention import build_retention_check, plan_retention_check


@pytest.fixture
def store(tmp_path: Any) -> Any:
    with TaskGroupStore(tmp_path / "s", {}, [D]) as s:
        yield s


def test_trim_never_passes_the_applied_end(store: TaskGroupStore) -> None:
    run = Applier(store)
    run(lambda b: b.depot_append(D, 0, range(10)))
    b = store.changes()
    b.depot_append(D, 0, range(10, 20))  # staged, not applied
    store.stage(99, b)
    b2 = store.changes()
    assert trim(b2, D, 0, 15, store.applied_reader()) == 10
    assert store.depot(D).partition_info(0).start == 0  # (not applied yet)


def test_bytes_bound_holds_after_every_check(store: TaskGroupStore) -> None:
    run = Applier(store)
    policy = RetentionPolicy(retention_bytes=10_000)
    now = 0
    for i in range(200):
        run(lambda b, i=i: b.depot_append(D, 0, ["x" * 100] * 5))
        now += 10
        if i % 3 == 0:
            run(lambda b, now=now: check(b, D, 0, policy, now, store.applied_reader()))
            size = partition_size(store.applied_reader(), D, 0)
            assert size.bytes <= policy.retention_bytes + 3 * 5 * 102, size
            info = store.depot(D).partition_info(0)
            assert len(store.depot(D).read(0, 0, max_bytes=1 << 30)) == info.end - info.start
    assert store.depot(D).partition_info(0).start > 0
    assert len(read_state(store.applied_reader(), D, 0).marks) <= MAX_MARKS
    assert partition_sizes(store.applied_reader()) == [(D, 0, partition_size(store.applied_reader(), D, 0))]


def test_age_bound_trims_within_one_check(store: TaskGroupStore) -> None:
    run = Applier(store)
    policy = RetentionPolicy(retention_ms=1000)
    appended_at: list[int] = []
    for now in range(0, 5000, 100):
        run(lambda b: b.depot_append(D, 0, ["r"]))
        appended_at.append(now)
        run(lambda b, now=now: check(b, D, 0, policy, now, store.applied_reader()))
        info = store.depot(D).partition_info(0)
        # kept: everything younger than the bound; gone: everything older by more than one check (100 ms)
        assert all(appended_at[o] > now - 1000 - 100 for o in range(info.start, info.end))
        assert all(appended_at[o] <= now - 1000 for o in range(info.start))


class KV:
    @staticmethod
    def key(r: Any) -> Any:
        return r[0]

    @staticmethod
    def tomb(r: Any) -> bool:
        return r[1] is None


def test_compaction_keeps_the_latest_record_per_key_like_a_model(store: TaskGroupStore) -> None:
    rng = random.Random(7)
    run = Applier(store)
    model: dict[Any, tuple[int, Any]] = {}  # key -> (offset, value) of its latest record
    tomb_at: dict[int, int] = {}  # tombstone offset -> time it was compacted
    now = 0
    offset = 0
    for _round in range(60):
        recs = [(rng.choice("abcdefghij"), None if rng.random() < 0.15 else rng.randrange(100))
                for _ in range(rng.randrange(1, 30))]
        run(lambda b, recs=recs: b.depot_append(D, 0, recs))
        for r in recs:
            model[r[0]] = (offset, r[1])
            offset += 1
        now += 100
        run(lambda b, now=now: compact(b, D, 0, KV.key, KV.tomb, now, 500, 1000, store.applied_reader()))
        for _k, (o, v) in model.items():
            if v is None:
                tomb_at.setdefault(o, now)
        expect = {o: (k, v) for k, (o, v) in model.items() if not (v is None and tomb_at[o] <= now - 500)}
        got = dict(store.depot(D).read(0, 0, max_bytes=1 << 30))
        assert {o: tuple(r) for o, r in got.items()} == expect
        offs, _raw, nxt = store.depot(D).read_sparse(0, 0)
        assert offs == sorted(expect) and nxt == offset
        size = partition_size(store.applied_reader(), D, 0)
        assert size.records == len(expect)


def test_compaction_is_bounded_per_round(store: TaskGroupStore) -> None:
    run = Applier(store)
    run(lambda b: b.depot_append(D, 0, [("k", i) for i in range(100)]))
    run(lambda b: compact(b, D, 0, KV.key, KV.tomb, 0, 0, 10, store.applied_reader()))
    assert len(store.depot(D).read(0, 0)) == 91  # ten indexed: nine superseded
    for _ in range(10):
        run(lambda b: compact(b, D, 0, KV.key, KV.tomb, 0, 0, 10, store.applied_reader()))
    assert store.depot(D).read(0, 0) == [(99, ["k", 99])]


def test_the_driver_checks_at_once_a_partition_over_its_size_bound(store: TaskGroupStore) -> None:
    from conductor.worker.retention import over_bound, policy

    p = policy({"retention_ms": 0, "retention_bytes": 1_000, "compaction": 0, "delete_retention_ms": 1})
    assert p == RetentionPolicy(retention_bytes=1_000, delete_retention_ms=1)
    run = Applier(store)
    run(lambda b: b.depot_append(D, 1, ["x" * 400] * 2))
    assert not over_bound(store.applied_reader(), {D: p}, [0, 1])
    run(lambda b: b.depot_append(D, 1, ["x" * 400]))
    assert over_bound(store.applied_reader(), {D: p}, [0, 1])
    run(lambda b: check(b, D, 1, p, 0, store.applied_reader()))
    assert not over_bound(store.applied_reader(), {D: p}, [0, 1])


# ---------------------------------------------------------------------- checks planned off the task thread


def _state(store: TaskGroupStore) -> tuple[list[Any], list[Any], list[Any]]:
    """Everything a check may write: the partition's records, ``_meta`` (bounds, marks, time runs)."""
    r = store.applied_reader()
    return (store.depot(D).read(0, 0, max_bytes=1 << 30), list(r.scan(META, b"", None)),
            store.depot(D).time_runs(0, 0, 1 << 40))


@pytest.mark.parametrize("policy", [RetentionPolicy(retention_bytes=3_000), RetentionPolicy(retention_ms=700),
                                    RetentionPolicy(retention_ms=900, retention_bytes=5_000)])
def test_a_plan_writes_what_a_check_on_the_task_thread_writes(tmp_path: Any, policy: RetentionPolicy) -> None:
    rng = random.Random(11)
    with TaskGroupStore(tmp_path / "inline", {}, [D]) as inline, TaskGroupStore(tmp_path / "planned", {}, [D]) as planned:
        runs = {inline: Applier(inline), planned: Applier(planned)}
        now = 0
        for i in range(150):
            recs = ["x" * rng.randrange(10, 200) for _ in range(rng.randrange(1, 8))]
            now += rng.randrange(5, 60)
            for run in runs.values():
                run(lambda b, recs=recs, now=now: b.depot_append(D, 0, recs, time_ms=now))
            if i % 4 == 3:
                runs[inline](lambda b, now=now: check(b, D, 0, policy, now, inline.applied_reader()))
                plan = plan_check(planned.applied_reader(), D, 0, policy, now)
                if plan is not None:
                    runs[planned](lambda b, plan=plan: write_planned(b, plan))
                assert _state(inline) == _state(planned)
        assert planned.depot(D).partition_info(0).start > 0


def test_a_plan_never_trims_what_is_only_staged(tmp_path: Any) -> None:
    with TaskGroupStore(tmp_path / "s", {}, [D]) as store:
        run = Applier(store)
        run(lambda b: b.depot_append(D, 0, ["x" * 100] * 10))
        plan = plan_check(store.applied_reader(), D, 0, RetentionPolicy(retention_bytes=1), 0)
        assert plan is not None and plan.new_start == 10  # everything applied may go
        b = store.changes()
        b.depot_append(D, 0, ["y" * 100] * 10)  # staged, not applied: no plan speaks of it
        store.stage(99, b)
        b2 = store.changes()
        assert write_planned(b2, plan) == 10
        store.drop_staged()


def test_a_plan_is_not_written_once_the_partition_moved(tmp_path: Any) -> None:
    with TaskGroupStore(tmp_path / "s", {}, [D]) as store:
        run = Applier(store)
        run(lambda b: b.depot_append(D, 0, ["x" * 100] * 10))
        policy = RetentionPolicy(retention_bytes=500)
        plan = plan_check(store.applied_reader(), D, 0, policy, 0)
        assert plan is not None and plan.new_start == 6  # (102 bytes a record)
        run(lambda b: trim(b, D, 0, 3, store.applied_reader()))  # a client's trim went first
        b = store.changes()
        assert write_planned(b, plan) == 0 and len(b) == 0
        # a check of the same partition, staged before the plan is written, moves its state too
        plan = plan_check(store.applied_reader(), D, 0, policy, 1)
        assert plan is not None
        staged = store.changes()
        check(staged, D, 0, policy, 1, store.applied_reader())
        store.stage(1, staged)
        b = store.changes()
        assert write_planned(b, plan) == 0 and len(b) == 0
        store.drop_staged()


def test_compacted_depots_are_checked_on_the_task_thread(tmp_path: Any) -> None:
    with TaskGroupStore(tmp_path / "s", {}, [D, "*k"]) as store:
        run = Applier(store)
        run(lambda b: b.depot_append(D, 0, ["x" * 100] * 10))
        policies = {D: RetentionPolicy(retention_bytes=500), "*k": RetentionPolicy(compaction=True),
                    "*gone": RetentionPolicy(retention_bytes=1)}
        request = plan_retention_check(store.applied_reader(), store.depots, 0, [0], policies, 100)
        assert request is not None
        assert [p.depot for p in request.planned] == [D] and set(request.policies) == {"*k"}
        builder, deleted = build_retention_check(store, None, request)
        assert builder is not None and deleted == 6
        assert plan_retention_check(store.applied_reader(), store.depots, 0, [0], {D: policies[D]}, 100) is not None
        store.apply(1, builder.changeset())
        # marked and trimmed: nothing to write until the partition's end moves
        assert plan_retention_check(store.applied_reader(), store.depots, 0, [0], {D: policies[D]}, 100) is None
