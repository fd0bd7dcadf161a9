"""Replication links: the worker's TCP framing against a gRPC aio stream carrying the same frames, in one run.

    python -m bench.peer_transport [--quick]

Why replication between workers is not gRPC (``conductor.wire.peer_framing``).
Two processes on 127.0.0.1: a receiver that serves both kinds of link and
hands every frame to a deliver function that only counts it, and a sender that
sends the same ``ReplicateMsg`` frames (one message each, as a task thread's
drain ships them) over:

* ``tcp``: the product's own link, :class:`conductor.worker.transport.PeerTransport`
  into :class:`conductor.worker.peer_server.PeerServer`;
* ``grpc``: a ``grpc.aio`` client stream of ``PeerFrame`` to a ``grpc.aio``
  server, the transport replication used before (options as the worker's).

For each message size, the CPU (user + system) of both processes per frame, from
the first frame sent to the last one counted, and ``grpc_vs_tcp``: how many
times the CPU of the gRPC link the TCP link costs (higher: TCP cheaper).

Prints a table and, as the last line, one JSON object (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from conductor.wire import millrace_pb2 as pb
from conductor.wire.options import GRPC_OPTIONS
from conductor.worker.peer_server import PeerServer
from conductor.worker.transport import PeerTransport
from replog.messages import RawReplicate

SIZES = (200, 16_384, 131_072)
METHOD = "/bench.Peer/Deliver"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ------------------------------------------------------------------------------------------ receiver process

async def _receive() -> None:
    """Serve both links; per line on stdin "N": reply "cpu_seconds" once N more frames were counted."""
    counted = 0
    arrived = asyncio.Event()

    def deliver(frame: pb.PeerFrame, _sender: str | None = None) -> None:
        nonlocal counted
        counted += len(frame.messages)
        arrived.set()

    async def grpc_deliver(frames: AsyncIterator[bytes], _context: Any) -> bytes:
        async for raw in frames:
            deliver(pb.PeerFrame.FromString(raw))
        return b""

    peer = PeerServer(deliver)
    tcp_port = await peer.start("127.0.0.1", 0)
    server = grpc.aio.server(options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Peer", {
        "Deliver": grpc.stream_unary_rpc_method_handler(grpc_deliver)}),))
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(tcp_port, grpc_port, flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line.strip():
            break
        want, c0 = counted + int(line), _cpu()
        while counted < want:
            arrived.clear()
            await arrived.wait()
        print(_cpu() - c0, flush=True)
    await peer.close()
    await server.stop(0)


# ------------------------------------------------------------------------------------------ sender side

def _messages(size: int, n: int) -> list[RawReplicate]:
    pool = os.urandom(size + 64)
    return [RawReplicate("n1", 1, i, pool[i % 64:i % 64 + size], i - 1) for i in range(n)]


async def _send_tcp(port: int, msgs: list[RawReplicate], counted: asyncio.Future[float]) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    transport = PeerTransport("n1", loop, lambda _dst: f"127.0.0.1:{port}", lambda _dst: None)
    c0 = _cpu()
    for m in msgs:
        transport.send("n2", "Bench", 0, m)
        await asyncio.sleep(0)  # one drain's message per frame, as a busy worker's loop sees them
    received = await counted
    sent = _cpu() - c0
    await transport.close()
    return sent, received


async def _send_grpc(port: int, msgs: list[RawReplicate], counted: asyncio.Future[float]) -> tuple[float, float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
        call = channel.stream_unary(METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        c0 = _cpu()
        done = asyncio.Event()

        async def frames() -> AsyncIterator[bytes]:
            for m in msgs:
                yield pb.PeerFrame(src="n1", dst="n2", messages=[pb.PeerMessage(
                    module="Bench", group=0, replicate=pb.ReplicateMsg(
                        epoch=m.epoch, start=m.start, frames=m.frames, apply_offset=m.apply_offset))]
                ).SerializeToString()
            await done.wait()  # the stream stays open until the receiver counted everything
        stream = asyncio.ensure_future(call(frames()))
        received = await counted
        sent = _cpu() - c0
        done.set()
        await stream
        return sent, received


def _run(receiver: subprocess.Popen[str], port: int, kind: str, msgs: list[RawReplicate]) -> tuple[float, float]:
    """(sender CPU, receiver CPU) seconds for the frames, until the receiver counted the last one."""
    assert receiver.stdin is not None and receiver.stdout is not None
    out = receiver.stdout
    receiver.stdin.write(f"{len(msgs)}\n")
    receiver.stdin.flush()

    async def go() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        counted = asyncio.ensure_future(loop.run_in_executor(None, lambda: float(out.readline())))
        return await (_send_tcp if kind == "tcp" else _send_grpc)(port, msgs, counted)
    return asyncio.run(go())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.peer_transport", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer frames")
    p.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.receiver:
        asyncio.run(_receive())
        return
    frames = 3_000 if args.quick else 12_000
    receiver = subprocess.Popen([sys.executable, "-m", "bench.peer_transport", "--receiver"], text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert receiver.stdout is not None
        tcp_port, grpc_port = map(int, receiver.stdout.readline().split())
        out: dict[int, dict[str, float]] = {}
        for size in SIZES:
            n = max(500, frames * 16_384 // max(size, 16_384))
            msgs = _messages(size, n)
            per: dict[str, list[float]] = {"tcp": [], "grpc": []}
            for _round in range(3):  # alternate, keep the best of each: the box's noise is not the link's cost
                for kind, port in (("tcp", tcp_port), ("grpc", grpc_port)):
                    sent, received = _run(receiver, port, kind, msgs)
                    per[kind].append((sent + received) / n * 1e6)
            out[size] = {k: min(v) for k, v in per.items()}
    finally:
        if receiver.stdin is not None:
            receiver.stdin.close()
        receiver.wait(10)
    table = Table(title="replication link CPU per frame (sender + receiver), one message per frame",
                  title_justify="left")
    for col in ("message bytes", "tcp us/frame", "grpc us/frame", "grpc / tcp"):
        table.add_column(col, justify="right")
    for size, v in out.items():
        table.add_row(f"{size:,}", f"{v['tcp']:.1f}", f"{v['grpc']:.1f}", f"{v['grpc'] / v['tcp']:.2f}")
    Console().print(table)
    print(json.dumps({"bench": "peer_transport", "quick": args.quick, **{
        f"{k}_us_per_frame_{size}b": round(v[k], 1) for size, v in out.items() for k in ("tcp", "grpc")},
        **{f"grpc_vs_tcp_{size}b": round(v["grpc"] / v["tcp"], 2) for size, v in out.items()}}))


if __name__ == "__main__":
    main()
