"""The simulator must fail when a replication rule is broken (otherwise a green run proves nothing)."""

from __future__ import annotations

import pytest

from replog.replica import Replica
from tests.sim.mutants import (
    AppliesWhileElrHoldsBack,
    ApplyWithoutAllIsrAcks,
    ElectsEmptiedReplica,
    ForgetsAppliedFloor,
    TruncateToHighWatermark,
)
from tests.sim.sim import run_seed

WITHIN = 50


@pytest.mark.parametrize("mutant", [TruncateToHighWatermark, ApplyWithoutAllIsrAcks, ElectsEmptiedReplica,
                                    AppliesWhileElrHoldsBack, ForgetsAppliedFloor])
def test_random_seeds_catch_mutant(mutant: type[Replica]) -> None:
    for seed in range(WITHIN):
        result = run_seed(seed, replica_cls=mutant)
        if result.error is not None:
            assert "replay:" in result.error
            return
    pytest.fail(f"{mutant.__name__} survived {WITHIN} seeds: the checker is too weak")
