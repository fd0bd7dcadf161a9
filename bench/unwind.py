"""A benchmark stopped by a signal unwinds as Ctrl-C does, so the clusters and servers it started stop too.

Every benchmark that starts processes (a DevCluster, a JetStream cluster, a copy server) stops them in
``finally`` blocks, which a KeyboardInterrupt runs and a default SIGTERM does not: ``timeout``, CI's
cancellation and a helper script's kill used to leave ZooKeeper and three workers running (one
``bench.spark_timeline`` stopped that way loaded the box for an hour).
"""

from __future__ import annotations

import signal
from types import FrameType


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def unwind_on(*signums: int) -> None:
    """From now on ``signums`` (default SIGTERM) raise KeyboardInterrupt in the main thread."""
    for signum in signums or (signal.SIGTERM,):
        signal.signal(signum, _interrupt)
