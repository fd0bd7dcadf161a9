"""The fault tests' cluster: ZooKeeper, one conductor and three workers as real processes (RF 3 on loopback)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conductor.devcluster import DevCluster

SESSION_TIMEOUT = 4.0


def fault_cluster(root: Path, log_level: str = "WARNING") -> DevCluster:
    """The cluster every fault test runs (not started: ``with fault_cluster(...) as dc`` starts and stops it)."""
    return DevCluster(root, nodes=3, conductors=1, session_timeout=SESSION_TIMEOUT, log_level=log_level)


@pytest.fixture
def dc(tmp_path: Path) -> Iterator[DevCluster]:
    with fault_cluster(tmp_path / "cluster") as cluster:
        yield cluster
