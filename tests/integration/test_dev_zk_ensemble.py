"""`conductor dev --zk-servers 3` runs a three-server ZooKeeper ensemble on loopback: every process gets the
connect string of all three, the CLI takes it as --zk, losing the ZooKeeper leader costs the worker nothing
(its session and registration stay), and `conductor dev --stop` stops every recorded pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conductor.cli_views import pid_running
from conductor.devcluster import stop_from_state
from conductor.metastore import Metastore
from conductor.zkserver import server_mode

REPO = Path(__file__).resolve().parents[2]
#: DevCluster's default session timeout for its conductor and nodes.
SESSION_TIMEOUT_S = 4.0


def test_dev_runs_an_ensemble_that_survives_losing_one_server(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).parent / "conductor")
    root = tmp_path / "dev"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

    def conductor(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)

    try:
        started = conductor("dev", "--nodes", "1", "--zk-servers", "3", "--dir", str(root))
        assert started.returncode == 0, started.stdout + started.stderr
        state = json.loads((root / "cluster.json").read_text())
        servers = state["zk"].split(",")
        assert len(servers) == 3 and sorted(state["zookeeper"]) == ["zk1", "zk2", "zk3"]
        assert all(pid_running(pid) for pid in state["zookeeper"].values())
        for name in ("zookeeper zk1", "zookeeper zk3"):
            assert name in started.stdout, started.stdout

        listed = conductor("status", "--zk", state["zk"])
        assert listed.returncode == 0 and "1 live worker node" in listed.stdout, listed.stdout + listed.stderr

        modes = {name: server_mode(*_host_port(hp)) for name, hp in zip(["zk1", "zk2", "zk3"], servers, strict=True)}
        leader = [name for name, mode in modes.items() if mode == "leader"]
        assert len(leader) == 1, modes
        os.kill(state["zookeeper"][leader[0]], signal.SIGKILL)
        time.sleep(SESSION_TIMEOUT_S + 2)  # long enough for the node's session to expire, were it lost
        with Metastore(state["zk"]) as ms:
            assert ms.nodes.live() == ["n1"]
        node_log = (root / "logs" / "node-n1.log").read_text()
        assert "lost; stepping down" not in node_log, node_log
        assert pid_running(state["nodes"]["n1"]) and pid_running(state["conductors"]["c1"])

        stopped = conductor("dev", "--stop", "--dir", str(root))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        pids = [*state["zookeeper"].values(), *state["conductors"].values(), *state["nodes"].values()]
        assert [p for p in pids if pid_running(p)] == []
    finally:
        if (root / "cluster.json").exists():
            stop_from_state(root)


def _host_port(hp: str) -> tuple[str, int]:
    host, port = hp.rsplit(":", 1)
    return host, int(port)
