"""`conductor deploy` ships a module's code to workers on other hosts, where it is on no path: a worker that
cannot import it refuses with its import error and the deploy leaves nothing behind; code every worker can
import is deployed, served, and fetched by a client that never had it."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conductor.cli import app
from conductor.client import Cluster
from conductor.client.code import CodeCache
from conductor.metastore import Metastore
from conductor.zkserver import ZooKeeperServer
from tests.integration.cluster_helpers import wait_for
from tests.netns import HostNetwork

pytestmark = pytest.mark.multihost

Build = Callable[[Sequence[str]], HostNetwork]
WORKERS = ("w1", "w2", "w3")

NEEDS_DEPENDENCY = """
import mr_shipping_dependency
from pstate import Map
from topology import Module


class Needy(Module):
    def define(self, m):
        m.depot("*events")
        m.pstate("$$n", Map(str, int))
"""

TALLY = """
from pstate import Map
from topology import Module, hash_by


def by_key(record):
    return record["key"]


def plus(n):
    return (n or 0) + 1


class Tally(Module):
    def define(self, m):
        events = m.depot("*events", hash_by(by_key))
        m.pstate("$$tally", Map(str, int))

        @m.stream(events)
        def tally(ctx, record):
            ctx.update("$$tally", record["key"], plus)
"""


class Cluster3:
    """ZooKeeper and three workers, each on its own host; the code under test is on the test's path only."""

    def __init__(self, net: HostNetwork, root: Path) -> None:
        self.net = net
        self.root = root
        self.zk = ZooKeeperServer(root / "zk", host=net["zk"].address, launch_prefix=net["zk"].exec_prefix,
                                  tick_ms=200)

    def start(self, dependency_on: Sequence[str]) -> Cluster3:
        self.zk.start()
        for w in WORKERS:
            host = self.net[w]
            env = {"PYTHONPATH": str(self.root / "deps")} if w in dependency_on else {}
            # -P: not even the current folder (this repository) is on the worker's path
            host.spawn(w, [sys.executable, "-P", "-m", "conductor.worker", "--zk", self.zk.hosts, "--node-id", w,
                           "--data-dir", str(self.data(w)), "--host", host.address, "--session-timeout", "4",
                           "--insecure"],
                       self.root / f"{w}.log", env=env)
        for w in WORKERS:
            wait_for(lambda w=w: (self.data(w) / "node.address").exists(), 60, f"worker {w} to serve")
        return self

    def data(self, worker: str) -> Path:
        return self.root / "data" / worker

    def code_versions(self, worker: str) -> list[str]:
        code = self.data(worker) / "_code"
        return sorted(p.name for p in code.iterdir()) if code.exists() else []

    def deploy(self, ref: str, *args: str) -> tuple[int, str]:
        r = CliRunner().invoke(app, ["deploy", "--module", ref, "--tasks", "2", "--threads", "1", "--workers", "3",
                                     "--replicationFactor", "3", "--zk", self.zk.hosts, "--timeout", "60", *args])
        return r.exit_code, r.output


@pytest.fixture
def code_dirs(tmp_path: Path) -> Iterator[Path]:
    """Two packages on this process's path only, and a dependency folder given to some workers."""
    src = tmp_path / "src"
    for pkg, text in (("mr_shipping_needy", NEEDS_DEPENDENCY), ("mr_shipping_tally", TALLY)):
        (src / pkg).mkdir(parents=True)
        (src / pkg / "__init__.py").write_text("")
        (src / pkg / "module.py").write_text(textwrap.dedent(text))
    (tmp_path / "deps").mkdir()
    (tmp_path / "deps" / "mr_shipping_dependency.py").write_text("PRESENT = True\n")
    sys.path[:0] = [str(src), str(tmp_path / "deps")]
    try:
        yield tmp_path
    finally:
        for p in (str(src), str(tmp_path / "deps")):
            sys.path.remove(p)
        for name in [n for n in sys.modules if n.startswith("mr_shipping_")]:
            del sys.modules[name]


def test_a_deploy_one_worker_cannot_import_is_refused_and_leaves_nothing(host_network: Build,
                                                                          code_dirs: Path) -> None:
    net = host_network(["zk", *WORKERS])
    c = Cluster3(net, code_dirs).start(dependency_on=["w1", "w2"])
    try:
        code, out = c.deploy("mr_shipping_needy.module:Needy")
        assert code == 1, out
        flat = " ".join(out.split())
        assert ("worker w3: cannot import 'mr_shipping_needy.module' for module 'mr_shipping_needy.module:Needy': "
                "ModuleNotFoundError: No module named "
                "'mr_shipping_dependency'") in flat, out
        assert "worker w1" not in flat and "worker w2" not in flat, "only the worker that cannot import refuses"
        with Metastore(c.zk.hosts) as ms:
            assert ms.modules.names() == []
            assert ms.zk.get_children("/millrace/modules") == []
        assert {w: c.code_versions(w) for w in WORKERS} == {w: [] for w in WORKERS}, \
            "the code is gone from every worker, also from the one it was put on"

        code, out = c.deploy("mr_shipping_tally.module:Tally")
        assert code == 0, out
        with Metastore(c.zk.hosts) as ms:
            spec, _ = ms.modules.get("Tally")
            versions = ms.versions.all("Tally")
        assert spec.code is not None and [v.sha256 for v in versions] == [spec.code]
        assert versions[0].holders == WORKERS and versions[0].kind == "package"
        assert {w: c.code_versions(w) for w in WORKERS} == {w: [spec.code] for w in WORKERS}

        # a client with an empty code cache fetches the code from a worker, checks it and runs with it
        with Cluster.connect(c.zk.hosts, code_cache=CodeCache(code_dirs / "client-cache")) as cluster:
            depot = cluster.depot("Tally", "*events")
            depot.append_many([{"key": f"k{i % 3}"} for i in range(30)], ack="applied")
            tally = cluster.pstate("Tally", "$$tally")
            wait_for(lambda: [tally.select_one(f"k{i}") for i in range(3)] == [10, 10, 10], 30,
                     "the stream topology's counts")
        assert CodeCache(code_dirs / "client-cache").versions() == [spec.code]
    finally:
        c.zk.stop()
