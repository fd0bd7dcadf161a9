"""The campaign's cluster: eight test hosts (three ZooKeeper servers, three workers, two conductors).

Every process runs inside its own network namespace (`tests.netns`), so the nemesis can cut any path between
two of them; the campaign itself (clients, ZooKeeper recorder, checker) runs in the host namespace, which
reaches every host unless a host's link is down. Everything started here is stopped here, by pid, and the
network removes what is left by name.

``ClusterSettings(secure=True)`` (``--secure``) runs it as a real deployment does (issue 26): a CA in the run's
folder issues each worker and conductor a certificate naming its host's address, an operator (``admin/campaign``:
the deploy and the status probes) and the app the clients run as (``app/campaign``, granted append and query on
the module only); every gRPC and replication link is mutual TLS, every worker call is authorised, and conductors and
workers authenticate to ZooKeeper with a digest (``--zk-auth``), so nobody else can change a group znode.
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
from conductor.metastore.zk_auth import ZkPrincipal, write_principal
from conductor.security import certs
from conductor.security.acl import APPEND, QUERY
from conductor.security.identity import Identity
from conductor.security.tls import TlsFiles, TlsSource
from conductor.shipping import deploy_code
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.channels import open_channel, use_process_credentials
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
#: a secure run's operator (deploys, status probes) and the app its clients append as
OPERATOR, APP = Identity("admin", "campaign"), Identity("app", "campaign")


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
    #: mutual TLS on every link, authorization on every worker, ZooKeeper digest auth (`--secure`)
    secure: bool = False
    #: the module's replication.fsync (`--fsync`): always, or interval (acknowledged from the page cache)
    fsync: str = "always"
    #: the module's replication.flush.ms in interval mode (`--flush-ms`)
    flush_ms: int = 100


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
        self.pki = self.root / "pki"
        self.zk_auth_file = self.root / "zk-auth"
        self._principal: ZkPrincipal | None = None

    # ---------------------------------------------------------------- start and stop

    def start(self) -> FaultCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.net.start()
        if self.settings.secure:
            self._make_credentials()
        zk_hosts = [self.net[z] for z in ZOOKEEPERS]
        self.zk = ZooKeeperEnsemble(self.root / "zookeeper", 3, hosts=[h.address for h in zk_hosts],
                                    launch_prefixes=[h.exec_prefix for h in zk_hosts], tick_ms=self.settings.tick_ms)
        self.zk.start(timeout_s=120)
        if self._principal is not None:  # (the first znodes, made writable by the digest alone)
            with Metastore(self.zk_hosts, session_timeout=10.0, zk_auth=self._principal) as ms:
                ms.acls.grant(APP, MODULE, [APPEND, QUERY])
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

    def _make_credentials(self) -> None:
        """A CA and every process's certificate (a server's names its host's address: clients check it), the
        ZooKeeper digest file (0600); this process becomes the operator (every channel it opens without its own
        credentials presents ``admin/campaign``)."""
        certs.init_ca_dir(self.pki, name="Millrace campaign CA")
        for label in (*WORKERS, *CONDUCTORS):
            role = "worker" if label in WORKERS else "conductor"
            certs.issue_to_dir(self.pki, Identity(role, label), hosts=[self.net[label].address])
        for identity in (OPERATOR, APP):
            certs.issue_to_dir(self.pki, identity)
        self._principal = ZkPrincipal.generate("millrace")
        write_principal(self.zk_auth_file, self._principal)
        use_process_credentials(TlsSource(TlsFiles.in_dir(self.pki, OPERATOR)).grpc_channel_credentials)

    def security_args(self) -> list[str]:
        """A worker's or conductor's TLS and ZooKeeper-auth flags (none for a plaintext run)."""
        if not self.settings.secure:
            return []
        return ["--tls-dir", str(self.pki), "--zk-auth", str(self.zk_auth_file)]

    def app_tls(self) -> TlsFiles | None:
        """The campaign clients' certificate (None: a plaintext run)."""
        return TlsFiles.in_dir(self.pki, APP) if self.settings.secure else None

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
                           *(self.security_args() or ["--insecure"])],  # (a plaintext run binds the host's
                                                                        # address in plaintext on purpose)
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
                                  "--reconcile-interval", "1", "--balance-interval", "0", "--log-level", "INFO",
                                  *self.security_args()],
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
            if self.settings.secure:
                use_process_credentials(None)

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
        c = Conductor(self.zk_hosts, "campaign-deployer", zk_auth=self._principal)
        c.ms.start()
        try:
            spec = ModuleSpec(name=MODULE, module_ref=MODULE_REF, tasks=self.settings.tasks,
                              threads=self.settings.groups, workers=len(WORKERS), replication_factor=len(WORKERS),
                              options={"replication.min.isr": str(self.settings.min_isr),
                                       "replication.max.time.lag.millis": str(self.settings.max_lag_ms),
                                       "replication.depot.append.timeout.millis":
                                           str(self.settings.append_timeout_ms),
                                       "replication.fsync": self.settings.fsync,
                                       "replication.flush.ms": str(self.settings.flush_ms)})
            groups = deploy_code(c, spec, package_code(MODULE_REF))
        finally:
            c.ms.close()
        for g in groups:
            wait_until(lambda g=g: self.serving_leader(g), timeout_s, f"group {g} to have a serving leader")
        return groups

    def metastore(self) -> Metastore:
        """A session (not started) that may write what the conductors write (the digest, on a secure run)."""
        return Metastore(self.zk_hosts, session_timeout=10.0, zk_auth=self._principal)

    def groups(self) -> dict[int, GroupState]:
        with Metastore(self.zk_hosts, session_timeout=10.0) as ms:
            return {g: st for g, (st, _v) in ms.groups.all(MODULE).items()}

    def group_status(self, w: str, group: int, timeout_s: float = 2.0) -> pb.GroupStatusReply | None:
        try:
            address = (self.worker_dir(w) / "node.address").read_text()
        except OSError:
            return None
        with open_channel(address) as ch:  # (a secure run: the operator's certificate)
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
