"""Fault-injection seams of a worker (:class:`WorkerHooks`), passed in by whoever constructs the Worker.

Production passes none (``python -m conductor.worker``): every hook is None and
costs one ``is None`` test where it would run. Tests that need a fault the
product never makes on its own (a damaged chunk in transit) start workers
through a launcher of their own that builds the Worker with hooks
(``tests/integration/hooked_worker.py``); no product code reads the
environment for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: sees each data chunk of a far-horizon transfer as the leader sends it, and returns what to send instead
ChunkFilter = Callable[[memoryview], bytes | memoryview]


@dataclass(frozen=True)
class WorkerHooks:
    """See the module docstring; a field left None is no hook."""

    #: leader side of far-horizon catchup (:func:`conductor.worker.far_horizon.stream_checkpoint`)
    chunk_sent: ChunkFilter | None = None
