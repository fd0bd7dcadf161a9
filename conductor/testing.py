"""Test helpers for apps and for Millrace's own tests: deploy onto a DevCluster, find and wait for leaders,
kill, pause and restart workers, check convergence.

A real RF=3 cluster (ZooKeeper, a conductor, three worker processes) is the
only honest place to test what replication promises; these helpers are what
the pytest plugin (``conductor.pytest_plugin``) hands to an app's tests, and
what this repository's integration tests use.
"""

from __future__ import annotations

import functools
import signal
import time
from collections.abc import Callable
from typing import Any

import grpc

from conductor.controller import Conductor
from conductor.devcluster import DevCluster
from conductor.metastore import GroupState, Metastore
from conductor.metastore.module_spec import ModuleSpec
from conductor.shipping import deploy_code
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.channels import open_channel
from topology.artifact import package_code


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll `cond` until it returns something truthy (returned), or fail saying what never happened."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def deploy(dc: DevCluster, module_ref: str, name: str | None = None, tasks: int = 4, threads: int = 2,
           options: dict[str, str] | None = None, replication_factor: int = 3) -> dict[int, GroupState]:
    """Ship `module_ref`'s package and deploy it as `conductor deploy` does; returns once every group's
    leader serves. `name` defaults to the class name."""
    name = name or module_ref.rsplit(":", 1)[-1]
    c = Conductor(dc.hosts, "test-deployer")
    c.ms.start()
    try:
        spec = ModuleSpec(name=name, module_ref=module_ref, tasks=tasks, threads=threads,
                          workers=replication_factor, replication_factor=replication_factor, options=options or {})
        groups = deploy_code(c, spec, package_code(module_ref))
    finally:
        c.ms.close()
    for g, st in groups.items():
        leader = st.leader
        assert leader is not None
        wait_for(functools.partial(serves_as_leader, dc, leader, name, g), 20, f"group {g} leader {leader} to serve")
    return groups


def group_status(dc: DevCluster, node_id: str, module: str, group: int) -> pb.GroupStatusReply:
    """What `node_id`'s replica of the group says about itself (role "unreachable" if the node does not answer)."""
    address = (dc.node_dir(node_id) / "node.address").read_text()
    with open_channel(address) as ch:  # TLS on a secure DevCluster (its operator's certificate)
        try:
            reply: pb.GroupStatusReply = pbg.ClientStub(ch).GroupStatus(
                pb.GroupStatusRequest(module=module, group=group), timeout=2)
            return reply
        except grpc.RpcError:
            return pb.GroupStatusReply(role="unreachable")


def serves_as_leader(dc: DevCluster, node_id: str, module: str, group: int) -> bool:
    return group_status(dc, node_id, module, group).role == "leader"


def groups_of(dc: DevCluster, module: str) -> dict[int, GroupState]:
    """Every task group's state in ZooKeeper (leader, epoch, replicas, ISR)."""
    with Metastore(dc.hosts) as ms:
        return {g: st for g, (st, _v) in ms.groups.all(module).items()}


def wait_for_leader(dc: DevCluster, module: str, group: int, timeout_s: float = 30.0,
                    not_on: str | None = None) -> str:
    """The node whose replica of the group is leader and serving (not `not_on`, e.g. a node just killed)."""
    def serving_leader() -> str | None:
        leader = groups_of(dc, module)[group].leader
        if leader is None or leader == not_on or not dc.nodes[leader].alive():
            return None
        return leader if serves_as_leader(dc, leader, module, group) else None

    leader: str = wait_for(serving_leader, timeout_s, f"a serving leader of {module} group {group}")
    return leader


def kill_worker(dc: DevCluster, node_id: str) -> None:
    """SIGKILL the worker process (a crash: no clean shutdown, its disk stays as it was)."""
    dc.nodes[node_id].kill()


def pause_worker(dc: DevCluster, node_id: str) -> None:
    """SIGSTOP the worker: alive to the OS, silent to everyone (a long GC pause, a hung machine)."""
    dc.nodes[node_id].signal(signal.SIGSTOP)


def resume_worker(dc: DevCluster, node_id: str) -> None:
    dc.nodes[node_id].signal(signal.SIGCONT)


def restart_worker(dc: DevCluster, node_id: str, timeout_s: float = 60.0) -> None:
    """Start the worker again on its data folder (after kill_worker) and wait until it serves."""
    dc.nodes[node_id].stop()
    dc.start_node(node_id)
    dc.wait_nodes([node_id], timeout_s)


def converged(dc: DevCluster, module: str, require_full_isr: bool = True) -> bool:
    """Every replica of every group applied its leader's whole log (and the ISR is full, if asked)."""
    for g, st in groups_of(dc, module).items():
        if st.leader is None or (require_full_isr and len(st.isr) != len(st.replicas)):
            return False
        lead = group_status(dc, st.leader, module, g)
        if lead.role != "leader" or lead.applied_offset + 1 != lead.log_end:
            return False
        for r in st.replicas:
            s = group_status(dc, r, module, g)
            if s.log_end != lead.log_end or s.applied_offset != lead.applied_offset:
                return False
    return True
