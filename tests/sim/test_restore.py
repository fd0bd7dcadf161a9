"""A group restored from a backup (conductor restore, docs/backups.md) under the simulator's faults.

Every replica of a restored group starts with the same store, applied up to the
backup's offset ``N``, an empty replog starting at ``N + 1`` and the epoch history
``[(0, 0)]`` (``conductor.worker.restore_receiver``); the group's znode is a fresh
deploy's. The random runs of ``test_sim`` start from that state instead of empty
disks: every invariant holds, the restored entries stay committed, and spare
replicas a reassignment adds copy them by far horizon (the log holds none).

Session 10: without the storage records a restore puts in the group's first znode, membership seed 15000013
elected a replica whose restored storage a fault had wiped (empty, a new incarnation). With them, seeds
20,000,000-20,000,599 and 15,000,000-15,000,199 (``SIM_RESTORE_SEEDS=600``) all pass.
"""

from __future__ import annotations

import os
from dataclasses import replace

from tests.sim.sim import MEMBERSHIP_SEEDS_FROM, RunResult, Sim, run_seed
from tests.sim.test_sim import _run_seeds

SEEDS = int(os.environ.get("SIM_RESTORE_SEEDS", "60"))
#: the backup's applied offset: what the store holds
RESTORED_UPTO = 40
#: conductor.worker.restore_receiver.RESTORED_EPOCH (tests/sim imports nothing of the conductor)
RESTORED_EPOCH = 0


def restore(sim: Sim) -> None:
    """Every hosting replica's disk as ``conductor restore`` leaves it."""
    state = [(RESTORED_EPOCH, f"restored{i}") for i in range(RESTORED_UPTO + 1)]
    for nid in sim.znode.replicas:
        n = sim.nodes[nid]
        d = n.disk
        d.entries = list(state)
        d.durable_end = d.start = RESTORED_UPTO + 1
        d.applied = d.store_durable = d.floor = d.floor_synced = d.acked = RESTORED_UPTO
        d.epoch_pairs = ((RESTORED_EPOCH, 0),)
        n.replica = sim._new_replica(nid, d, n.session)
    # conductor restore records each replica's storage incarnation (the worker's answer to the push) in the
    # group's first znode, under no session: a replica whose restored storage is lost before it confirms
    # its own is then refused like any other that lost what it held, never elected empty
    sim.znode = replace(sim.znode, storage=tuple((nid, sim.nodes[nid].disk.incarnation, 0)
                                                 for nid in sim.znode.replicas))
    sim.replica_history = {0: sim.znode.replicas}
    sim.committed = list(state)


def run_restored(seed: int) -> RunResult:
    return run_seed(seed, prepare=restore)


def test_restored_groups_under_random_faults() -> None:
    _run_seeds(range(20_000_000, 20_000_000 + SEEDS), run_restored)


def test_restored_groups_with_membership_changes() -> None:
    """Seeds past MEMBERSHIP_SEEDS_FROM: reassignments add spare replicas, which copy the restored state by far
    horizon (the restored logs hold no entry to replay)."""
    start = MEMBERSHIP_SEEDS_FROM + 5_000_000
    _run_seeds(range(start, start + SEEDS // 3), run_restored)


def test_a_restored_group_keeps_its_entries_and_takes_new_ones() -> None:
    result = run_restored(20_000_000)
    assert result.error is None, result.error
    assert result.applied > RESTORED_UPTO + 1  # (the committed entries: the restored ones and new ones)
