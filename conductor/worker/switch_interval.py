"""The worker process's GIL switch interval (``--switch-interval``): how long a thread that wants the GIL
waits for the running one to let it go before CPython forces a hand-off.

A worker runs several threads that need the GIL: the event loop (gRPC, the replication links), the task
threads that apply entries to RocksDB, the retention driver, query threads and far-horizon copy threads.
CPython's default interval is 5 ms, so a thread woken while another runs Python code may wait up to 5 ms
before it runs. The interval is process-wide (``sys.setswitchinterval``), so it is set once, by the worker's
entry point, never by a library or a client process (docs/performance.md has the measurements behind the
default).
"""

from __future__ import annotations

import sys

#: CPython's own default: what a worker ran with before the setting existed
PYTHON_DEFAULT = 0.005
#: the shortest interval accepted: below it the forced hand-offs themselves become the work
MIN_SECONDS = 0.0001
#: the longest interval accepted: a thread would wait that long to run while another holds the GIL
MAX_SECONDS = 0.1
#: a worker's default: 1 ms halved the sequential append p99 of ``bench.cluster_append`` (docs/performance.md)
DEFAULT = 0.001


def parse_switch_interval(raw: str) -> float:
    """Seconds, within [MIN_SECONDS, MAX_SECONDS] (``0.001`` is 1 ms); ValueError outside them."""
    value = float(raw)
    if not MIN_SECONDS <= value <= MAX_SECONDS:
        raise ValueError(f"the switch interval is {MIN_SECONDS}..{MAX_SECONDS} seconds")
    return value


def apply_switch_interval(seconds: float) -> None:
    """Set this process's GIL switch interval; a worker's entry point calls it once, before its threads start."""
    assert MIN_SECONDS <= seconds <= MAX_SECONDS, seconds
    sys.setswitchinterval(seconds)
