"""The fault tests' cluster: ZooKeeper, one conductor and three workers as real processes (RF 3 on loopback)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conductor.devcluster import DevCluster

SESSION_TIMEOUT = 4.0


@pytest.fixture
def dc(tmp_path: Path) -> Iterator[DevCluster]:
    cluster = DevCluster(tmp_path / "cluster", nodes=3, conductors=1, session_timeout=SESSION_TIMEOUT,
                         log_level="WARNING")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
