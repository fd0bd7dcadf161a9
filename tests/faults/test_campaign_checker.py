"""The campaign's checker catches what it claims to: each finding is produced from a small hand-made history
and final state with exactly one thing wrong, and a clean one passes."""

from __future__ import annotations

import dataclasses

import msgpack

from tests.faults.campaign.checker import Findings, Inputs, check
from tests.faults.campaign.history import Op
from tests.faults.campaign.replicas import ReplicaState
from tests.faults.campaign.zkwatch import GroupEvent


def op(value: str, outcome: str = "ok", depot: str = "*events", key: str = "k0", t: float = 1.0) -> Op:
    return Op(value, depot, key, "c0", t, t + 0.1, outcome, group=0)


def replica(worker: str, values: list[tuple[str, str, str]], replog: bytes = b"log") -> ReplicaState:
    """A replica of group 0 holding (depot, key, value) records, with counts that replay them."""
    st = ReplicaState(worker, 0, log_end=len(values), replog=replog, applied=len(values) - 1)
    counts: dict[str, dict[str, int]] = {"$$counts": {}, "$$tally": {}}
    for i, (depot, key, value) in enumerate(values):
        st.depots.setdefault((depot, 0), []).append((i, {"key": key, "id": value}))
        pstate = {"*events": "$$counts", "*moves": "$$tally"}.get(depot)
        if pstate:
            counts[pstate][key] = counts[pstate].get(key, 0) + 1
    st.counts = counts
    return st


EVENTS = [GroupEvent(0.0, 0, 0, "w1", 1, ("w1", "w2", "w3"), ("w1", "w2", "w3"))]
RECORDS = [("*events", "k0", "a"), ("*moves", "k1", "b"), ("*plain", "k2", "u")]


def inputs(**changes: object) -> Inputs:
    base = Inputs(ops=[op("a"), op("b", depot="*moves", key="k1"), op("u", "unknown", "*plain", "k2"),
                       op("f", "failed")],
                  replicas={0: {w: replica(w, RECORDS) for w in ("w1", "w2", "w3")}},
                  leaders={0: "w1"}, events=EVENTS, min_isr=2, unavailable_after_heal={0: 0.5},
                  availability_bound_s=6.0, converged=True)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_a_clean_run_passes() -> None:
    f = check(inputs())
    assert f.ok and not f.duplicated, f.lines()
    assert (f.acknowledged, f.unknown, f.failed) == (2, 1, 1)


def test_a_lost_acknowledged_value() -> None:
    f = check(inputs(ops=[*inputs().ops, op("gone")]))
    assert [x.split()[0] for x in f.lost_acknowledged] == ["gone"] and not f.violations
    assert f.lost_acknowledged[0].endswith("in no replog)")
    # written to a replog but not applied: still lost to readers, and the finding says where it is
    reps = {w: replica(w, RECORDS, replog=b"..." + msgpack.packb({"key": "k0", "id": "gone"})) for w in ("w1", "w2")}
    f = check(inputs(ops=[*inputs().ops, op("gone")], replicas={0: reps}))
    assert f.lost_acknowledged[0].endswith("still in the replog of w1/0, w2/0, not applied)"), f.lost_acknowledged


def test_duplicates_are_counted_apart() -> None:
    twice = [*RECORDS, ("*events", "k0", "a"), ("*plain", "k2", "u")]
    f = check(inputs(replicas={0: {w: replica(w, twice) for w in ("w1", "w2", "w3")}}))
    assert f.ok and len(f.duplicated) == 2, f.lines()


def test_a_failed_value_visible_and_a_phantom_are_violations() -> None:
    more = [*RECORDS, ("*events", "k0", "f"), ("*plain", "k2", "ghost")]
    f = check(inputs(replicas={0: {w: replica(w, more) for w in ("w1", "w2", "w3")}}))
    assert any("failed value f" in v for v in f.violations), f.lines()
    assert any("nobody appended" in v for v in f.violations), f.lines()


def test_a_divergent_replica_and_an_unreadable_one() -> None:
    reps = {"w1": replica("w1", RECORDS), "w2": replica("w2", RECORDS, replog=b"lox"),
            "w3": ReplicaState("w3", 0, error="CorruptStore: bad")}
    f = check(inputs(replicas={0: reps}))
    assert len(f.divergent_replicas) == 2 and "byte 2" in f.divergent_replicas[0], f.lines()


def test_counts_that_are_not_a_replay() -> None:
    reps = {w: replica(w, RECORDS) for w in ("w1", "w2", "w3")}
    for r in reps.values():
        r.counts["$$tally"]["k1"] = 2
    f = check(inputs(replicas={0: reps}))
    assert f.violations == ["$$tally[k1] = 2 but *moves holds 1 record(s) of that key"]


def test_epochs_going_back_and_two_leaders_in_one_epoch() -> None:
    evs = [*EVENTS, GroupEvent(2.0, 0, 1, "w2", 1, ("w2", "w3"), ("w1", "w2", "w3")),
           GroupEvent(3.0, 0, 2, "w3", 0, ("w3", "w2"), ("w1", "w2", "w3"))]
    f = check(inputs(events=evs))
    assert any("epoch 1 had leaders ['w1', 'w2']" in v for v in f.violations), f.lines()
    assert any("epoch went back from 1 to 0" in v for v in f.violations), f.lines()


def test_an_ack_while_the_isr_was_below_min_isr() -> None:
    evs = [GroupEvent(0.0, 0, 0, "w1", 1, ("w1",), ("w1", "w2", "w3"))]
    f = check(inputs(events=evs))
    assert any("below min-ISR 2" in v for v in f.violations), f.lines()
    # an ISR that was big enough at some moment of the append's life is fine
    evs.append(GroupEvent(1.05, 0, 1, "w1", 1, ("w1", "w2"), ("w1", "w2", "w3")))
    assert check(inputs(events=evs)).ok


def test_unavailable_after_the_heal_and_no_convergence() -> None:
    f: Findings = check(inputs(unavailable_after_heal={0: 7.5}, converged=False))
    assert len(f.violations) == 2, f.lines()
    assert not check(inputs(unavailable_after_heal={0: None})).ok


def test_a_skipped_znode_version_makes_the_min_isr_rule_abstain() -> None:
    evs = [GroupEvent(0.0, 0, 0, "w1", 1, ("w1",), ("w1", "w2", "w3")),
           GroupEvent(1.05, 0, 2, "w1", 1, ("w1",), ("w1", "w2", "w3"))]  # version 1 was never seen
    f = check(inputs(events=evs))
    assert f.ok and f.isr_unjudged == 2, f.lines()


def test_a_follower_missing_only_an_uncommitted_tail_is_not_divergent() -> None:
    lead = replica("w1", RECORDS, replog=b"log+tail")
    lead.log_end += 1  # one more entry, beyond the commit point both applied to
    reps = {"w1": lead, "w2": replica("w2", RECORDS), "w3": replica("w3", RECORDS)}
    assert check(inputs(replicas={0: reps})).ok
    reps["w3"] = replica("w3", RECORDS, replog=b"lox")  # not a prefix: divergent
    assert len(check(inputs(replicas={0: reps})).divergent_replicas) == 1


def test_a_replica_rebuilt_from_a_checkpoint_is_judged_on_the_entries_both_logs_hold() -> None:
    """A replica a reassignment added copied a checkpoint: its log starts later than its leader's, so byte
    prefixes cannot be compared; the entries both hold must be equal and the stores the same."""
    lead = dataclasses.replace(replica("w1", RECORDS), log_start=0, log_end=3, entries={0: 10, 1: 11, 2: 12})
    rebuilt = dataclasses.replace(replica("w2", RECORDS), log_start=2, log_end=3, replog=b"g", entries={2: 12})
    empty = dataclasses.replace(replica("w3", RECORDS), log_start=3, log_end=3, replog=b"", entries={})
    f = check(inputs(replicas={0: {"w1": lead, "w2": rebuilt, "w3": empty}}))
    assert f.ok, f.lines()
    wrong = dataclasses.replace(rebuilt, entries={2: 99})
    short = dataclasses.replace(rebuilt, log_end=2, entries={}, applied=1)
    other = dataclasses.replace(rebuilt, counts={"$$counts": {}, "$$tally": {}})
    f = check(inputs(replicas={0: {"w1": lead, "w2": wrong, "w3": short}}))
    assert [x.split(":")[0] for x in f.divergent_replicas] == ["group 0 w2 vs w1", "group 0 w3 vs w1"]
    assert "entry 2 differs" in f.divergent_replicas[0] and "log [2, 2) != [0, 3)" in f.divergent_replicas[1]
    f = check(inputs(replicas={0: {"w1": lead, "w2": other}}))
    assert "counts differ" in f.divergent_replicas[0], f.divergent_replicas
