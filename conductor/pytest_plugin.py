"""A pytest plugin for apps (entry point ``pytest11``: installed with ``millrace[server]``, active by itself).

Fixtures:

- ``millrace_cluster`` (session): a real RF=3 cluster, ZooKeeper, a conductor and three worker processes
  in a temporary folder (a ``DevCluster``), stopped at the end of the session.
- ``millrace_app``: deploys the module the test names with ``@pytest.mark.millrace_module("pkg.mod:Class",
  tasks=4, threads=2)`` (once per session and module reference) and yields a connected ``Cluster``.

The helpers to kill, pause, resume and restart a worker and to wait for a group's leader are in
``conductor.testing``. Nothing is imported from the server side until a fixture is used, so the plugin
costs an app's other tests nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conductor.client import Cluster
    from conductor.devcluster import DevCluster

MARKER = "millrace_module"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(module_ref, tasks=4, threads=2, options=None): the Millrace "
                                       "module the millrace_app fixture deploys")


@pytest.fixture(scope="session")
def millrace_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """ZooKeeper, a conductor and three workers, as real processes (replication factor 3)."""
    from conductor.devcluster import DevCluster
    from conductor.runtime_env import EnvironmentBroken

    dc = DevCluster(tmp_path_factory.mktemp("millrace-cluster"), nodes=3)
    try:
        dc.start()
    except EnvironmentBroken as e:
        pytest.fail(f"the Millrace test cluster could not start: {e} (`conductor doctor` checks this machine)",
                    pytrace=False)
    try:
        yield dc
    finally:
        dc.stop()


@pytest.fixture(scope="session")
def _millrace_deployed() -> dict[str, str]:
    """Module reference -> deployed module name, for this session's cluster."""
    return {}


@pytest.fixture
def millrace_app(request: pytest.FixtureRequest, millrace_cluster: DevCluster,
                 _millrace_deployed: dict[str, str]) -> Iterator[Cluster]:
    """A client of the cluster with the test's ``millrace_module`` deployed (the session deploys it once)."""
    from conductor.testing import deploy

    marker = request.node.get_closest_marker(MARKER)
    if marker is None or not marker.args:
        pytest.fail(f'millrace_app needs @pytest.mark.{MARKER}("pkg.mod:Class") on the test', pytrace=False)
    module_ref: str = marker.args[0]
    kwargs: dict[str, Any] = dict(marker.kwargs)
    if module_ref not in _millrace_deployed:
        deploy(millrace_cluster, module_ref, **kwargs)
        _millrace_deployed[module_ref] = kwargs.get("name") or module_ref.rsplit(":", 1)[-1]
    with millrace_cluster.connect() as cluster:
        yield cluster
