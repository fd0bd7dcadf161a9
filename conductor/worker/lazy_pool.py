"""A thread pool a worker's replicas share, made on first use (:class:`LazyPool`).

Why lazily: a worker that never needs the pool (no install, the ``interval`` durability mode) starts none of
its threads, and tests that never reach it leave none behind.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor


class LazyPool:
    """``threads`` threads named ``prefix``-N, made by the first :meth:`get` (any thread)."""

    def __init__(self, threads: int, prefix: str) -> None:
        assert threads > 0, threads
        self._threads = threads
        self._prefix = prefix
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix=self._prefix)
            return self._pool
