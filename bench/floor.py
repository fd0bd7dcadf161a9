"""The transport floor of ``bench.cluster_append``: what the cheapest RF=3 append costs on this box and stack.

Measured in the same run as the benchmark, so its ratio says how far an append
is from what the transport and the disk allow, whatever the machine.
"""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path

from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.channels import open_channel
from conductor.wire.options import GRPC_OPTIONS


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-th percentile of sorted values, linearly interpolated (NaN for none)."""
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


FLOOR_PROBE_MODULE = "<floor probe: no such module>"


def transport_floor(address: str, directory: Path, count: int) -> dict[str, float]:
    """The least a sequential RF=3 append can cost on this box with this stack, measured, no work done.

    Its critical path is a client round trip to the leader, a leader round trip
    to a follower and the follower's fsync (the leader's own overlaps). Round
    trip: one `AppendRequest` on a sync `AppendStream`, as the client sends it,
    for a module no node hosts, which the node answers at once with NotLeader
    (no task thread, no disk). fsync: a 100-byte write and fdatasync in the
    cluster's directory, as a replog flush does. Peer messages use the same
    gRPC streams, so one round trip stands for each hop.
    """
    perf = time.perf_counter
    outbox: queue.SimpleQueue[pb.AppendRequest | None] = queue.SimpleQueue()
    rtts = []
    with open_channel(address, GRPC_OPTIONS) as ch:  # TLS on a secure cluster (the process's certificate)
        replies = pbg.ClientStub(ch).AppendStream(iter(outbox.get, None))
        req = pb.AppendRequest(module=FLOOR_PROBE_MODULE, group=0, ack=pb.ACK_APPLIED)
        for i in range(count + 100):
            t0 = perf()
            outbox.put(req)
            reply = next(replies)
            if i >= 100:
                rtts.append((perf() - t0) * 1000)
        outbox.put(None)
        if not reply.error:
            raise RuntimeError(f"the floor probe expected NotLeader for {FLOOR_PROBE_MODULE!r}, got {reply}")
    syncs = []
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(count // 4 + 20):
            os.pwrite(fd, b"x" * 100, i * 100)
            t0 = perf()
            os.fdatasync(fd)
            if i >= 20:
                syncs.append((perf() - t0) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    rtts.sort()
    syncs.sort()
    rtt, sync = percentile(rtts, 50), percentile(syncs, 50)
    return {"rtt_p50_ms": rtt, "fsync_p50_ms": sync, "p50_ms": 2 * rtt + sync}
