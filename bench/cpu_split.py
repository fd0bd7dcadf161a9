"""Where a benchmark job's CPU goes, by process: the nodes, Spark's JVM, Spark's Python workers, the rest.

A job's wall time on a loaded two-core box follows the CPU that every process
spends on it, so comparing two sources means comparing those splits, measured
in the same run (``bench.microbatch`` does it for ``millrace.depot`` against the
API's ceiling). :class:`CpuSplit` reads ``/proc`` before and after each job for
this process and every process below it (Spark's launcher, JVM and Python
daemon and workers, ZooKeeper, the conductor and the nodes a
:class:`~conductor.devcluster.DevCluster` started), so other work on the box
is not counted. Each process's own CPU and that of its reaped children are
counted; the clock tick (10 ms) is the resolution, so read medians over runs.
On a system without ``/proc`` every split is empty.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: the process classes a split reports (each process is counted in exactly one)
CLASSES = ("nodes", "spark_jvm", "spark_python", "bench", "other")

_PROC = Path("/proc")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and its reaped children); None once it is gone."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the name may hold spaces; what follows ")" does not
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return int(fields[1]), (utime + stime + cutime + cstime) / os.sysconf("SC_CLK_TCK")


def _cmdline(pid: int) -> str:
    try:
        return (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def classify(cmdline: str) -> str:
    """The class of a process that is not a node, from its command line (arguments separated by spaces)."""
    program = Path(cmdline.split(" ", 1)[0]).name
    if program.startswith("java"):  # its class path names pyspark's jars too: the program decides
        return "spark_jvm" if "org.apache.spark" in cmdline else "other"
    if program.startswith("python") and "pyspark" in cmdline:
        return "spark_python"
    return "other"


class CpuSplit:
    """CPU seconds per process class over a call, for this process and its descendants."""

    def __init__(self, node_pids: Callable[[], Iterable[int]]) -> None:
        #: the nodes' pids (asked at every snapshot: a node may be restarted)
        self.node_pids = node_pids
        self.available = (_PROC / str(os.getpid()) / "stat").exists()

    def snapshot(self) -> dict[str, float]:
        """Cumulative CPU seconds per class now (descendants found by walking parent pids)."""
        if not self.available:
            return {}
        me = os.getpid()
        stats = {}
        for d in os.listdir(_PROC):
            if d.isdigit() and (s := _stat(int(d))) is not None:
                stats[int(d)] = s
        below = {me}
        grew = True
        while grew:
            new = {pid for pid, (ppid, _cpu) in stats.items() if ppid in below and pid not in below}
            below |= new
            grew = bool(new)
        nodes = set(self.node_pids())
        out = dict.fromkeys(CLASSES, 0.0)
        for pid in below - {me}:
            out["nodes" if pid in nodes else classify(_cmdline(pid))] += stats[pid][1]
        t = os.times()
        out["bench"] = t.user + t.system + t.children_user + t.children_system  # with children it reaped
        return out

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
        """``fn()``'s result and the CPU seconds each class spent while it ran."""
        before = self.snapshot()
        result = fn()
        after = self.snapshot()
        return result, {k: round(after[k] - before.get(k, 0.0), 3) for k in after}
