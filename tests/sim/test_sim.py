"""Randomized simulation: many seeds of mixed faults, every invariant checked after every step.

``SIM_SEEDS=N`` runs N seeds (default 1000), ``SIM_SEED_START`` shifts the
range; a failure prints the one command that replays its seed, with a trace.

Sweeps with storage faults (issue 13), on the code of commit 1ee07d8: seeds 0-9,999 (all pass but
7804); 5,200,000-5,205,999, 5,225,000-5,231,499, 5,250,000-5,256,499, 5,275,000-5,281,499 (25,500
seeds; all pass but 5205512, 5229713, 5251341). On commit 7749c70 (the simulator re-reads the module's
options on a new session: 7804), seeds 0-9,999, 3,000,000-3,003,999 and 8,000,000-8,003,999 all pass.
Failing seeds are kept below (fixed, or strict xfail).
With stores that lose their un-flushed applied state on a crash (the applied floor, branch applied):
seeds 0-9,999 and 7,000,000-7,019,999 (all pass but 7007988, 7012378, 7012586, the class of 5251341,
fixed by the ELR on main). On commit 98c04f1 (ELR, applied floor, options on a new session): seeds
9,000,000-9,099,999 (100,000 never swept before) and 0-9,999 all pass. Earlier on b7e6046 (ELR alone):
7,000,000-7,069,999 all pass but 7026896 (the options-on-a-new-session case of 7804). On f6a4b9b (the ELR
only when one in-sync replica is left, the rule on main): seeds 0-9,999 and 9,100,000-9,199,999 all pass.
Session 8, on the ELR when at most one live, confirmed in-sync copy is left (9414234) and the epoch cut
persisted at open (9504344): seeds 0-9,999, 9,400,000-9,419,999, 9,500,000-9,519,999,
9,600,000-9,619,999, 9,700,000-9,719,999, 9,800,000-9,819,999 and 9,900,000-9,919,999 all pass.
Session 9, membership changes (seeds from 10,000,000 run the reassignment nemesis, tests/sim/membership.py):
10,000,000-10,000,999 while the rules were built (failing seeds kept below); 11,000,000-11,009,999 all pass
(408 s for the 10,000 seeds, 2 workers, on a shared machine; 5,000 seeds took 135 s on a quieter one);
11,010,000-11,029,999 all pass but 11013759 (kept below, fixed); 11,030,000-11,034,999 all pass (after the fix
for stale znodes without the replica); about 15,000 of 11,035,000-11,054,999 (stopped for time) all pass but
11042720 (kept below; fixed in session 11 by retired copies).
Session 10, the interval durability mode (seeds from 13,000,000: half of them replication.fsync=interval with
power losses of one machine at a time): 13,000,200-13,049,999 (49,800 seeds, 3,548 s, on 51ac2e4, whose replog/
and tests/sim/ are 40bf405's) all pass but 13013670 (always mode) and 13039182 (interval mode, no power loss in
its run), both the class of 11042720 (a plan shrinks the group onto a replica that just found damage in place).
Session 11, retired copies (replog/retirement.py; seeds from 13,000,000 run membership changes and, half of them,
the interval mode): 15,000,000-15,007,499 on 644d86a (the first version) failed 15000099, 15002512, 15003455 and
15007307, all the simulator's nemesis counting a retired copy after a kept replica had reconfirmed (kept below,
fixed in Sim.survivable); then, on 823748f, 15,000,000-15,057,499 all pass, and on 2f4613b (whose replog/ and
tests/sim/ code is the branch's final one; it adds that a re-added worker starts empty) 15,057,500-15,134,999 all
pass but 15131442 (kept below: a stale-epoch leadership after a failover, failing on f9a0591 too; the check was too
strong, fixed in the simulator). 135,000 new seeds in all, about 85 minutes on 2 workers (7 to 73 seeds/s with the
machine's load), 27 Nov 2026 08:34-10:00 UTC. Also in session 11, on main: the ISR lag running from a follower's
last acknowledgement (ec2c5bb) 16,000,000-16,014,999 all pass; the trim rule moved to replog/trims.py (f3d6ab6)
20,010,000-20,014,999 all pass. On merged main (retired copies, the lag rule, the far-horizon round rule together):
17,000,000-17,019,999 on 33bc270 and 17,020,000-17,069,999 on b3d2d12 all pass (70,000 seeds, 10:00-10:52 UTC); on cda3793, 18,000,000-18,019,999 all pass.
Session 12 (no replication rule changed): the trims sweep 20,030,000-20,030,999 and, on dfebee4, 21,000,000-21,029,999
(30,000 new seeds, membership changes, half in interval mode) all pass.
Session 13, a follower re-asks its epoch question on the new leader's first frame (replog.replica_follower
._reask_epoch_end; replog/ and tests/sim/ code of 76ad86d): 30,000,000-30,019,999 all pass (13 min on 2 workers,
load 5-12), and seeds 0-9,999 and the default runs all pass. On merged main (90f3210: the re-ask with the session's
other changes), 31,000,000-31,019,999 all pass (7 min 20 s); on ff4998e (the recovery fix), 32,000,000-32,009,999 all pass.
Session 14, a leader keeps a new replica's early reset ack (LeaderState.early_resets): 33,140,000-33,142,999
all pass (with the 200-seed membership, trim and interval runs), 316 s on a loaded machine.
Session 14, unsure storage (issue 32: the storage marks synced beside the replog, claiming the flush in flight; the
election waits for every in-sync replica's log and elects the most up-to-date; replog/eligibility.py): the first
3,000 seeds from 40,000,000 found 40001167 (a take-back moved the unsure replica out of the ISR, then the retired
copy turned out lost: fixed in replog.retirement.take_back, which keeps unsure members as witnesses); then
40,000,000-40,022,999 all pass (23,000 seeds, membership changes, trims, half in interval mode; about 6.5 min per
5,000 on 2 workers at load 9 to 16).
On merged main (9d0648b: unsure storage with the early reset acks and the task threads' overlapped fsyncs),
41,000,000-41,019,999 all pass but 41017400 (the checker's, not a rule's: kept below), then on 4e1f758
41,020,000-41,039,999 all pass (7 min 53 s on 2 workers at load 3).
On 0976a4a, 42,000,000-42,019,999 all pass (8 min 41 s beside a make test).
Session 15 (no replication rule changed; far-horizon checkpoints shared by a group's followers, in the worker): on
a6f63b1, 43,000,000-43,019,999 all pass (13 min, niced beside two helpers' benchmarks); on a29ad8a
43,020,000-43,039,999 all pass (6 min 43 s).
Session 16 (no replication rule changed; in the worker: deferred stores of added replicas, a far-horizon install's
writes off the task thread, stored depot batches): on 640a6d2, 44,000,000-44,019,999 all pass (5 min 16 s).
Session 17 (no replication rule changed): on dbc8cbb, 45,000,000-45,019,999 all pass (5 min 44 s).
Session 18 (no replication rule changed): on c540ca5, 46,000,000-46,019,999 all pass but 46016021 (a liveness
check after healing; kept below as a strict xfail, not diagnosed yet) (7 min 37 s beside a make test).
Session 19 (no replication rule changed): 46016021 was a deadline, not a stall (it converged ~30 ms late; its
test's docstring); liveness is now judged with a grace (``Sim.check_liveness_by_deadline``) and sweeps count the
seeds that needed it: 47,000,000-47,019,999 all pass, none needed the grace (6 min 57 s beside a helper's work);
on the session's final code (0ede863), 48,000,000-48,019,999 all pass, none needed it (5 min 49 s).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence

import pytest

from tests.sim.sim import INTERVAL_SEEDS_FROM, MEMBERSHIP_SEEDS_FROM, TRIM_SEEDS_FROM, RunResult, run_seed

SEEDS = int(os.environ.get("SIM_SEEDS", "1000"))
START = int(os.environ.get("SIM_SEED_START", "0"))


def _workers(seeds: int) -> int:
    return max(1, min(2, os.cpu_count() or 1)) if seeds >= 50 else 1


def test_random_seeds() -> None:
    _run_seeds(range(START, START + SEEDS))


def test_random_seeds_with_membership_changes() -> None:
    """Seeds from MEMBERSHIP_SEEDS_FROM run the reassignment nemesis too (RF 1 -> 3, 3 -> 5, 3 -> 2, replace
    one replica, any set; a quarter cancelled) over the same faults; sweep more with SIM_SEED_START=11000000."""
    _run_seeds(range(MEMBERSHIP_SEEDS_FROM, MEMBERSHIP_SEEDS_FROM + 200))


def test_random_seeds_with_depot_trims() -> None:
    """Seeds from TRIM_SEEDS_FROM append depot trims too, built by the leader from its applied state (the
    promise rule, replog.trims.trim_point); the simulator checks that every committed trim drops only
    records applied where it was built. Sweep more with SIM_SEED_START=20000000."""
    results = _run_seeds(range(TRIM_SEEDS_FROM, TRIM_SEEDS_FROM + 200))
    assert sum(r.trims for r in results) > 200


def test_the_trim_check_catches_a_trim_clamped_to_the_log_end() -> None:
    """A leader clamping a trim to its log's end (records not yet applied) instead of its applied end is caught."""
    failed = [r for s in range(TRIM_SEEDS_FROM, TRIM_SEEDS_FROM + 40) if (r := run_seed(s, trim_rule="log")).error]
    assert failed and "no reader was promised" in (failed[0].error or ""), [r.error for r in failed[:1]]


def test_random_seeds_with_the_interval_durability_mode() -> None:
    """Seeds from INTERVAL_SEEDS_FROM run half of their groups with replication.fsync=interval (acknowledged
    from the page cache, fsynced every few ms) and machines losing power (their page cache with it) one at a
    time; membership changes too. Sweep more with SIM_SEED_START=13000000."""
    _run_seeds(range(INTERVAL_SEEDS_FROM, INTERVAL_SEEDS_FROM + 200))


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_random_seeds_10000() -> None:
    """`make test-all`: ten times the default run, seeds 0-9,999 (storage faults included)."""
    _run_seeds(range(10_000))


def _run_seeds(seeds: Sequence[int], run: Callable[[int], RunResult] = run_seed) -> list[RunResult]:
    """Run ``run`` (a picklable function of a seed) on every seed, two workers for many; fail with the first error."""
    t0 = time.monotonic()
    if _workers(len(seeds)) > 1:
        # spawn, not fork: earlier tests in the same process leave gRPC and Spark threads running,
        # and forking a threaded process can deadlock the children.
        with multiprocessing.get_context("spawn").Pool(_workers(len(seeds))) as pool:
            results: list[RunResult] = pool.map(run, seeds, chunksize=20)
    else:
        results = [run(s) for s in seeds]
    elapsed = time.monotonic() - t0
    failures = [r for r in results if r.error]
    assert not failures, (
        f"{len(failures)} of {len(seeds)} seeds failed ({[r.seed for r in failures][:20]}); first:\n"
        f"{failures[0].error}"
    )
    steps = sum(r.steps for r in results)
    applied = sum(r.applied for r in results)
    late = [r.late_ms for r in results if r.late_ms]
    print(f"\n{len(seeds)} seeds in {elapsed:.1f}s ({len(seeds) / elapsed:.0f} seeds/s, {steps} events, "
          f"{applied} entries applied; {len(late)} converged within the liveness grace"
          f"{f', at most {max(late)} ms late' if late else ''})")
    # The seeds must do real work, not just survive.
    assert applied > len(seeds) * 50
    return results


def test_replay() -> None:
    """Replays one seed with tracing: ``SIM_SEED=1234 .venv/bin/python -m pytest tests/sim/test_sim.py::test_replay``.

    Without SIM_SEED it replays seed 0 twice, proving a seed is a reproducible test case: the same seed
    must give the same run, event for event.
    """
    seed = os.environ.get("SIM_SEED")
    if seed is not None:
        result = run_seed(int(seed), trace=True)
        assert result.error is None, result.error
        return
    first, second = run_seed(0), run_seed(0)
    assert first.error is None, first.error
    assert (first.steps, first.appended, first.applied) == (second.steps, second.appended, second.applied), (
        "a seed must replay identically"
    )
    assert first.applied > 0


@pytest.mark.parametrize("seed", [430, 473, 495])
def test_regression_seed_empty_epoch_of_deposed_leader(seed: int) -> None:
    """These seeds failed when a replica that led an epoch without writing kept that empty epoch
    in its cache: its epoch exchange never agreed (see also the scripted scenario in
    test_scenarios.py::test_deposed_leader_with_empty_epoch_reconciles)."""
    result = run_seed(seed, fault_ms=800)  # the run length they failed with
    assert result.error is None, result.error


def test_regression_seed_late_cas_answer_fences_new_leadership() -> None:
    """Seed 4164 with 2 s of faults: a late session-expired answer to a CAS of the replica's previous
    leadership fenced its new one, leaving the group without a working leader after healing
    (unit test: test_replica_leader.py::test_late_cas_answer_of_an_earlier_leadership_is_ignored)."""
    result = run_seed(4164, fault_ms=2000)
    assert result.error is None, result.error


@pytest.mark.parametrize("seed", [37, 107, 931, 1082])
def test_regression_seeds_live_option_changes(seed: int) -> None:
    """Seeds that failed when the simulator started changing options live (`conductor set-option`).
    107: after min-ISR was raised above the ISR, the leader counted a member whose join CAS was
    still in flight towards min-ISR and applied with fewer electable copies. 37: with the group
    stalled below min-ISR, an OSR follower was offered the same checkpoint of the stalled apply
    offset forever instead of replaying the entries it needed to rejoin. 931 and 1082 made the
    simulator's own checks precise: liveness is judged under the base options, and min-ISR
    promises copies on disk (the metastore's ISR may already be smaller, by a shrink decided
    under the lower min-ISR a moment before)."""
    result = run_seed(seed)
    assert result.error is None, result.error


@pytest.mark.parametrize("seed", [2008135, 2038463])
def test_regression_seeds_follower_stuck_after_heal(seed: int) -> None:
    """Found by a sweep on an earlier branch (lost): a follower stayed stuck at 717 of 747 entries after
    healing. Kept as regression seeds; they pass with the shared election rule and storage records."""
    result = run_seed(seed)
    assert result.error is None, result.error


@pytest.mark.parametrize("seed", [7804, 7026896])
def test_regression_seed_options_set_while_the_session_was_down(seed: int) -> None:
    """Seed 7804 (seeds 0-9,999; process faults only): the healing `set-option` back to the base options
    reached the leader while its session was expired, and the simulator never re-read the module znode on
    the new session (the worker's kazoo DataWatch does), so the leader kept max-inflight 8 and a follower
    it replayed 400 entries to was still behind when the quiet period ended. Seed 7026896 (sweep
    7,000,000+, on b7e6046) failed the same way: its leader kept min-ISR 3 from the fault phase."""
    result = run_seed(seed)
    assert result.error is None, result.error


def test_regression_seed_stale_epoch_answer_after_far_horizon_install() -> None:
    """Seed 5050635 (sweep 5,000,000+): a follower rebuilt by a far-horizon install got the leader's answer
    to the epoch question its previous replica object had asked (same epoch, older log end) and was told
    to cut below what it had applied (issue 13 item 9's `would truncate applied entries`)."""
    result = run_seed(5050635)
    assert result.error is None, result.error


@pytest.mark.parametrize("seed", [5100562, 6596])
def test_regression_seed_storage_fault_on_the_last_copy_while_the_leader_is_down(seed: int) -> None:
    """Seed 5100562 (sweep 5,100,000+): damage was found on the only other in-sync copy while the leader
    was down; the failover dropped the leader from the ISR, the damaged replica could not stay in it, and
    the group stalled (no intact in-sync replica: a double fault, not a lost write). 6596 (seeds 0-9,999):
    the same with the leader restarting, not yet confirmed. The deposed leader now stays electable in the
    ELR (see test_regression_seeds_isr_member_lost_after_failover)."""
    result = run_seed(seed)
    assert result.error is None, result.error


@pytest.mark.parametrize("seed", [5251341, 5205512, 5229713, 6007169, 6008728, 7007988, 7012378, 7012586])
def test_regression_seeds_isr_member_lost_after_failover(seed: int) -> None:
    """Sweeps 5,200,000+, 6,000,000+ and 7,000,000+ (storage faults): "no working leader after healing". A follower
    found damage and reopened its storage in the same session; before its new incarnation was recorded,
    the conductor failed over to it (its old record still said intact), moving the deposed leader, which
    held every applied entry, to the OSR; the reopened replica then marked itself lost as the last ISR
    member and the group stalled. The deposed leader now joins the ELR (eligible leader replicas,
    KIP-966) and is elected when no ISR member can be (replog.election)."""
    result = run_seed(seed)
    assert result.error is None, result.error


def test_regression_seed_empty_epoch_left_in_the_epoch_file() -> None:
    """Seed 9504344 (sweep 9,500,000+): b led epoch 4 without writing anything, crashed, and reopened with
    epoch 4 cut from its epoch cache (it started at the log end) but not from its file; it then followed
    epoch 10 and took a's epoch-3 entries at 48-95, crashed again, and came back believing those entries
    were epoch 4's. Leading epoch 12 it told a that epoch 3 ended at 48, and a would have truncated entries it
    had applied. The cut is now persisted by the replica's first event."""
    result = run_seed(9504344)
    assert result.error is None, result.error


def test_regression_seed_leader_deposed_while_the_last_isr_member_is_down() -> None:
    """Seed 9414234 (sweep 9,400,000+, storage faults): "no working leader after healing". a lost its disk, d
    led, c lost its disk while down, b found entry 0 damaged and reopened empty, then d crashed. The
    conductor failed over to b (ISR b, c), whose znode record still named its old storage, and moved d, the
    only intact copy, to the OSR: two members were left, so d did not join the ELR. b then recorded its new
    storage and left, c came back lost, and nothing could be elected. A deposed leader now joins the ELR
    when at most one *live, confirmed* ISR member is left (replog.election), and d is elected after the heal."""
    result = run_seed(9414234)
    assert result.error is None, result.error


@pytest.mark.parametrize("seed", [10000047, 10000450, 10000575])
def test_regression_seeds_reassignment_racing_a_lost_disk(seed: int) -> None:
    """Membership sweep 10,000,000+: "no working leader after healing". A plan shrinking the group to one
    replica completed while that replica had just lost its disk (down, or not yet recorded): the removal
    deleted the only intact copy. Completion now waits for every target replica to be live and confirmed under
    its session (replog.reassignment), and the simulator injects a storage fault only when an intact copy
    survives however the plan in progress ends (10000450, 10000575: the completing CAS was already computed
    when the disk went, a double fault no rule can see)."""
    result = run_seed(seed)
    assert result.error is None, result.error


def test_regression_seed_a_group_of_one_applies_when_elected() -> None:
    """Seed 10000347 (membership sweep): a group of one replica, restarted and elected, held entries it had not
    applied, and nothing (no follower ack, no new append) made it apply them. A new leader now evaluates its
    apply offset at once."""
    result = run_seed(10000347)
    assert result.error is None, result.error


def test_regression_seed_leader_counting_acks_of_a_replica_removed_meanwhile() -> None:
    """Seed 10000223 (membership sweep): a leader that had not heard of a completed plan yet applied with acks
    the removed replicas had sent before deleting their data; the target replicas held the entries (the
    completion waited for them), so the simulator now counts the copies a removal deleted as given."""
    result = run_seed(10000223)
    assert result.error is None, result.error


def test_regression_seed_far_horizon_install_after_an_unseen_removal() -> None:
    """Seed 11013759 (membership sweep 11,010,000+): e, added, was copying a checkpoint when a cancel removed it
    and a new plan took it back; it saw neither, installed the checkpoint and was rebuilt while the znode no
    longer recorded its storage. The rebuilt replica rightly waits, unregistered, at the checkpoint's epoch
    until it records its storage again; the simulator had expected it to take the current epoch at once."""
    result = run_seed(11013759)
    assert result.error is None, result.error


def test_regression_seed_no_leader_after_a_plan_to_one_replica_with_storage_faults() -> None:
    """Seed 12002919 (membership sweep 12,000,000-12,002,999, session 9's final review): 2 nodes and 2 spares,
    storage faults; after healing the znode holds ISR ('a',), no leader, epoch 2, and nothing is elected.
    Diagnosed (session 10): the class of seed 11042720. Leader a finds entry 289 damaged at t=1176 and reopens in
    place; its RecordStorage loses the compare-and-set race twice to the plan shrinking the group to ('a',), which
    completes at t=1247 on a's old, still-recorded storage and deletes b's intact copy; a then records the loss and
    nothing is electable. Fixed (session 11) by retired copies (replog/retirement.py): b's copy is kept, and taken
    back when a records the loss (t=1359 in the run now)."""
    result = run_seed(12002919)
    assert result.error is None, result.error


def test_regression_seed_a_plan_to_a_spare_still_in_progress_after_healing() -> None:
    """Seed 14013316 (sweep 14,005,000-14,014,999, session 10, final main): one node plus two spares, storage
    faults; after healing, a plan moving the group from a to b still waited (b in the ISR, leader a being removed).
    Diagnosed (session 11): a liveness bug in the hand-off. The joint min-ISR holds a's applies until b is in the
    ISR (moving a group of one); a admits b at t=2500 by its own ISR CAS, the conductor reads that znode and asks
    a to hand off to b, and the request reaches a (t=2508) before a's CAS answer (t=2532): a ignored it, since b
    was not in its ISR yet, and the conductor asks again only after the append timeout here (15 s in
    conductor/reassigning.py), past the quiet period. A leader now accepts a request naming the successor its CAS
    in flight admits, and hands off once that CAS lands (replog/replica_leader.py, _on_resign_requested)."""
    result = run_seed(14013316)
    assert result.error is None, result.error


@pytest.mark.parametrize("seed", [13013670, 13039182])
def test_regression_seeds_of_the_interval_sweep_in_the_class_of_11042720(seed: int) -> None:
    """Sweep 13,000,200-13,049,999 (session 10; 49,800 seeds, half of them replication.fsync=interval with
    power losses): the only two failures, both the known window of docs/replication.md ("A window not closed
    yet"). 13013670 runs in always mode: b finds entry 27 damaged at t=598 and a plan shrinking the group to
    ('b',) completes at t=661 on b's still-recorded storage; 13039182 runs in interval mode without a power loss.
    Fixed (session 11) by retired copies (replog/retirement.py): both runs now take the retired copies back."""
    result = run_seed(seed)
    assert result.error is None, result.error


def test_regression_seed_plan_completes_on_a_replica_that_just_found_damage() -> None:
    """Seed 11042720 (membership sweep 11,035,000+): b found entry 56 damaged and reopened in the same session
    with a new incarnation; before its RecordStorage landed, a plan shrinking the group to b alone completed,
    since the znode still recorded b's old storage under its live session, and deleted c's, the last intact
    copy. Fixed (session 11) by retired copies (replog/retirement.py): the removed copies are kept until every kept
    replica recorded its storage again after the completing write, and taken back if one recorded a loss; nothing
    is applied meanwhile. (The run now diverges before the window; tests/sim/test_mutations.py shows all four
    window seeds fail when the completion deletes instead.)"""
    result = run_seed(11042720)
    assert result.error is None, result.error


@pytest.mark.parametrize("seed", [15000099, 15002512, 15003455, 15007307])
def test_regression_seeds_a_fault_after_a_kept_replica_reconfirmed(seed: int) -> None:
    """Seed 15000099 (sweep 15,000,000+, session 11, on the first version of retired copies): a plan (a, b) ->
    (a, c) retired b's copy; c reconfirmed its storage, a lost power, c became leader, then c lost power too; the
    storage nemesis had counted b's kept copy as a survivor. a's new storage record (leaving the ELR) then
    released b's copy while c was down, and c came back with its page cache gone: no copy left. The rule is
    right (a kept replica's confirmation is the boundary: a fault after it is a fault after the plan, which the
    group survives only with an intact ISR or ELR member); the nemesis now counts a retired copy only until the
    first kept replica has reconfirmed (Sim.survivable). 15002512, 15003455, 15007307 (same sweep) are that class:
    both kept replicas lost power, the second one counted on the retired copy, which a write released while the
    second was down."""
    result = run_seed(seed)
    assert result.error is None, result.error


def test_regression_seed_a_stale_epoch_leadership_after_a_failover() -> None:
    """Seed 15131442 (sweep 15,130,000-15,132,499, session 11, on 2f4613b; it fails the same way on f9a0591, so it
    is not the retired copies'): 2 nodes + 2 spares, session expiries and partitions, no storage faults, no plan
    ended. b led epoch 1; its session expired at t=118; the conductor failed over to a (epoch 2, b in the ELR) and
    a applied entries from t=137; at t=147 b's replica announced itself leader of epoch 1 (a znode of epoch 1,
    read under the session it did not yet know was gone, while its storage record was still being written), and
    the simulator's check "became leader but lacks applied entry 0" fired. Diagnosed (session 11): b's storage
    CAS (v3) landed while its session lived, and its answer reached b after the failover, so b took up epoch 1, an
    epoch already over. The check was too strong: leader completeness is owed for what earlier epochs applied
    (a's entries were applied in epoch 2); a zombie of epoch 1 cannot apply or acknowledge anything (a, in epoch
    2, refuses its frames), which every other check still verifies. The check now asks for the entries applied
    before the new leader's epoch ended (Sim.committed_in)."""
    result = run_seed(15131442)
    assert result.error is None, result.error


def test_regression_seed_a_take_back_keeps_the_unsure_replicas_as_witnesses() -> None:
    """Seed 40001167 (session 14, the first sweep of unsure storage): 3 nodes + 1 spare. b came back unsure of its
    last flush and stayed in the ISR; the leader c lost its disk while down; a plan shrinking the group onto b
    completed, retiring c's copy (its znode record still the old storage); with every ISR member unsure the copy
    was taken back and b moved to the OSR, then c reopened empty and was marked lost as the last ISR member: the
    group stalled with the only intact copy out of sync. A take-back now keeps the unsure members in the ISR, so
    the election can pick b once c's lost storage leaves (replog.retirement.take_back)."""
    result = run_seed(40001167)
    assert result.error is None, result.error


def test_regression_seed_a_vouch_landing_after_a_lying_disk_crash() -> None:
    """Seed 41017400 (session 14, the sweep of merged main): d, back unsure and caught up, was being removed by a
    plan when the leader vouched for it (it reported the whole log durable); before the znode write landed d
    crashed and its lying disk dropped the tail it had reported. The simulator's check that a replica no longer
    doubted holds every applied entry fired for that ended incarnation. Not a rule's fault: the damaged storage
    is found at open and gets a new incarnation, and a dead replica leads nothing; the check now skips a storage
    damaged since, as the ISR-join check does."""
    result = run_seed(41017400)
    assert result.error is None, result.error


def test_regression_seed_an_applied_tail_left_behind_after_healing() -> None:
    """Seed 46016021 (session 18's sweep of 46,000,000-46,019,999): 4 nodes + 1 spare, partitions, session
    expiries, slow disks, resignations and storage faults, a reassignment adding e, min-ISR 4 of the four original
    replicas. At t=2700 ms, 1,500 ms after healing, replica a held the log's 447 entries durable but had applied
    51: the leader could apply nothing until c, rebuilt from a far-horizon copy, had replayed 395 entries and
    rejoined the ISR, which took until 2,684 ms (a new leader 200 ms after healing; c's copy offer refused while
    its transfer from the leader's previous epoch wound down, retried 300 ms later; the replay's frames reordered
    by the network's jitter, each frame ahead of c's end dropped and the window resent). No rule was wrong: the
    group converged about 30 ms after the deadline. Liveness is now judged with a grace
    (``Sim.check_liveness_by_deadline``): a run not converged at the quiet period's end may take up to
    ``LIVENESS_GRACE_MS`` more; seeds converged by then run as before."""
    result = run_seed(46016021)
    assert result.error is None, result.error
