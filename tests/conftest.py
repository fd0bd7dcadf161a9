"""Fixtures for real infrastructure: a ZooKeeper server, a Spark session, test hosts (network namespaces).

They never skip: a broken environment fails with the `make` step that fixes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from conductor.runtime_env import EnvironmentBroken
from conductor.zkserver import ZooKeeperServer
from tests.netns import HostNetwork, NamespacesUnavailable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A real ZooKeeper on a free loopback port, stopped by its pid even when tests fail."""
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    try:
        server.start()
    except EnvironmentBroken as e:
        pytest.fail(f"ZooKeeper fixture could not start: {e}\nRun `make setup` to install it.", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def zk_hosts(zk_server: ZooKeeperServer) -> str:
    return zk_server.hosts


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A local[2] Spark session with Delta Lake from the cached jars (UI off)."""
    from topology.spark.session import spark_session

    warehouse: Path = tmp_path_factory.mktemp("spark-warehouse")
    try:
        session = spark_session("millrace-tests", warehouse=warehouse)
    except EnvironmentBroken as e:
        pytest.fail(f"Spark fixture could not start: {e}", pytrace=False)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def host_network() -> Iterator[Callable[[Sequence[str]], HostNetwork]]:
    """Builds test hosts for one test: ``net = host_network(["zk1", "zk2", "zk3"])``. Every network built is
    removed at teardown (processes, namespaces, veths, bridge), whatever the test did; a machine that cannot
    make namespaces fails the test with the reason."""
    made: list[HostNetwork] = []

    def build(labels: Sequence[str]) -> HostNetwork:
        try:
            net = HostNetwork(labels).start()
        except NamespacesUnavailable as e:
            pytest.fail(str(e), pytrace=False)
        made.append(net)
        return net

    try:
        yield build
    finally:
        for net in reversed(made):
            net.close()
