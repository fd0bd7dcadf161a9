"""What moving a reassignment's bytes costs a writer on this box, without Millrace: a paced plain copy.

    (used by bench.reassign; ``python -m bench.paced_copy ADDRESS DEST RATE`` is one receiver process)

``bench.reassign`` compares the writer's p99 during a reassignment with its
steady one. Part of what the writer pays there is not the reassignment's logic
but the bytes it moves: on one box the followers' copies share the leader's
cores and disk, which separate machines would not. :func:`beside_plain_copy`
moves the same bytes the same way with nothing of the product's around them:
one plain gRPC file server (:class:`bench.catchup.ServerProcess`, ``raw``) and
one receiver process per follower worker, each fetching every file at the
copy throttle's rate (paced by the product's own :class:`CopyThrottle`) and
writing it as a far-horizon copy does (:class:`UnbufferedFile`). The writer's
gaps while it runs are the floor any design pays to move these bytes at that
rate here.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from bench.catchup import TRANSFER_TIMEOUT_S, ServerProcess, raw_messages, stop_child
from conductor.worker.throttle import CopyThrottle
from conductor.worker.unbuffered_file import UnbufferedFile
from pstate.checkpoint import fsync_dir

#: seconds a receiver may take to start (an interpreter importing grpc on a loaded box)
RECEIVER_START_TIMEOUT_S = 60.0


def paced_copy(address: str, dest: Path, rate: int) -> float:
    """Every file the raw server streams, written into ``dest`` at ``rate`` B/s at most the way a far-horizon
    copy writes (:class:`UnbufferedFile`: around the page cache where the disk allows), synced at its end, then
    the directory; seconds taken."""
    dest.mkdir(parents=True)
    throttle = CopyThrottle(lambda: rate)
    t0 = time.perf_counter()
    messages = raw_messages(address)
    for name, size in json.loads(next(messages)):
        out = UnbufferedFile(dest / name)
        try:
            left = size
            while left > 0:
                data = next(messages)
                out.write(data)
                left -= len(data)
                throttle.pace(len(data))
            out.sync()
        finally:
            out.close()
    fsync_dir(dest)
    elapsed = time.perf_counter() - t0
    for _ in messages:
        raise RuntimeError("the raw copy server sent more than the files")
    return elapsed


def make_files(directory: Path, sizes_mb: list[float]) -> None:
    """Random (incompressible) files of these sizes, synced, as a leader's checkpoint would hold."""
    directory.mkdir(parents=True)
    for i, mb in enumerate(sizes_mb):
        with open(directory / f"{i:06d}.sst", "wb") as fh:
            left = int(mb * 1e6)
            while left > 0:
                n = min(left, 8 << 20)
                fh.write(os.urandom(n))
                left -= n
            fh.flush()
            os.fsync(fh.fileno())
    fsync_dir(directory)


class _Receiver:
    """One ``python -m bench.paced_copy`` child: imports, says ``ready``, copies on ``go``, prints its seconds."""

    def __init__(self, address: str, dest: Path, rate: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.paced_copy", address, str(dest), str(rate)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=Path(__file__).resolve().parent.parent)

    def line(self, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        return self.proc.stdout.readline().decode().strip() if ready else ""

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        stop_child(self.proc)  # (its stdin closed: one still waiting for the go exits; one copying gets SIGTERM)


def beside_plain_copy(source: Path, work: Path, receivers: int, rate: int) -> tuple[float, float]:
    """``receivers`` paced copies of every file in ``source`` at once (each at ``rate`` B/s), from one raw
    server process; the ``time.monotonic()`` span from the go to the last copy's end. Every process it starts
    is stopped, also on failure."""
    server = ServerProcess("raw", source, work / "shelf")
    started: list[_Receiver] = []
    try:
        for i in range(receivers):
            started.append(_Receiver(server.address, work / f"receiver-{i}", rate))
        for r in started:
            if r.line(RECEIVER_START_TIMEOUT_S) != "ready":
                raise RuntimeError(f"a paced copy receiver did not start (exit code {r.proc.poll()})")
        t0 = time.monotonic()
        for r in started:
            r.go()
        for r in started:
            out = r.line(TRANSFER_TIMEOUT_S)
            if not out.replace(".", "", 1).isdigit():
                raise RuntimeError(f"a paced copy receiver failed (exit code {r.proc.poll()}): {out!r}")
        return t0, time.monotonic()
    finally:
        for r in started:
            r.stop()
        server.stop()


def main() -> None:
    address, dest, rate = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return  # the parent went away before the start
    print(f"{paced_copy(address, dest, rate):.3f}", flush=True)


if __name__ == "__main__":
    main()
