"""Helpers for tests that run a real cluster: deploy, find leaders, wait for convergence, compare replicas.

What an app's tests need too (waiting, deploying, group status, convergence, killing and restarting
workers) lives in the product, ``conductor.testing``; this module re-exports it beside what only this
repository's tests use (reading a stopped replica's files, background writers).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from conductor import testing
from conductor.devcluster import DevCluster
from conductor.metastore import GroupState
from conductor.testing import converged, group_status, groups_of, wait_for
from pstate import TaskGroupStore
from replog.log import Log
from topology import load_module

MODULE_REF = "examples.clicks:Clicks"
__all__ = ["MODULE_REF", "TALLY_APP", "Appender", "Background", "Writer", "assert_replicas_identical", "converged", "deploy",
           "group_status", "groups_of", "replica_state", "wait_for", "write_tally_app"]


#: a user's app package (outside the repository) for the CLI's and the pytest plugin's tests
TALLY_APP = """from pstate import Map
from topology import Module, random


def plus_one(n):
    return (n or 0) + 1


class Tally(Module):
    def define(self, m):
        words = m.depot("*words", random)
        counts = m.pstate("$$counts", Map(str, int))

        @m.stream(words)
        def count(ctx, word: str):
            ctx.update(counts.name, word, plus_one)
"""


def write_tally_app(project: Path, extra: str = "") -> None:
    """`project`/tallyapp/counting.py holding the Tally module (`extra` appended: a new code version)."""
    (project / "tallyapp").mkdir(parents=True, exist_ok=True)
    (project / "tallyapp" / "__init__.py").write_text("")
    (project / "tallyapp" / "counting.py").write_text(TALLY_APP + extra)


def deploy(dc: DevCluster, name: str = "Clicks", tasks: int = 4, threads: int = 2,
           options: dict[str, str] | None = None, module_ref: str = MODULE_REF) -> dict[int, GroupState]:
    """conductor.testing.deploy with this repository's defaults (examples.clicks:Clicks, named Clicks)."""
    return testing.deploy(dc, module_ref, name=name, tasks=tasks, threads=threads, options=options)


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
