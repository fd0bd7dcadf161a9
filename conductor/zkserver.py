"""A real, single-node ZooKeeper server run as a child process.

Used by `conductor dev`, `conductor doctor` and the test fixtures, so all three
start ZooKeeper the same way: loopback only, a free port, its own data folder,
and stopped by its own pid.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

from conductor.runtime_env import EnvironmentBroken, free_port, zookeeper_classpath

log = logging.getLogger("millrace.zookeeper")


class ZooKeeperServer:
    """Owns one ZooKeeperServerMain JVM; `hosts` is the connect string for kazoo."""

    def __init__(self, data_dir: Path, port: int | None = None, tick_ms: int = 500,
                 max_session_timeout_ms: int = 60_000) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.tick_ms = tick_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _write_config(self) -> Path:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        # minSessionTimeout = 2 ticks: tests use short sessions to make failover quick.
        cfg.write_text(
            f"tickTime={self.tick_ms}\n"
            f"dataDir={self.data_dir / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            f"minSessionTimeout={2 * self.tick_ms}\n"
            f"maxSessionTimeout={self.max_session_timeout_ms}\n"
            "4lw.commands.whitelist=ruok,srvr,stat\n"
            "maxClientCnxns=0\n"
            # KB; the default 64 MB of zeros written (and fsynced) before the first session could be created
            # took over 10 s on a busy 2-core box and timed a test's first connection out.
            "preAllocSize=4096\n"
        )
        return cfg

    def start(self, timeout_s: float = 30.0) -> ZooKeeperServer:
        """Start the JVM and wait until ZooKeeper answers `ruok` and accepts a session; raise with its log tail
        otherwise."""
        cfg = self._write_config()
        cmd = ["java", "-Xmx256m", "-Dzookeeper.jmx.log4j.disable=true", "-cp", zookeeper_classpath(),
               "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)]
        logf = open(self.log_path, "ab")  # noqa: SIM115 - the child owns the handle for its life
        try:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            logf.close()
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

    def ruok(self) -> bool:
        """ZooKeeper's four-letter health check over a raw socket."""
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(b"ruok")
                return s.recv(16) == b"imok"
        except OSError:
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL, by our own pid; safe to call twice."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=timeout_s)
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
