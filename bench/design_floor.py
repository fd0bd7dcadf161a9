"""The floor of the current design for ``bench.cluster_append``: its transports' round trips plus one fsync.

An ``ack="applied"`` append's critical path in this design is a client round trip to the leader on gRPC's
``AppendStream``, a leader -> follower round trip on the replication link (the worker's own TCP framing:
:class:`~conductor.worker.transport.PeerTransport` into :class:`~conductor.worker.peer_server.PeerServer`, a
Replicate out and a ReplicateAck back) and the follower's fsync (the leader's own overlaps). The client round
trip and the fsync are :func:`bench.floor.transport_floor`'s (a node that answers NotLeader: no work); this
module measures the replication link's round trip between this process and an echo process whose
``PeerServer`` answers every Replicate with an ack at once, from the event loop (no task thread, no disk, no
state machine): a worker that does no work. ``transport_floor`` counts a gRPC round trip for that hop instead,
as before replication left gRPC; both figures are kept.

    python -m bench.design_floor [--count N]   # the peer round trip alone, one JSON line
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

from bench.floor import percentile
from conductor.wire import millrace_pb2 as pb
from conductor.worker.peer_server import PeerServer
from conductor.worker.transport import PeerTransport
from replog.messages import RawReplicate, ReplicateAck

#: a Replicate the size of one ~100-byte record's log frame
PAYLOAD = b"r" * 160
MODULE = "<design floor probe>"


async def _echo(reply_port: int) -> None:
    """The echo worker: answers each Replicate from the bench with an ack, on its event loop."""
    loop = asyncio.get_running_loop()
    transport = PeerTransport("echo", loop, lambda _dst: f"127.0.0.1:{reply_port}", lambda _dst: None)

    def deliver(frame: pb.PeerFrame, _sender: str | None) -> None:
        for m in frame.messages:
            r = m.replicate
            transport.send(frame.src, m.module, m.group, ReplicateAck("echo", frame.src, r.epoch, r.start, r.start + 1))

    server = PeerServer(deliver)
    print(await server.start("127.0.0.1", 0), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # until the bench closes our stdin
    await transport.close()
    await server.close()


async def _round_trips(count: int) -> list[float]:
    loop = asyncio.get_running_loop()
    acked: asyncio.Queue[int] = asyncio.Queue(1)  # one Replicate in flight at a time

    def deliver(frame: pb.PeerFrame, _sender: str | None) -> None:
        for m in frame.messages:
            acked.put_nowait(m.ack.held)

    server = PeerServer(deliver)
    port = await server.start("127.0.0.1", 0)
    echo = subprocess.Popen([sys.executable, "-m", "bench.design_floor", "--echo", str(port)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    transport: PeerTransport | None = None
    try:
        assert echo.stdout is not None
        echo_port = int(await loop.run_in_executor(None, echo.stdout.readline))
        transport = PeerTransport("bench", loop, lambda _dst: f"127.0.0.1:{echo_port}", lambda _dst: None)
        perf = time.perf_counter
        rtts = []
        for i in range(count + 100):  # the first 100 open the links and warm up
            t0 = perf()
            transport.send("echo", MODULE, 0, RawReplicate("bench", 1, i, PAYLOAD, i - 1))
            held = await asyncio.wait_for(acked.get(), 10)
            assert held == i, (held, i)
            if i >= 100:
                rtts.append((perf() - t0) * 1000)
        return rtts
    finally:
        if transport is not None:
            await transport.close()
        await server.close()
        if echo.stdin is not None:
            echo.stdin.close()
        echo.wait(10)


def peer_round_trip(count: int) -> dict[str, float]:
    """p50 (ms) of one Replicate -> ReplicateAck round trip on the replication link, a worker that does no work."""
    rtts = sorted(asyncio.run(_round_trips(count)))
    return {"peer_rtt_p50_ms": percentile(rtts, 50), "peer_rtt_p99_ms": percentile(rtts, 99)}


def design_floor(transport: dict[str, float], count: int) -> dict[str, float]:
    """The floor of the current design from ``transport_floor``'s figures plus the replication link's round trip:
    one client round trip + one peer round trip + one fsync (p50s, ms)."""
    peer = peer_round_trip(count)
    return {**peer, "p50_ms": transport["rtt_p50_ms"] + peer["peer_rtt_p50_ms"] + transport["fsync_p50_ms"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.design_floor", description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--echo", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.echo is not None:
        asyncio.run(_echo(args.echo))
        return
    print(json.dumps({"bench": "design_floor", **{k: round(v, 3) for k, v in peer_round_trip(args.count).items()}}))


if __name__ == "__main__":
    main()
