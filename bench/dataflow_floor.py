"""The floor of the dataflow design, in one process: CPU of the data path alone, without network or replog.

``bench.topology`` measures a real cluster; this measures, in the same run,
what the dataflow's own rules and the PState writes cost when nothing else
does: task groups as :class:`~topology.dataflow.group.GroupDataflow` objects
over real RocksDB stores, each entry built on its leader, staged, applied
there and applied on ``RF - 1`` follower stores (RF=3: what replication makes
every replica do), envelopes handed from group to group by a loop (no gRPC,
no fsync, no replication protocol, no threads). What the cluster spends above
this is transport, replication rounds and idle work; what this spends is the
design's floor on this machine.

* ``fanout_us``: CPU per delivery of ``examples.timeline:Timeline`` (the
  bench's fanout: 100 followers per post over 8 groups);
* ``fanout_noop_us``: the same posts through a handler that does nothing,
  so only the hop machinery is left (envelopes, dispatch, positions,
  completion) plus the posts' own entries;
* ``wordcount_us_g2`` / ``_g8``: CPU per sentence of WordCount at 2 and 8
  groups (16 tasks): how the data path alone scales with the groups.

Run alone (``python -m bench.dataflow_floor [--posts N] [--repeat R]``) it
prints the fanout figures, the lowest of ``R`` runs each (CPU time, so a
loaded machine inflates it less than wall time; the lowest is the least
disturbed), and a last-line JSON: the quick way to measure a change to the
data path.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from pstate import Map, P, Set, TaskGroupStore
from pstate.changes import ChangeSet
from topology import Module, hash_by
from topology.dataflow.entries import build_client_append
from topology.dataflow.group import GroupDataflow
from topology.module import ModuleDefinition, load_module
from topology.partitioners import random as random_partitioner
from topology.stream import StreamRunner

RF = 3
#: the modules the cluster bench runs (loaded by reference, as a worker does)
TIMELINE = "examples.timeline:Timeline"
WORDCOUNT = "examples.word_count:WordCount"


def by_author(r: dict[str, Any]) -> str:
    return str(r["author"])


class NoopFanout(Module):
    """Timeline's fanout with a handler that does nothing: the hop machinery alone."""

    def define(self, m: ModuleDefinition) -> None:
        follows = m.depot("*follows", hash_by(by_author))
        posts = m.depot("*posts", hash_by(by_author))
        m.pstate("$$followers", Map(str, Set(str).subindexed()))

        @m.stream(follows)
        def follow(ctx: Any, f: dict[str, Any]) -> None:
            ctx.transform("$$followers", f["author"], P.add(f["follower"]))

        @m.stream(posts)
        def fanout(ctx: Any, post: dict[str, Any]) -> int:
            followers = ctx.select("$$followers", post["author"], P.all())
            for follower in followers:
                ctx.send(deliver, follower, post["id"], post["author"])
            return len(followers)

        @m.handler
        def deliver(ctx: Any, follower: str, post_id: int, author: str) -> None:
            pass


class InProcessCluster:
    """Task groups of one module in this process; entries applied at once on the leader and RF - 1 followers."""

    def __init__(self, root: Path, md: ModuleDefinition, tasks: int, groups: int) -> None:
        self.md, self.tasks, self.groups = md, tasks, groups
        schemas = {n: d.schema for n, d in md.pstates.items()}
        self.flows: list[GroupDataflow] = []
        self.followers: list[list[TaskGroupStore]] = []
        for g in range(groups):
            store = TaskGroupStore(root / f"g{g}", schemas, md.depot_names())
            flow = GroupDataflow(functools.partial(_same, store), StreamRunner(md, tasks, groups, g), keepalive_ms=10)
            flow.lead(1)
            self.flows.append(flow)
            self.followers.append([TaskGroupStore(root / f"g{g}f{i}", schemas, md.depot_names())
                                   for i in range(RF - 1)])
        self.now = 0

    def close(self) -> None:
        for flow, fs in zip(self.flows, self.followers, strict=True):
            flow.store.close()
            for s in fs:
                s.close()

    def commit(self, g: int, builder: Any) -> None:
        flow = self.flows[g]
        off = flow.store.applied_offset + 1
        payload = flow.store.stage(off, builder)
        cs = ChangeSet.decode(payload)
        flow.store.apply(off, cs)
        flow.applied(off, cs)
        for s in self.followers[g]:
            s.apply(off, payload)

    def append(self, depot: str, records: list[Any]) -> None:
        """One client entry per group holding records of ``depot``, then every hop until all trees complete."""
        by_group: dict[int, dict[int, list[bytes]]] = {}
        part = self.md.depots[depot].partitioner
        for i, r in enumerate(records):
            t = i % self.tasks if part is random_partitioner else part(r, self.tasks)
            by_group.setdefault(t % self.groups, {}).setdefault(t, []).append(msgpack.packb(r))
        for g, parts in sorted(by_group.items()):
            b, _firsts, _acks = build_client_append(self.flows[g].store, self.flows[g].runner,
                                                    [(depot, t, rs) for t, rs in sorted(parts.items())])
            self.commit(g, b)
        self.settle()

    def settle(self) -> None:
        for _ in range(50):
            self.now += 1
            for g, flow in enumerate(self.flows):
                for dst, _node, msg in flow.outgoing(self.now):
                    self.flows[dst].received(msg, peer=g)
            for g, flow in enumerate(self.flows):
                if flow.inbound_due(self.now):
                    b = flow.build_inbound(self.now)
                    if b is not None:
                        self.commit(g, b)
            for g, flow in enumerate(self.flows):
                flow.completed_roots()
                b = flow.build_trim()
                if b is not None:
                    self.commit(g, b)
            if not any(f.busy() for f in self.flows):
                return
        raise AssertionError("the in-process dataflow did not settle")


def _same(store: TaskGroupStore) -> TaskGroupStore:
    return store


def _cpu_appending(c: InProcessCluster, depot: str, records: list[Any], per_call: int) -> float:
    """CPU seconds to append ``records`` ``per_call`` at a time, each call settled (every tree complete)."""
    t0 = time.process_time()
    for i in range(0, len(records), per_call):
        c.append(depot, records[i:i + per_call])
    return time.process_time() - t0


def fanout_us(md: ModuleDefinition, posts_n: int, followers: int = 100, authors: int = 50, users: int = 5_000,
              tasks: int = 16, groups: int = 8) -> float:
    """CPU microseconds per delivery: posts appended 50 at a time, each reaching ``followers`` timelines."""
    root = Path(tempfile.mkdtemp(prefix="millrace-floor-"))
    c = InProcessCluster(root, md, tasks, groups)
    try:
        rng = random.Random(3)
        people = [f"u{i}" for i in range(users)]
        graph = {f"a{i}": rng.sample(people, followers) for i in range(authors)}
        c.append("*follows", [{"author": a, "follower": u} for a, fs in graph.items() for u in fs])
        c.append("*posts", [{"author": f"a{i % authors}", "id": -1 - i, "text": "warm"} for i in range(100)])
        posts = [{"author": f"a{i % authors}", "id": i, "text": "hello"} for i in range(posts_n)]
        cpu = _cpu_appending(c, "*posts", posts, 50)
        return cpu / (posts_n * followers) * 1e6
    finally:
        c.close()
        shutil.rmtree(root, ignore_errors=True)


def wordcount_us(text: list[str], groups: int, tasks: int = 16) -> float:
    """CPU microseconds per sentence of WordCount, sentences appended 1,000 at a time over every task."""
    root = Path(tempfile.mkdtemp(prefix="millrace-floor-"))
    c = InProcessCluster(root, load_module(WORDCOUNT).build(), tasks, groups)
    try:
        c.append("*sentences", text[:1000])
        cpu = _cpu_appending(c, "*sentences", text, 1000)
        return cpu / len(text) * 1e6
    finally:
        c.close()
        shutil.rmtree(root, ignore_errors=True)


def measure(posts_n: int, text: list[str]) -> dict[str, float]:
    """Every floor figure (see the module docstring)."""
    return {"fanout_us": fanout_us(load_module(TIMELINE).build(), posts_n), "fanout_noop_us": fanout_us(NoopFanout.build(), posts_n),
            "wordcount_us_g2": wordcount_us(text, 2), "wordcount_us_g8": wordcount_us(text, 8)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.dataflow_floor", description=__doc__.split("\n")[0])
    p.add_argument("--posts", type=int, default=1_000, help="posts per run (100 followers each)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each figure; the lowest is kept")
    args = p.parse_args(argv)
    timeline, noop = load_module(TIMELINE).build(), NoopFanout.build()
    fan = min(fanout_us(timeline, args.posts) for _ in range(args.repeat))
    fan_noop = min(fanout_us(noop, args.posts) for _ in range(args.repeat))
    print(f"fanout, CPU us per delivery:       {fan:.1f}")
    print(f"same, no-op handler:               {fan_noop:.1f}")
    print(json.dumps({"bench": "dataflow_floor", "posts": args.posts, "repeat": args.repeat,
                      "fanout_us": round(fan, 2), "fanout_noop_us": round(fan_noop, 2),
                      "handler_us": round(fan - fan_noop, 2)}))


if __name__ == "__main__":
    main()
