"""``python -m tests.integration.hooked_worker [--damage-chunks N] WORKER-ARGS``: a worker with test hooks.

The same process as ``python -m conductor.worker WORKER-ARGS``, built with the
:class:`~conductor.worker.hooks.WorkerHooks` the flags ask for:

* ``--damage-chunks N``: as a far-horizon leader, flip one byte in each of the
  first N data chunks this process sends, to prove the follower detects them
  and fetches the files again.

Start a dev cluster's nodes with it through ``DevCluster(worker=hooked(...))``.
"""

from __future__ import annotations

import argparse
import logging
import threading

from conductor.worker.__main__ import main as worker_main
from conductor.worker.hooks import WorkerHooks

log = logging.getLogger("millrace.far_horizon")


def hooked(*flags: str) -> tuple[str, ...]:
    """``DevCluster``'s ``worker`` argument that starts nodes through this launcher with ``flags``."""
    return ("-m", "tests.integration.hooked_worker", *flags)


class DamageChunks:
    """Flips one byte in each of the first ``n`` chunks it sees (any thread)."""

    def __init__(self, n: int) -> None:
        self.left = n
        self._lock = threading.Lock()

    def __call__(self, data: memoryview) -> bytes | memoryview:
        if self.left <= 0 or not data:
            return data
        with self._lock:
            if self.left <= 0:
                return data
            self.left -= 1
        log.warning("test hook: corrupting a far-horizon chunk in transit")
        return bytes([data[0] ^ 0xFF]) + bytes(data[1:])


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.integration.hooked_worker", add_help=False)
    p.add_argument("--damage-chunks", type=int, default=0)
    flags, rest = p.parse_known_args()
    worker_main(rest, WorkerHooks(chunk_sent=DamageChunks(flags.damage_chunks) if flags.damage_chunks else None))


if __name__ == "__main__":
    main()
