"""Helpers for tests that run a real cluster: deploy, find leaders, wait for convergence, compare replicas."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import grpc

from conductor.controller import Conductor
from conductor.devcluster import DevCluster
from conductor.metastore import GroupState, Metastore
from conductor.metastore.module_spec import ModuleSpec
from conductor.shipping import deploy_code
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.channels import open_channel
from pstate import TaskGroupStore
from replog.log import Log
from topology import load_module
from topology.artifact import package_code

MODULE_REF = "examples.clicks:Clicks"


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def deploy(dc: DevCluster, name: str = "Clicks", tasks: int = 4, threads: int = 2,
           options: dict[str, str] | None = None, module_ref: str = MODULE_REF) -> dict[int, GroupState]:
    c = Conductor(dc.hosts, "test-deployer")
    c.ms.start()
    try:
        spec = ModuleSpec(name=name, module_ref=module_ref, tasks=tasks, threads=threads, workers=3,
                          replication_factor=3, options=options or {})
        groups = deploy_code(c, spec, package_code(module_ref))  # the code ships, as `conductor deploy` does
    finally:
        c.ms.close()
    for g, st in groups.items():
        assert st.leader is not None
        wait_for(lambda g=g, st=st: group_status(dc, st.leader, name, g).role == "leader", 20,
                 f"group {g} leader {st.leader} to serve")
    return groups


def group_status(dc: DevCluster, node_id: str, module: str, group: int) -> pb.GroupStatusReply:
    address = (dc.node_dir(node_id) / "node.address").read_text()
    with open_channel(address) as ch:  # TLS on a secure DevCluster (its operator's certificate)
        try:
            return pbg.ClientStub(ch).GroupStatus(pb.GroupStatusRequest(module=module, group=group), timeout=2)
        except grpc.RpcError:
            return pb.GroupStatusReply(role="unreachable")


def groups_of(dc: DevCluster, module: str) -> dict[int, GroupState]:
    with Metastore(dc.hosts) as ms:
        return {g: st for g, (st, _v) in ms.groups.all(module).items()}


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


def replica_state(root: Path, node_id: str, module: str, group: int, module_ref: str = MODULE_REF) -> dict[str, Any]:
    """Open one replica's replog and store (the node must be stopped) and read everything."""
    definition = load_module(module_ref).build()
    gdir = root / "nodes" / node_id / module / str(group)
    with Log.open(gdir / "replog") as log:
        replog = log.read(log.start_offset, 1 << 30) if log.end_offset > log.start_offset else b""
        end = log.end_offset
    store = TaskGroupStore(gdir / "state", {n: d.schema for n, d in definition.pstates.items()},
                           definition.depot_names())
    try:
        depots = {}
        for d in definition.depot_names():
            for task in range(8):
                rows = store.depot(d).read(task, 0, None, 1 << 30)
                if rows:
                    depots[(d, task)] = rows
        applied = store.applied_offset
    finally:
        store.close()
    return {"replog": replog, "log_end": end, "applied": applied, "depots": depots}


class Background(ABC):
    """A loop (``_run``, until ``_stop`` is set) in a daemon thread: the tests' writers and readers."""

    join_timeout_s = 60.0  #: how long :meth:`stop` waits for the loop to finish

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @abstractmethod
    def _run(self) -> None:
        """The loop; it returns once ``_stop`` is set."""

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=self.join_timeout_s)


class Appender(Background):
    """Appends continuously from a thread (a window of async appends); records what was acknowledged."""

    join_timeout_s = 90.0

    def __init__(self, depot: Any, ack: str = "applied", window: int = 64, prefix: str = "r",
                 users: int = 13, make: Callable[[int], dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.depot = depot
        self.make = make or (lambda n: {"user": f"u{n % users}", "id": f"{prefix}{n}"})
        self.ack = ack
        self.window = window
        self.acked: list[dict[str, Any]] = []
        self.failed = 0
        self.errors: list[Exception] = []
        self._n = 0
        self.last_ack = time.monotonic()

    def _run(self) -> None:
        inflight: list[tuple[dict[str, Any], Any]] = []
        while not self._stop.is_set() or inflight:
            while not self._stop.is_set() and len(inflight) < self.window:
                rec = self.make(self._n)
                self._n += 1
                inflight.append((rec, self.depot.append_async(rec, ack=self.ack)))
            rec, fut = inflight.pop(0)
            try:
                fut.result(timeout=60)
                self.acked.append(rec)
                self.last_ack = time.monotonic()
            except Exception as e:
                self.failed += 1
                self.errors.append(e)

    def count(self) -> int:
        return len(self.acked)


class Writer(Background):
    """Appends unique values in a thread with one blocking call per step; records what was acknowledged."""

    join_timeout_s = 120.0

    def __init__(self, step: Callable[[list[dict[str, Any]]], object], make: Callable[[int], list[dict[str, Any]]]):
        super().__init__()
        self.step = step
        self.make = make
        self.acked: list[dict[str, Any]] = []
        self.errors: list[Exception] = []
        self._n = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            recs = self.make(self._n)
            self._n += 1
            try:
                self.step(recs)
                self.acked.extend(recs)
            except Exception as e:  # failed after the client's own retries: not acknowledged
                self.errors.append(e)
                time.sleep(0.2)

    def count(self) -> int:
        return len(self.acked)


def assert_replicas_identical(dc: DevCluster, module: str, acked: list[dict], module_ref: str = MODULE_REF) -> None:
    """Stop the cluster, then every replica of every group holds the same replog bytes and depot records."""
    groups = groups_of(dc, module)
    dc.stop()
    seen: Counter[str] = Counter()
    for g, st in groups.items():
        states = {r: replica_state(dc.root, r, module, g, module_ref) for r in st.replicas}
        first = states[st.replicas[0]]
        for r, s in states.items():
            assert s["log_end"] == first["log_end"], f"group {g}: {r} log end {s['log_end']} != {first['log_end']}"
            assert s["replog"] == first["replog"], f"group {g}: replica {r}'s replog differs"
            assert s["depots"] == first["depots"], f"group {g}: replica {r}'s depot records differ"
            assert s["applied"] == first["log_end"] - 1
        for rows in first["depots"].values():
            seen.update(rec["id"] for _off, rec in rows)
    missing = [r["id"] for r in acked if seen[r["id"]] == 0]
    assert not missing, f"{len(missing)} acknowledged record(s) lost, e.g. {missing[:5]}"
