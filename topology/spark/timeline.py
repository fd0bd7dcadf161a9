"""Where a Spark read's wall time goes: timestamped marks from every process of a job, written only when asked.

A Spark job over ``millrace.depot`` runs in several processes at once (the
driver, a Python planner worker, one Python worker per task, the nodes), so a
profiler of one process cannot say which step a job waits on. With
``MILLRACE_SPARK_TIMELINE=DIR`` in the driver's environment (Spark's JVM and its
Python workers inherit it) every :func:`mark` appends ``time pid event detail``
to ``DIR/<pid>.txt``; :func:`read_marks` reads them back, and
``python -m bench.spark_timeline`` lines them up per job against the API's
ceiling (docs/performance.md, issue 28). Unset, the default, a mark costs one
global lookup: the marks stay in the read path.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

#: the environment variable naming the folder the marks go to
ENV = "MILLRACE_SPARK_TIMELINE"

_DIR = os.environ.get(ENV) or None
#: this process's file, by pid: a forked Python worker must not write through its parent's handle
_files: dict[int, TextIO] = {}


def start(folder: Path) -> None:
    """Mark into `folder` from now on, in this process and in every process it starts later (Spark's JVM and
    its Python workers, which inherit the environment)."""
    global _DIR
    folder.mkdir(parents=True, exist_ok=True)
    os.environ[ENV] = _DIR = str(folder)


def mark(event: str, detail: object = "") -> None:
    """Record ``event`` (one word) with ``detail`` at the wall clock's time, if marks are asked for."""
    if _DIR is None:
        return
    pid = os.getpid()
    f = _files.get(pid)
    if f is None:
        f = _files[pid] = open(os.path.join(_DIR, f"{pid}.txt"), "a", buffering=1)  # noqa: SIM115 (kept open)
    f.write(f"{time.time():.6f} {pid} {event} {detail}\n")


@dataclass(frozen=True)
class Mark:
    """One mark: wall-clock seconds, the process, the event and its detail."""

    at: float
    pid: int
    event: str
    detail: str


def read_marks(folder: Path) -> list[Mark]:
    """Every mark written to `folder`, in time order."""
    out: list[Mark] = []
    for path in folder.glob("*.txt"):
        for line in path.read_text().splitlines():
            at, pid, event, *detail = line.split(" ", 3)
            out.append(Mark(float(at), int(pid), event, detail[0] if detail else ""))
    out.sort(key=lambda m: m.at)
    return out
