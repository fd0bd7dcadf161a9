"""Workers on separate test hosts bind their settings' address and register the advertised one: a client in
the host namespace appends through them, they replicate to each other across hosts, and their metrics are
served where they say. One worker is set up by flags (binding every interface), the other by a config file
and environment variables."""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import pytest

from conductor.client import Cluster
from conductor.client.handles import Depot
from conductor.controller import Conductor
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.metastore.module_spec import ModuleSpec
from conductor.settings import Listen
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.zkserver import ZooKeeperServer
from tests.integration.cluster_helpers import wait_for
from tests.netns import HostNetwork

pytestmark = pytest.mark.multihost

Build = Callable[[Sequence[str]], HostNetwork]
METRICS_PORT = 9464  # each host is its own network stack: a fixed port is free in a fresh namespace


def group_status(address: str, group: int) -> pb.GroupStatusReply:
    with grpc.insecure_channel(address) as ch:
        return pbg.ClientStub(ch).GroupStatus(pb.GroupStatusRequest(module="Clicks", group=group), timeout=5)


def test_workers_on_separate_hosts_serve_replicate_and_report_at_their_advertised_addresses(
        host_network: Build, tmp_path: Path) -> None:
    net = host_network(["zk", "w1", "w2"])
    zk_host, w1, w2 = net["zk"], net["w1"], net["w2"]
    zk = ZooKeeperServer(tmp_path / "zk", host=zk_host.address, launch_prefix=zk_host.exec_prefix, tick_ms=200)
    zk.start()
    try:
        w1.spawn("w1", [sys.executable, "-m", "conductor.worker", "--zk", zk.hosts, "--node-id", "w1",
                        "--data-dir", str(tmp_path / "w1"), "--host", "0.0.0.0", "--advertise", w1.address,
                        "--session-timeout", "4", "--insecure"], tmp_path / "w1.log")
        config = tmp_path / "w2.toml"
        config.write_text(f'zk = "{zk.hosts}"\n[worker]\nhost = "{w2.address}"\ndata_dir = "{tmp_path / "w2"}"\n'
                          f"metrics_port = {METRICS_PORT}\nport = 7001\nreplication_port = 7003\n")
        w2.spawn("w2", [sys.executable, "-m", "conductor.worker", "--session-timeout", "4"], tmp_path / "w2.log",
                 env={"MILLRACE_CONFIG": str(config), "MILLRACE_NODE_ID": "w2", "MILLRACE_PORT": "7002",
                      "MILLRACE_INSECURE": "1"})
        for name in ("w1", "w2"):
            wait_for(lambda n=name: (tmp_path / n / "node.address").exists(), 60, f"worker {name} to serve")
        a1 = (tmp_path / "w1" / "node.address").read_text()
        a2 = (tmp_path / "w2" / "node.address").read_text()
        assert a1.startswith(f"{w1.address}:"), a1
        assert a2 == f"{w2.address}:7002", "the environment's port beats the config file's"
        with Metastore(zk.hosts) as ms:
            registered = {n: ms.nodes.get(n) for n in ("w1", "w2")}
        assert {n: i.address for n, i in registered.items() if i} == {"w1": a1, "w2": a2}
        # replication links go to a port of their own, on the same advertised address
        r1, r2 = (registered[n].replication if registered[n] else "" for n in ("w1", "w2"))
        assert r1.startswith(f"{w1.address}:") and r1 != a1, r1
        assert r2 == f"{w2.address}:7003", r2

        deployer = Conductor(zk.hosts, "test-deployer")
        deployer.ms.start()
        try:
            deployer.deploy(ModuleSpec(name="Clicks", module_ref="examples.clicks:Clicks", tasks=2, threads=1,
                                       workers=2, replication_factor=2))
        finally:
            deployer.ms.close()
        with Cluster.connect(zk.hosts) as cluster:
            depot = cluster.depot("Clicks", "*clicks")
            wait_for(lambda: _appends(depot), 60, "the first append to be applied")
            depot.append_many([{"user": f"u{i % 7}", "n": i} for i in range(500)], ack="applied")
        statuses = [group_status(a, 0) for a in (a1, a2)]
        assert sorted(s.role for s in statuses) == ["follower", "leader"]
        leader = next(s for s in statuses if s.role == "leader")
        wait_for(lambda: all(group_status(a, 0).applied_offset == leader.applied_offset for a in (a1, a2)), 30,
                 "the follower on the other host to apply everything")

        assert (tmp_path / "w1" / "node.metrics").read_text().startswith(f"{w1.address}:"), \
            "a worker bound to every interface reports its advertised metrics address"
        assert (tmp_path / "w2" / "node.metrics").read_text() == f"{w2.address}:{METRICS_PORT}"
        assert w1.can_connect(w2.address, METRICS_PORT), "metrics are served on the host's own address"
        with urllib.request.urlopen(f"http://{w2.address}:{METRICS_PORT}/metrics", timeout=10) as r:
            body = r.read().decode()
        assert 'millrace_applied_offset{group="0",module="Clicks",node="w2"}' in body
    finally:
        zk.stop()


def _appends(depot: Depot) -> bool:
    try:
        depot.append({"user": "u0", "n": -1}, ack="applied")
        return True
    except Exception:
        return False


def test_a_dev_cluster_binds_and_advertises_the_address_it_is_given(host_network: Build, tmp_path: Path) -> None:
    """`conductor dev --host A`: ZooKeeper and the nodes are reachable from another machine at A."""
    net = host_network(["other"])
    assert net.gateway is not None  # the host namespace's address on the test network
    with DevCluster(tmp_path / "dev", nodes=1, listen=Listen.of(net.gateway, None)) as dc:
        zk_host, zk_port = dc.hosts.rsplit(":", 1)
        node_host, node_port = (dc.node_dir("n1") / "node.address").read_text().rsplit(":", 1)
        assert zk_host == node_host == net.gateway
        assert net["other"].can_connect(zk_host, int(zk_port)) and net["other"].can_connect(node_host, int(node_port))
