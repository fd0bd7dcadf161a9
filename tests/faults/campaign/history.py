"""The history: every append the clients made, with when it was invoked and completed and how it ended.

An operation ends ``ok`` (acknowledged with ack="applied"), ``failed`` (a typed error that refuses the input
before anything is written: it must never become visible) or ``unknown`` (a timeout, an unavailable group, a
stalled group, a lost leader: it may or may not have been written, so it may be visible at most once).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from conductor.client import Cluster
from pstate.errors import DepotNotFound, InvalidPath, PStateNotFound, SchemaError, SchemaMismatch
from tests.faults.campaign.module import COUNTED, KEYS
from topology.errors import TopologyError

#: Errors that refuse an append before it reaches the replog: a value that got one must never be visible.
DEFINITE_FAILURES = (SchemaError, SchemaMismatch, InvalidPath, PStateNotFound, DepotNotFound, TopologyError)


@dataclass
class Op:
    """One append: its value (unique in the run), where it went, and how it ended."""

    value: str
    depot: str
    key: str
    client: str
    invoke: float
    complete: float | None = None
    outcome: str = "pending"  # ok | failed | unknown
    group: int | None = None
    error: str | None = None

    def record(self) -> dict[str, Any]:
        return {"key": self.key, "id": self.value}


@dataclass
class History:
    """Every operation of a run, in invocation order; times are seconds since the run started."""

    t0: float = field(default_factory=time.monotonic)
    ops: list[Op] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def invoke(self, value: str, depot: str, key: str, client: str) -> Op:
        op = Op(value, depot, key, client, self.now())
        with self.lock:
            self.ops.append(op)
        return op

    def complete(self, op: Op, outcome: str, error: BaseException | None = None) -> None:
        op.complete = self.now()
        op.outcome = outcome
        if error is not None:
            op.error = f"{type(error).__name__}: {str(error)[:200]}"

    def counts(self) -> dict[str, int]:
        with self.lock:
            ops = list(self.ops)
        out = {"ok": 0, "failed": 0, "unknown": 0, "pending": 0}
        for op in ops:
            out[op.outcome] += 1
        return out

    def by_value(self) -> dict[str, Op]:
        with self.lock:
            return {op.value: op for op in self.ops}


def outcome_of(error: BaseException) -> str:
    return "failed" if isinstance(error, DEFINITE_FAILURES) else "unknown"


def append(cluster: Cluster, history: History, client: str, value: str, depot: str, key: str) -> Op:
    """One recorded append with ack="applied"."""
    return append_batch(cluster, history, client, [value], depot, key)[0]


def append_batch(cluster: Cluster, history: History, client: str, values: list[str], depot: str,
                 key: str) -> list[Op]:
    """Values appended with ack="applied" in one call, one op each: ``append`` for one, else ``append_many``.

    One key, so one task: the records are one entry, stored as one batch value (pstate.depot_batches), and
    every op ends as the call does.
    """
    ops = [history.invoke(v, depot, key, client) for v in values]
    handle = cluster.depot("Campaign", depot)
    try:
        group = handle._route(ops[0].record())[1]
        for op in ops:
            op.group = group
        if len(ops) == 1:
            handle.append(ops[0].record(), ack="applied")
        else:
            handle.append_many([op.record() for op in ops], ack="applied")
    except Exception as e:
        for op in ops:
            history.complete(op, outcome_of(e), e)
    else:
        for op in ops:
            history.complete(op, "ok")
    return ops


#: the share of a client's calls that append several values at once (a stored batch)
BATCHED_SHARE = 0.25
#: the most values one batched call appends
MAX_BATCH = 4


class Clients:
    """`n` client threads, each appending unique values to a seeded choice of depot and key: one at a time, or
    (``batched_share`` of the calls, drawn from a generator of their own so the other draws stay as they were)
    2 to ``MAX_BATCH`` in one call."""

    def __init__(self, cluster: Cluster, history: History, n: int, seed: int,
                 batched_share: float = BATCHED_SHARE) -> None:
        assert 0 <= batched_share <= 1, batched_share
        self.cluster = cluster
        self.history = history
        self.batched_share = batched_share
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(f"c{i}", random.Random(seed * 1000 + i),
                                                                 random.Random(seed * 1000 + i + 500)),
                                         name=f"campaign-client-{i}", daemon=True) for i in range(n)]

    def _run(self, name: str, rng: random.Random, sizes: random.Random) -> None:
        n = 0
        depots = sorted(COUNTED)
        while not self.halt.is_set():
            k = sizes.randint(2, MAX_BATCH) if sizes.random() < self.batched_share else 1
            values = [f"{name}-{n + j + 1}" for j in range(k)]
            n += k
            append_batch(self.cluster, self.history, name, values, rng.choice(depots), rng.choice(KEYS))

    def start(self) -> Clients:
        for t in self.threads:
            t.start()
        return self

    def stop(self, timeout_s: float) -> None:
        self.halt.set()
        for t in self.threads:
            t.join(timeout=timeout_s)
