"""A local cluster of real processes: ZooKeeper (one server or an ensemble), conductor(s) and worker nodes.

`conductor dev` and the integration tests use the same class, so what the
tests prove is what a developer runs. Every process is a child started in its
own session with its own log file, and is stopped by its own pid.

``secure=True`` makes a CA and certificates under ``<root>/pki`` (a worker
certificate per node, one per conductor, ``admin/dev`` for the CLI and
``app/dev`` for an app) and starts every process with mutual TLS;
:meth:`DevCluster.connect` hands out a client authenticated as ``app/dev`` (or
any identity the cluster's CA issues on the spot). It also protects ZooKeeper: a digest
principal written 0600 to ``<root>/zk-auth`` is every conductor's and worker's
``--zk-auth``, so only they (and this process, the operator) can change the
cluster's znodes; apps still read what routing needs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor.client import Cluster
from conductor.metastore import Metastore
from conductor.metastore.zk_auth import (
    ZkPrincipal,
    ZkRoles,
    digest_id,
    publish_roles,
    read_principal,
    use_process_principal,
    write_principal,
)
from conductor.security import certs
from conductor.security.acl import APPEND, QUERY
from conductor.security.identity import Identity
from conductor.security.tls import TlsFiles, TlsSource
from conductor.settings import Listen, is_loopback
from conductor.wire.channels import use_process_credentials
from conductor.zkserver import ZooKeeperEnsemble

PYTHON = sys.executable


@dataclass
class ChildProcess:
    """One child process we own: how to start it again, where it logs, its pid."""

    name: str
    cmd: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ChildProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(self.cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env={**os.environ, **self.env})
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL and reap: the crash case."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (SIGCONT first, in case a test stopped it), then SIGKILL."""
        if not self.alive():
            return
        assert self.proc is not None
        try:
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        except ProcessLookupError:
            pass

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class DevCluster:
    """`zk_servers` ZooKeeper servers + `conductors` conductor processes + `nodes` worker nodes under one folder.

    Every conductor and node gets the connect string naming all ZooKeeper servers, so with three of them
    losing one changes nothing for the cluster. ZooKeeper and the nodes bind `listen.host` and are reached
    at `listen.advertise` (loopback by default; other machines can join a dev cluster that binds a
    reachable address).
    """

    def __init__(self, root: Path, nodes: int = 3, conductors: int = 1, session_timeout: float = 4.0,
                 log_level: str = "WARNING", balance_interval: float | None = None, zk_servers: int = 1,
                 listen: Listen = Listen(), worker: Sequence[str] = ("-m", "conductor.worker"),
                 ui_port: int | None = None, secure: bool = False) -> None:
        self.root = Path(root)
        #: every process serves and dials mutual TLS with certificates from `pki` (made at start)
        self.secure = secure
        self.pki = self.root / "pki"
        #: the control plane's ZooKeeper digest credentials (`--zk-auth`), written at start when secure
        self.zk_auth_file = self.root / "zk-auth"
        #: the workers' own digest credentials: they write their node znodes and the group znodes, nothing else
        self.zk_worker_auth_file = self.root / "zk-auth-worker"
        #: how a node starts, after the interpreter and before its settings (a test passes its own launcher)
        self.worker = tuple(worker)
        #: the first conductor's web UI port (0: a free one); None: no UI (tests run side by side on 8888)
        self.ui_port = ui_port
        self.listen = listen
        #: the conductors' --balance-interval (None: their default; 0: no periodic balancing)
        self.balance_interval = balance_interval
        self.session_timeout = session_timeout
        self.log_level = log_level
        self.zk = ZooKeeperEnsemble(self.root / "zookeeper", zk_servers, hosts=[listen.host] * zk_servers,
                                    advertise=[listen.advertise] * zk_servers)
        self.conductors: dict[str, ChildProcess] = {}
        self.nodes: dict[str, ChildProcess] = {}
        self._n_nodes = nodes
        self._n_conductors = conductors

    @property
    def hosts(self) -> str:
        return self.zk.hosts

    #: the identities a secure dev cluster issues besides its workers and conductors (the CLI's, an app's)
    ADMIN = Identity("admin", "dev")
    APP = Identity("app", "dev")

    def issue(self, identity: Identity) -> TlsFiles:
        """Certificate and key for `identity` from this cluster's CA (made on first use), for the advertised
        address: what `--tls-dir <root>/pki` finds."""
        if not (self.pki / certs.CA_KEY).exists():
            certs.init_ca_dir(self.pki, name="Millrace dev cluster CA")
        hosts = sorted({self.listen.advertise, "127.0.0.1", "localhost"})
        certs.issue_to_dir(self.pki, identity, hosts=hosts)
        return TlsFiles.in_dir(self.pki, identity)

    def tls_args(self, identity: Identity) -> list[str]:
        """A child's TLS and ZooKeeper-auth flags; its certificate is issued if missing. A plaintext dev cluster
        bound to a reachable address is plaintext on purpose (`conductor dev` says so): ``--insecure``."""
        if not self.secure:
            return [] if is_loopback(self.listen.host) else ["--insecure"]
        if not TlsFiles.in_dir(self.pki, identity).cert.exists():
            self.issue(identity)
        # workers authenticate as their own ZooKeeper user (zk_auth.ZkRoles): they may write only what they must
        zk_file = self.zk_worker_auth_file if identity.role == "worker" else self.zk_auth_file
        if identity.role == "worker":
            self.zk_worker_principal()
        return ["--tls-dir", str(self.pki), "--zk-auth", str(zk_file)]

    def zk_worker_principal(self) -> ZkPrincipal:
        """The workers' ZooKeeper digest principal (``zk_worker_auth_file``, made 0600 on first use)."""
        if not self.zk_worker_auth_file.exists():
            write_principal(self.zk_worker_auth_file, ZkPrincipal.generate("millrace-worker"))
        return read_principal(self.zk_worker_auth_file)

    def zk_principal(self) -> ZkPrincipal:
        """The control plane's ZooKeeper digest principal: the one in ``zk_auth_file``, made (0600) on first use."""
        if not self.zk_auth_file.exists():
            write_principal(self.zk_auth_file, ZkPrincipal.generate("millrace"))
        return read_principal(self.zk_auth_file)

    def operate_as(self, identity: Identity) -> None:
        """Make this process the cluster's operator: every channel it opens without its own credentials
        (deploys, code shipping, status, a test's helpers) presents `identity`'s certificate, as the CLI does."""
        use_process_credentials(TlsSource(TlsFiles.in_dir(self.pki, identity)).grpc_channel_credentials)
        use_process_principal(self.zk_principal())  # and every Metastore it opens may change the cluster's znodes

    def connect(self, identity: Identity | None = None, **kwargs: Any) -> Cluster:
        """A client of this cluster: authenticated as `identity` (default app/dev) when it is secure."""
        if not self.secure:
            return Cluster.connect(self.hosts, **kwargs)
        identity = identity or self.APP
        files = TlsFiles.in_dir(self.pki, identity)
        if not files.cert.exists():
            self.issue(identity)
        return Cluster.connect(self.hosts, tls=files, **kwargs)

    def start(self, timeout_s: float = 60.0) -> DevCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            if self.secure:  # (this process becomes the operator: `operate_as`)
                for identity in (self.ADMIN, self.APP):
                    self.issue(identity)
                self.operate_as(self.ADMIN)
            self.zk.start()
            if self.secure:
                self._grant_dev_app()
            for i in range(1, self._n_conductors + 1):
                self.start_conductor(f"c{i}")
            for i in range(1, self._n_nodes + 1):
                self.start_node(f"n{i}")
            self.wait_nodes(list(self.nodes), timeout_s)
        except BaseException:
            self.stop()
            raise
        self.write_state()
        return self

    def _grant_dev_app(self) -> None:
        """A development convenience: ``app/dev`` may append to and query every module (``*``), so an app
        connected with :meth:`connect` works at once; the workers check every call against the ACLs."""
        ms = Metastore(self.hosts, zk_auth=self.zk_principal())
        ms.start()
        try:
            # the workers' own ZooKeeper user, before any worker starts (docs/security.md)
            publish_roles(ms.zk, ZkRoles(digest_id(self.zk_principal()), digest_id(self.zk_worker_principal())))
            ms.acls.grant(self.APP, "*", [APPEND, QUERY])
        finally:
            ms.close()

    def start_conductor(self, name: str) -> ChildProcess:
        p = ChildProcess(name, [PYTHON, "-m", "conductor.controller", "--zk", self.hosts, "--name", name,
                                "--session-timeout", str(self.session_timeout), "--reconcile-interval", "1",
                                "--log-level", "INFO", "--host", self.listen.host,
                                "--ui-port", "off" if self.ui_port is None or self.conductors else str(self.ui_port),
                                *(["--balance-interval", str(self.balance_interval)]
                                  if self.balance_interval is not None else []),
                                *self.tls_args(Identity("conductor", name))],
                         self.root / "logs" / f"conductor-{name}.log")
        self.conductors[name] = p.start()
        return p

    def node_dir(self, node_id: str) -> Path:
        return self.root / "nodes" / node_id

    def start_node(self, node_id: str) -> ChildProcess:
        d = self.node_dir(node_id)
        d.mkdir(parents=True, exist_ok=True)
        (d / "node.address").unlink(missing_ok=True)
        p = ChildProcess(node_id, [PYTHON, *self.worker, "--zk", self.hosts, "--node-id", node_id,
                                   "--data-dir", str(d), "--session-timeout", str(self.session_timeout),
                                   "--host", self.listen.host, "--advertise", self.listen.advertise,
                                   "--log-level", self.log_level, *self.tls_args(Identity("worker", node_id))],
                         self.root / "logs" / f"node-{node_id}.log")
        self.nodes[node_id] = p.start()
        return p

    def wait_nodes(self, node_ids: list[str], timeout_s: float = 60.0) -> None:
        """Until every node wrote its address file (it serves gRPC and is registered in ZooKeeper)."""
        deadline = time.monotonic() + timeout_s
        for nid in node_ids:
            while not (self.node_dir(nid) / "node.address").exists():
                p = self.nodes[nid]
                if not p.alive():
                    raise RuntimeError(f"node {nid} exited during start-up; log {p.log_path}:\n{p.tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"node {nid} did not start within {timeout_s}s; log {p.log_path}:\n{p.tail()}")
                time.sleep(0.05)

    def write_state(self) -> None:
        state: dict[str, Any] = {
            "zk": self.hosts, "zookeeper": {n: s.pid for n, s in self.zk.named().items()}, "root": str(self.root),
            "conductors": {n: p.pid for n, p in self.conductors.items()},
            "nodes": {n: p.pid for n, p in self.nodes.items()},
        }
        if self.secure:
            state["tls_dir"] = str(self.pki)
            state["zk_auth"] = str(self.zk_auth_file)
        if self.ui_port:
            state["ui"] = f"{'https' if self.secure else 'http'}://{self.listen.advertised(self.ui_port)}/"
        (self.root / "cluster.json").write_text(json.dumps(state, indent=2))

    def stop(self) -> None:
        for p in [*self.nodes.values(), *self.conductors.values()]:
            p.stop()
        self.zk.stop()
        if self.secure:
            use_process_credentials(None)
            use_process_principal(None)

    def __enter__(self) -> DevCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not reaped: `conductor dev` is not its parent) is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _stop_pids(pids: list[tuple[str, int]], timeout_s: float) -> list[str]:
    stopped = []
    for name, pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
            stopped.append(f"{name} (pid {pid})")
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + timeout_s
    for _name, pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return stopped


def zookeeper_pids(state: dict[str, Any]) -> dict[str, int]:
    """The ZooKeeper servers a `conductor dev` state file records (one `zk_pid` before ensembles existed)."""
    if "zookeeper" in state:
        return {n: int(pid) for n, pid in state["zookeeper"].items()}
    return {"zk1": int(state["zk_pid"])}


def stop_from_state(root: Path) -> list[str]:
    """`conductor dev --stop`: stop what a previous `conductor dev` started, by the pids it recorded.

    Nodes and conductors go first, ZooKeeper last: they close their sessions
    cleanly only while ZooKeeper still answers.
    """
    state = json.loads((root / "cluster.json").read_text())
    stopped = _stop_pids([*state["nodes"].items(), *state["conductors"].items()], 15)
    stopped += _stop_pids([(f"zookeeper {n}", pid) for n, pid in zookeeper_pids(state).items()], 15)
    (root / "cluster.json").unlink(missing_ok=True)
    return stopped
