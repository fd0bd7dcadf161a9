"""The app client's call latency, in a prometheus-client registry of its own that the app may expose.

Off unless the app asks (``Cluster.connect(..., metrics=ClientMetrics())``): the client stays light and a
process with several clients keeps them apart. One observation per call, retries included (what the app
waited), labelled by module, method and outcome (``ok``, or the error's type); ``append_async`` records are
timed per request the client sends for them (``AppendBatch``), not per record.

Expose it with prometheus-client, e.g. ``prometheus_client.start_http_server(9100, registry=m.registry)``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Histogram

#: upper bounds (seconds): 100 µs to 30 s (a call waits at most its client's timeout, 45 s by default)
CALL_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0)


class ClientMetrics:
    """``millrace_client_call_seconds{module,method,outcome}`` in :attr:`registry` (a new one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self.calls = Histogram("millrace_client_call_seconds", "a client call to a group leader, retries "
                               "included: from the call to its answer", ("module", "method", "outcome"),
                               registry=self.registry, buckets=CALL_BUCKETS)

    @contextmanager
    def timed(self, module: str, method: str) -> Iterator[None]:
        t0 = time.perf_counter()
        outcome = "ok"
        try:
            yield
        except BaseException as e:
            outcome = type(e).__name__
            raise
        finally:
            self.calls.labels(module, method, outcome).observe(time.perf_counter() - t0)
