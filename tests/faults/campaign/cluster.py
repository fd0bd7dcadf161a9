"""The campaign's cluster: eight test hosts (three ZooKeeper servers, three workers, two conductors).

Every process runs inside its own network namespace (`tests.netns`), so the nemesis can cut any path between
two of them; the campaign itself (clients, ZooKeeper recorder, checker) runs in the host namespace, which
reaches every host unless a host's link is down. Everything started here is stopped here, by pid, and the
network removes what is left by name.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from conductor.controller import Conductor
from conductor.devcluster import ChildProcess
from conductor.metastore import GroupState, Metastore
from conductor.metastore.module_spec import ModuleSpec
from conductor.shipping import deploy_code
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.zkserver import ZooKeeperEnsemble, ZooKeeperServer
from tests.netns import Host, HostNetwork
from topology.artifact import package_code

MODULE = "Campaign"
MODULE_REF = "tests.faults.campaign.module:Campaign"
WORKERS = ("w1", "w2", "w3")
ZOOKEEPERS = ("zk1", "zk2", "zk3")
CONDUCTORS = ("c1", "c2")
#: The worker whose data folder is a small tmpfs when the full-disk fault is on.
FULL_DISK_WORKER = "w3"


@dataclass(frozen=True)
class ClusterSettings:
    """What the campaign's cluster runs with; short timeouts so that faults resolve within a run."""

    session_timeout_s: float = 4.0
    tick_ms: int = 200
    tasks: int = 6
    groups: int = 3
    min_isr: int = 2
    append_timeout_ms: int = 5_000
    #: an ISR member silent this long moves to the OSR (below the append timeout, as the options require)
    max_lag_ms: int = 3_000
    #: size of the full-disk worker's tmpfs (0: an ordinary folder)
    tmpfs_mb: int = 0


def wait_until(cond: object, timeout_s: float, what: str, interval_s: float = 0.1) -> object:
    """Poll `cond()` until it is truthy; its value, or TimeoutError naming `what`."""
    assert callable(cond)
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class FaultCluster:
    """The processes of one run and the knobs the nemesis turns (signals, paths, files)."""

    def __init__(self, root: Path, settings: ClusterSettings) -> None:
        self.root = Path(root)
        self.settings = settings
        self.net = HostNetwork([*ZOOKEEPERS, *WORKERS, *CONDUCTORS])
        self.zk: ZooKeeperEnsemble | None = None
        self.workers: dict[str, ChildProcess] = {}
        self.conductors: dict[str, ChildProcess] = {}
        self._mounted: list[Path] = []

    # ---------------------------------------------------------------- start and stop

    def start(self) -> FaultCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.net.start()
        zk_hosts = [self.net[z] for z in ZOOKEEPERS]
        self.zk = ZooKeeperEnsemble(self.root / "zookeeper", 3, hosts=[h.address for h in zk_hosts],
                                    launch_prefixes=[h.exec_prefix for h in zk_hosts], tick_ms=self.settings.tick_ms)
        self.zk.start(timeout_s=120)
        for c in CONDUCTORS:
            self.start_conductor(c)
        if self.settings.tmpfs_mb:
            d = self.worker_dir(FULL_DISK_WORKER)
            d.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.settings.tmpfs_mb}m", "tmpfs", str(d)],
                           check=True, capture_output=True, timeout=30)
            self._mounted.append(d)
        for w in WORKERS:
            self.start_worker(w)
        for w in WORKERS:
            self.wait_worker(w, 120)
        return self

    @property
    def zk_hosts(self) -> str:
        assert self.zk is not None
        return self.zk.hosts

    def zk_server(self, name: str) -> ZooKeeperServer:
        assert self.zk is not None
        return self.zk.named()[name]

    def host(self, label: str) -> Host:
        return self.net[label]

    def worker_dir(self, w: str) -> Path:
        return self.root / "data" / w

    def group_dir(self, w: str, group: int) -> Path:
        return self.worker_dir(w) / MODULE / str(group)

    def start_worker(self, w: str) -> ChildProcess:
        d = self.worker_dir(w)
        d.mkdir(parents=True, exist_ok=True)
        (d / "node.address").unlink(missing_ok=True)
        host = self.net[w]
        p = host.spawn(w, [sys.executable, "-m", "conductor.worker", "--zk", self.zk_hosts, "--node-id", w,
                           "--data-dir", str(d), "--host", host.address,
                           "--session-timeout", str(self.settings.session_timeout_s), "--log-level", "WARNING",
                           "--insecure"],
                       self.root / "logs" / f"{w}.log")
        self.workers[w] = p
        return p

    def wait_worker(self, w: str, timeout_s: float) -> None:
        p = self.workers[w]

        def up() -> bool:
            if not p.alive():
                raise RuntimeError(f"worker {w} exited while starting; log {p.log_path}:\n{p.tail()}")
            return (self.worker_dir(w) / "node.address").exists()

        wait_until(up, timeout_s, f"worker {w} to serve")

    def start_conductor(self, c: str) -> ChildProcess:
        p = self.net[c].spawn(c, [sys.executable, "-m", "conductor.controller", "--zk", self.zk_hosts, "--name", c,
                                  "--session-timeout", str(self.settings.session_timeout_s),
                                  "--reconcile-interval", "1", "--balance-interval", "0", "--log-level", "INFO"],
                              self.root / "logs" / f"{c}.log")
        self.conductors[c] = p
        return p

    def close(self, keep_files: bool = False) -> None:
        """Stop every process and remove the network and the tmpfs (its files copied beside it first if
        `keep_files`), whatever state they are in."""
        try:
            for p in [*self.workers.values(), *self.conductors.values()]:
                with contextlib.suppress(Exception):
                    p.stop(timeout_s=5)
            if self.zk is not None:
                self.zk.stop()
        finally:
            self.net.close()
            for d in self._mounted:
                if keep_files:
                    with contextlib.suppress(OSError):
                        shutil.copytree(d, d.with_name(d.name + ".tmpfs"), ignore=shutil.ignore_patterns("filler"))
                subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=30, check=False)
            self._mounted.clear()

    def freeze_and_stop(self) -> None:
        """Stop the cluster without changing it: conductors first (no failover while workers stop), then every
        worker frozen at once (SIGSTOP: no replication or leadership change between them), then each stopped
        (SIGCONT, SIGTERM). Their files are then the final state to check."""
        for c in self.conductors.values():
            c.stop(timeout_s=20)
        for p in self.workers.values():
            p.signal(signal.SIGSTOP)
        for p in self.workers.values():
            p.stop(timeout_s=20)

    # ---------------------------------------------------------------- the module

    def deploy(self, timeout_s: float = 120) -> dict[int, GroupState]:
        c = Conductor(self.zk_hosts, "campaign-deployer")
        c.ms.start()
        try:
            spec = ModuleSpec(name=MODULE, module_ref=MODULE_REF, tasks=self.settings.tasks,
                              threads=self.settings.groups, workers=len(WORKERS), replication_factor=len(WORKERS),
                              options={"replication.min.isr": str(self.settings.min_isr),
                                       "replication.max.time.lag.millis": str(self.settings.max_lag_ms),
                                       "replication.depot.append.timeout.millis":
                                           str(self.settings.append_timeout_ms)})
            groups = deploy_code(c, spec, package_code(MODULE_REF))
        finally:
            c.ms.close()
        for g in groups:
            wait_until(lambda g=g: self.serving_leader(g), timeout_s, f"group {g} to have a serving leader")
        return groups

    def groups(self) -> dict[int, GroupState]:
        with Metastore(self.zk_hosts, session_timeout=10.0) as ms:
            return {g: st for g, (st, _v) in ms.groups.all(MODULE).items()}

    def group_status(self, w: str, group: int, timeout_s: float = 2.0) -> pb.GroupStatusReply | None:
        try:
            address = (self.worker_dir(w) / "node.address").read_text()
        except OSError:
            return None
        with grpc.insecure_channel(address) as ch:
            try:
                return pbg.ClientStub(ch).GroupStatus(pb.GroupStatusRequest(module=MODULE, group=group),
                                                      timeout=timeout_s)
            except grpc.RpcError:
                return None

    def serving_leader(self, group: int) -> str | None:
        """The group's leader per ZooKeeper, if it says it leads."""
        try:
            st = self.groups().get(group)
        except Exception:
            return None
        if st is None or st.leader is None:
            return None
        s = self.group_status(st.leader, group)
        return st.leader if s is not None and s.role == "leader" else None

    def converged(self) -> bool:
        """Every group has a full ISR and every replica applied its leader's whole log."""
        groups = self.groups()
        if len(groups) != self.settings.groups:
            return False
        for g, st in groups.items():
            if st.leader is None or len(st.isr) != len(st.replicas):
                return False
            lead = self.group_status(st.leader, g)
            if lead is None or lead.role != "leader" or lead.applied_offset + 1 != lead.log_end:
                return False
            for r in st.replicas:
                s = self.group_status(r, g)
                if s is None or s.log_end != lead.log_end or s.applied_offset != lead.applied_offset:
                    return False
        return True

    def applied_offsets(self, group: int) -> list[int]:
        """The applied offset each live replica of `group` reports now."""
        return [s.applied_offset for w in WORKERS if (s := self.group_status(w, group)) is not None]
