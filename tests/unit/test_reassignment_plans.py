"""The conductor's side of a reassignment, pure parts: targets (placement), the per-group step, the plan document."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from conductor.metastore.module_spec import ModuleSpec
from conductor.metastore.plans import ReassignmentPlan
from conductor.placement import place, replace_targets, scale_targets
from conductor.reassigning import group_step, plan_progress
from conductor.worker.runtime import ModuleRuntime
from conductor.worker.throttle import CopyThrottle
from replog.eligibility import record_storage
from replog.messages import GroupState


def moved(before: dict[int, list[str]], after: dict[int, list[str]]) -> int:
    return sum(len(set(after[g]) - set(before[g])) for g in before)


@pytest.mark.parametrize(("groups", "rf0", "n0", "rf1", "n1"), [
    (2, 1, 3, 3, 3), (6, 3, 3, 3, 5), (10, 3, 5, 3, 3), (4, 3, 3, 2, 3), (6, 3, 5, 5, 5), (7, 2, 4, 3, 6)])
def test_scale_targets_even_and_minimal(groups: int, rf0: int, n0: int, rf1: int, n1: int) -> None:
    nodes = [f"n{i}" for i in range(1, max(n0, n1) + 1)]
    before = place(groups, nodes[:n0], rf0)
    after = scale_targets(before, nodes[:n1], rf1)
    assert all(len(set(t)) == len(t) == rf1 and set(t) <= set(nodes[:n1]) for t in after.values())
    load = Counter(r for t in after.values() for r in t)
    assert max(load.values()) - min(load.values()) <= 1, load
    assert len(load) == min(n1, groups * rf1)
    # every replica added is needed: growth adds exactly the missing ones, a same-RF move only what evens load
    if rf1 >= rf0 and n1 >= n0:
        cap = -(-groups * rf1 // n1)
        kept_max = sum(min(cap, Counter(r for t in before.values() for r in t)[n]) for n in nodes[:n0])
        assert moved(before, after) == groups * rf1 - kept_max
    for g, t in after.items():  # the preferred leader stays first when it stays
        if before[g][0] in t:
            assert t[0] == before[g][0]


def test_scale_targets_refuse_too_few_nodes() -> None:
    with pytest.raises(ValueError, match="needs 3 distinct workers"):
        scale_targets({0: ["a"]}, ["a", "b"], 3)


def test_replace_targets_take_least_loaded_and_refuse_when_nowhere() -> None:
    current = {0: ["a", "b", "c"], 1: ["b", "c", "d"], 2: ["a", "c", "d"]}
    out = replace_targets(current, "a", ["b", "c", "d", "e", "f"], {"b": 3, "c": 3, "d": 2, "e": 1, "f": 1})
    assert out == {0: ["b", "c", "e"], 2: ["c", "d", "f"]}  # (e then holds 2: f is the least loaded next)
    with pytest.raises(ValueError, match="no live worker left"):
        replace_targets(current, "a", ["b", "c"], {})


def _state(**kw: object) -> GroupState:
    base: dict[str, object] = dict(leader="a", epoch=3, isr=("a",), osr=(), placement=("a",))
    base.update(kw)
    return GroupState(**base)  # type: ignore[arg-type]


def test_group_step_walks_a_plan_to_its_end() -> None:
    live = {"a": 1, "b": 2, "c": 3}
    st = _state()
    start = group_step(st, ["a", "b", "c"], live, cancel=False)
    assert start is not None and start.new is not None and start.new.adding == ("b", "c")
    st = start.new
    waiting = group_step(st, ["a", "b", "c"], live, cancel=False)
    assert waiting is not None and waiting.waiting and "not in sync" in waiting.waiting
    joined = GroupState("a", 3, ("a", "b", "c"), (), st.version + 1, placement=st.placement, adding=st.adding,
                        storage=(("a", 1, 1), ("b", 2, 2), ("c", 3, 3)))
    done = group_step(joined, ["a", "b", "c"], live, cancel=False)
    assert done is not None and done.new is not None and not done.new.reassigning
    assert group_step(done.new, ["c", "b", "a"], live, cancel=False) is None  # (order does not matter)
    # cancel: back to the original while an original replica is in sync
    back = group_step(st, ["a", "b", "c"], live, cancel=True)
    assert back is not None and back.new is not None and back.new.replicas == ("a",)
    assert group_step(_state(), ["a", "b"], live, cancel=True) is None
    other = group_step(st, ["a", "d"], live, cancel=False)
    assert other is not None and other.waiting and "not this plan's" in other.waiting


def test_removed_leader_hands_off_before_completing() -> None:
    live = {"a": 1, "b": 2}
    st = GroupState("a", 3, ("a", "b"), (), 7, placement=("b", "a"), removing=("a",),
                    storage=(("a", 1, 1), ("b", 2, 2)))
    step = group_step(st, ["b"], live, cancel=False)
    assert step is not None and step.resign_to == "b"
    plan = ReassignmentPlan("scale", {0: ("b",), 1: ("a", "b")})
    rows = plan_progress(plan, {0: (st, 7), 1: (_state(), 1)}, live)
    assert [(r.phase, r.group) for r in rows] == [("handing-off", 0), ("queued", 1)]


def test_plan_document_round_trips_and_updates_the_spec() -> None:
    plan = ReassignmentPlan("scale", {0: ("a", "b", "c"), 3: ("b", "c", "d")}, replication_factor=3, workers=4,
                            concurrency=1, requested=12.5)
    assert ReassignmentPlan.from_json(plan.to_json()) == plan
    with pytest.raises(ValueError, match="malformed"):
        ReassignmentPlan.from_json(b'{"kind": "scale"}')
    spec = ModuleSpec(name="M", module_ref="a.b:C", tasks=4, threads=4, workers=1, replication_factor=1)
    after = plan.spec_after(spec)
    assert (after.replication_factor, after.workers) == (3, 4)
    assert after.replication_config().min_isr is None  # min-ISR follows each configuration's size unless set


def test_scale_targets_cover_small_cases_exhaustively() -> None:
    for groups, n0, n1, rf in itertools.product(range(1, 5), range(1, 5), range(1, 5), range(1, 4)):
        if rf > min(n0, n1):
            continue
        nodes = [f"n{i}" for i in range(max(n0, n1))]
        after = scale_targets(place(groups, nodes[:n0], rf), nodes[:n1], rf)
        load = Counter(r for t in after.values() for r in t)
        assert max(load.values()) - min(load.values()) <= 1 or len(load) < n1, (groups, n0, n1, rf, after)


def test_copy_throttle_paces_to_the_live_limit() -> None:
    now = [0.0]
    waits: list[float] = []

    def wait(s: float) -> None:
        waits.append(s)
        now[0] += s

    limit = [1000]
    t = CopyThrottle(lambda: limit[0], wait=wait, clock=lambda: now[0])
    for _ in range(5):
        t.pace(500)  # 2,500 bytes at 1,000 B/s: 2.5 s, the first chunk free
    assert now[0] == pytest.approx(2.5) and t.waited_s == pytest.approx(2.5)
    limit[0] = 0  # unpaced
    t.pace(10_000)
    assert now[0] == pytest.approx(2.5)
    limit[0] = 10_000  # a new limit measures from its first chunk
    t.pace(5_000)
    t.pace(5_000)
    assert now[0] == pytest.approx(3.5)


def test_the_copies_of_one_module_on_a_worker_share_its_runtimes_budget() -> None:
    """Two groups copying at once draw from their module runtime's one budget (a plan's concurrency copies no
    faster than one copy); another module, or the module opened again, has a budget of its own."""
    waits: list[float] = []
    spec = ModuleSpec(name="M", module_ref="a.b:C", tasks=4, threads=4, workers=1, replication_factor=1)
    rt, other = ModuleRuntime(spec, None), ModuleRuntime(spec, None)  # type: ignore[arg-type]
    assert rt.copy_budget is not other.copy_budget
    a, b, c = (CopyThrottle(lambda: 1000, wait=waits.append, budget=budget)
               for budget in (rt.copy_budget, rt.copy_budget, other.copy_budget))
    a.pace(1000)
    b.pace(1000)  # (1,000 B/s: the real clock moves too little to matter)
    c.pace(1000)
    assert waits == [pytest.approx(1.0, abs=0.1), pytest.approx(2.0, abs=0.1), pytest.approx(1.0, abs=0.1)]


def test_a_group_is_done_once_the_copies_its_plan_retired_are_released_or_taken_back() -> None:
    live = {"a": 1, "b": 2}
    st = GroupState("b", 3, ("a", "b"), (), 7, placement=("b", "a"), removing=("a",),
                    storage=(("a", 1, 1), ("b", 2, 2)))
    done = group_step(st, ["b"], live, cancel=False)
    assert done is not None and done.new is not None and done.new.retired == (("a", 1, 1),)
    kept = done.new
    waiting = group_step(kept, ["b"], live, cancel=False)
    assert waiting is not None and waiting.waiting and "record their storage again" in waiting.waiting
    rows = plan_progress(ReassignmentPlan("scale", {0: ("b",)}), {0: (kept, kept.version)}, live)
    assert [(r.phase, r.group) for r in rows] == [("releasing", 0)]
    # b reconfirms: the release is its own write; the group is then done
    released = record_storage(kept, "b", 2, 2)
    assert released is not None and released.retired == () and group_step(released, ["b"], live, False) is None
    # b lost its storage instead: the conductor takes a back, then starts the plan again
    lost = record_storage(kept, "b", 9, 2)
    assert lost is not None
    back = group_step(lost, ["b"], live, cancel=False)
    assert back is not None and back.new is not None and set(back.new.isr) == {"a"} and back.new.retired == ()
    again = group_step(back.new, ["b"], live, cancel=False)
    assert again is not None and again.new is not None and again.new.removing == ("a",)


def test_a_planned_groups_change_wakes_the_active_conductor_at_once() -> None:
    """While a plan is in progress any group write (a leader's ISR join, the conductor's own step) wakes the
    active conductor for its next pass, not only a group left leaderless: one half-second poll per step kept
    the plan open with nothing left to do (issue 27, session 18). Without a plan only the leaderless case
    does. (No ZooKeeper: the conductor is not started; only its watch's callback is exercised.)"""
    from conductor.controller import Conductor

    c = Conductor("127.0.0.1:1", "c1")
    led = GroupState("a", 1, ("a", "b"), ("c",), 4, adding=("b", "c"))
    c._active.set()
    for planning, state, wakes in [(False, led, False), (True, led, True), (True, None, False),
                                   (False, GroupState(None, 2, ("a",), (), 5), True)]:
        c._kick.clear()
        c._planning = planning
        c._on_group_changed(state, 4)
        assert c._kick.is_set() is wakes, (planning, state)
    c._active.clear()
    c._planning = True
    c._kick.clear()
    c._on_group_changed(led, 4)
    assert not c._kick.is_set()  # a standby conductor runs no plan
