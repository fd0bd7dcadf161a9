"""Real ZooKeeper servers run as child processes: one standalone server, or an ensemble of several.

Used by `conductor dev`, `conductor doctor` and the tests, so all of them start
ZooKeeper the same way: a client address (loopback unless told otherwise), free
ports, a data folder per server, and stopped by its own pid. A server can be
launched behind a command prefix (``ip netns exec NS``), which is how the
multi-host tests put each server of an ensemble on its own test host.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from conductor.runtime_env import EnvironmentBroken, free_port, zookeeper_classpath

log = logging.getLogger("millrace.zookeeper")

LOOPBACK = "127.0.0.1"
#: Ticks a follower may take to connect and sync to a leader (initLimit), and to stay in step (syncLimit);
#: ZooKeeper's sample configuration values. A follower silent for SYNC_LIMIT ticks is dropped by the leader.
INIT_LIMIT_TICKS = 10
SYNC_LIMIT_TICKS = 5


@dataclass(frozen=True)
class QuorumPeer:
    """One member of an ensemble as every member's zoo.cfg names it."""

    server_id: int
    host: str
    peer_port: int
    election_port: int

    def config_line(self) -> str:
        return f"server.{self.server_id}={self.host}:{self.peer_port}:{self.election_port}"


class ZooKeeperServer:
    """Owns one ZooKeeper JVM; `hosts` is its own connect string for kazoo.

    Without `peers` it is a standalone server (ZooKeeperServerMain). With them it
    is member `server_id` of that ensemble (QuorumPeerMain): it binds its client
    port on `host` and its quorum and election ports on its own peer entry, and it
    serves sessions only while it is in a quorum.
    """

    def __init__(self, data_dir: Path, port: int | None = None, tick_ms: int = 500,
                 max_session_timeout_ms: int = 60_000, *, host: str = LOOPBACK, server_id: int | None = None,
                 peers: Sequence[QuorumPeer] = (), launch_prefix: Sequence[str] = ()) -> None:
        if peers:
            own = [p for p in peers if p.server_id == server_id]
            if len(own) != 1 or own[0].host != host:
                raise ValueError(f"server id {server_id} on {host} must be exactly one of the peers "
                                 f"{[p.config_line() for p in peers]}")
            if len({p.server_id for p in peers}) != len(peers):
                raise ValueError(f"peer server ids repeat: {[p.config_line() for p in peers]}")
        elif server_id is not None:
            raise ValueError("a server id means an ensemble member: pass its peers too")
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.tick_ms = tick_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.host = host
        self.server_id = server_id
        self.peers = tuple(peers)
        #: prepended to the java command line, e.g. ``("ip", "netns", "exec", "ns1")``; it must exec the
        #: command in place so that our pid is the JVM's
        self.launch_prefix = tuple(launch_prefix)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _write_config(self) -> Path:
        data = self.data_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        # minSessionTimeout = 2 ticks: tests use short sessions to make failover quick.
        lines = [
            f"tickTime={self.tick_ms}",
            f"dataDir={data}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            "admin.enableServer=false",
            f"minSessionTimeout={2 * self.tick_ms}",
            f"maxSessionTimeout={self.max_session_timeout_ms}",
            "4lw.commands.whitelist=ruok,srvr,stat,cons",
            "maxClientCnxns=0",
            # KB; the default 64 MB of zeros written (and fsynced) before the first session could be created
            # took over 10 s on a busy 2-core box and timed a test's first connection out.
            "preAllocSize=4096",
        ]
        if self.peers:
            (data / "myid").write_text(f"{self.server_id}\n")
            lines += [f"initLimit={INIT_LIMIT_TICKS}", f"syncLimit={SYNC_LIMIT_TICKS}",
                      *(p.config_line() for p in self.peers)]
        cfg.write_text("\n".join(lines) + "\n")
        return cfg

    def command(self) -> list[str]:
        """The command line that runs this server (after writing its zoo.cfg)."""
        cfg = self._write_config()
        main = "org.apache.zookeeper.server.quorum.QuorumPeerMain" if self.peers \
            else "org.apache.zookeeper.server.ZooKeeperServerMain"
        # An election connection to a peer whose packets vanish waits cnxTimeout (default 5 s) per attempt, which
        # stalls the election that follows that peer's loss; syncLimit ticks is the patience a follower already has.
        cnx_timeout_ms = SYNC_LIMIT_TICKS * self.tick_ms
        return [*self.launch_prefix, "java", "-Xmx256m", "-Dzookeeper.jmx.log4j.disable=true",
                f"-Dzookeeper.cnxTimeout={cnx_timeout_ms}", "-cp", zookeeper_classpath(), main, str(cfg)]

    def launch(self) -> ZooKeeperServer:
        """Start the JVM without waiting for it: an ensemble member can serve only once a quorum is up."""
        if self.alive():
            raise RuntimeError(f"ZooKeeper {self.hosts} is already running (pid {self.pid})")
        cmd = self.command()
        logf = open(self.log_path, "ab")  # noqa: SIM115 - the child owns the handle for its life
        try:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            logf.close()
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> ZooKeeperServer:
        """Wait until ZooKeeper answers `ruok` and accepts a session; stop it and raise with its log tail
        otherwise."""
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EnvironmentBroken(
                    f"ZooKeeper exited with code {self.proc.returncode}; log {self.log_path}:\n{self._tail()}"
                )
            if self.ruok() and self._accepts_sessions(deadline - time.monotonic()):
                log.info("ZooKeeper pid %s serving on %s (data %s)", self.proc.pid, self.hosts, self.data_dir)
                return self
            time.sleep(0.1)
        self.stop()
        raise EnvironmentBroken(f"ZooKeeper did not answer on {self.hosts} within {timeout_s}s:\n{self._tail()}")

    def start(self, timeout_s: float = 30.0) -> ZooKeeperServer:
        """Launch, then wait until ready (a standalone server, or a member whose quorum is already up)."""
        return self.launch().wait_ready(timeout_s)

    def _accepts_sessions(self, timeout_s: float) -> bool:
        """Open and close one session: `ruok` answers before the server can create the first one."""
        from kazoo.client import KazooClient
        from kazoo.handlers.threading import KazooTimeoutError

        quiet = logging.getLogger("millrace.zookeeper.readiness")  # "connection dropped" is expected here
        quiet.setLevel(logging.ERROR)
        zk = KazooClient(hosts=self.hosts, logger=quiet)
        try:
            zk.start(timeout=max(1.0, timeout_s))
        except KazooTimeoutError:
            return False
        finally:
            zk.stop()
            zk.close()
        return True

    def four_letter(self, word: str, timeout_s: float = 1.0) -> str | None:
        return four_letter(self.host, self.port, word, timeout_s)

    def ruok(self) -> bool:
        """ZooKeeper's health check: the process answers (it says nothing about having a quorum)."""
        return self.four_letter("ruok") == "imok"

    def mode(self) -> str | None:
        return server_mode(self.host, self.port)

    def kill(self) -> None:
        """SIGKILL and reap: a server lost without warning."""
        if self.alive():
            assert self.proc is not None
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL, by our own pid; safe to call twice."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        except ProcessLookupError:
            pass

    def _tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def four_letter(host: str, port: int, word: str, timeout_s: float = 1.0) -> str | None:
    """Send one of ZooKeeper's four-letter commands; its answer, or None if the server did not answer."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(word.encode())
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None


def server_mode(host: str, port: int) -> str | None:
    """'standalone', 'leader' or 'follower' while the server serves; None while it does not (no quorum, or
    down)."""
    for line in (four_letter(host, port, "srvr") or "").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


def _distinct_free_ports(n: int) -> list[int]:
    """`n` different free loopback ports (two calls of free_port may return the same one)."""
    ports: list[int] = []
    while len(ports) < n:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


class ZooKeeperEnsemble:
    """`size` ZooKeeper servers forming one quorum; `hosts` is the connect string naming every one.

    Server i (1-based) keeps its files under ``root/zk<i>``, binds on ``hosts[i-1]`` (default loopback)
    and is launched behind ``launch_prefixes[i-1]`` if given. Ports are free loopback ports, distinct
    across the ensemble so that several members can share one address. A size of 1 is a standalone
    server, so one code path serves `conductor dev` with one server or three.
    """

    def __init__(self, root: Path, size: int = 3, *, hosts: Sequence[str] | None = None,
                 launch_prefixes: Sequence[Sequence[str]] | None = None, tick_ms: int = 500,
                 max_session_timeout_ms: int = 60_000) -> None:
        if size < 1:
            raise ValueError(f"an ensemble needs at least one server, got {size}")
        addrs = list(hosts) if hosts is not None else [LOOPBACK] * size
        prefixes = [tuple(p) for p in launch_prefixes] if launch_prefixes is not None else [()] * size
        if len(addrs) != size or len(prefixes) != size:
            raise ValueError(f"{size} servers need {size} hosts and launch prefixes, got {addrs} and {prefixes}")
        self.root = Path(root)
        ports = _distinct_free_ports(3 * size)
        peers = [QuorumPeer(i + 1, addrs[i], ports[3 * i + 1], ports[3 * i + 2]) for i in range(size)] \
            if size > 1 else []
        self.servers = [
            ZooKeeperServer(self.root / f"zk{i + 1}", ports[3 * i], tick_ms, max_session_timeout_ms, host=addrs[i],
                            server_id=i + 1 if peers else None, peers=peers, launch_prefix=prefixes[i])
            for i in range(size)
        ]

    @property
    def hosts(self) -> str:
        return ",".join(s.hosts for s in self.servers)

    def named(self) -> dict[str, ZooKeeperServer]:
        """Each server by its name, zk1..zkN (its folder under root)."""
        return {s.data_dir.name: s for s in self.servers}

    def start(self, timeout_s: float = 60.0) -> ZooKeeperEnsemble:
        """Launch every server, then wait for each to serve; on failure stop them all and raise."""
        deadline = time.monotonic() + timeout_s
        try:
            for s in self.servers:
                s.launch()
            for s in self.servers:
                s.wait_ready(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def leader(self) -> ZooKeeperServer | None:
        """The member that currently leads (a standalone server leads itself); None during an election."""
        for s in self.servers:
            if s.mode() in ("leader", "standalone"):
                return s
        return None

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self) -> ZooKeeperEnsemble:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
