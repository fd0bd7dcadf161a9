"""Depot partitioners: which task a record lands on.

A partitioner runs on the client (to route an append to the leader of the
owning task group) and again nowhere else: the task travels with the record.
So every partitioner must be deterministic across processes for a given key;
Python's built-in `hash` is salted per process and cannot be used.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import crc32c
import msgpack

#: msgpack.packb's bytes without building a Packer per call (every hop and every record hashes a key); shared by
#: threads safely: packing plain values runs in C under the GIL, and a failed pack leaves the buffer empty
_packb = msgpack.Packer(use_bin_type=True).pack


def stable_hash(key: Any) -> int:
    """A process-independent hash of a plain value (str, int, bytes, tuples...)."""
    try:
        data = _packb(key)
    except TypeError as e:
        raise TypeError(f"cannot hash {type(key).__name__} for partitioning: use str, int, float, bytes, "
                        f"bool, None or tuples of those ({e})") from None
    return int(crc32c.crc32c(data))


def task_for_key(key: Any, tasks: int) -> int:
    """The task that owns `key` among `tasks` tasks (also how PState keys are routed)."""
    return stable_hash(key) % tasks


@dataclass(frozen=True)
class Partitioner:
    """Chooses the task of a record; `name` is what `conductor status` and errors show."""

    name: str
    choose: Callable[[Any, int], int]
    #: the choice ignores the record, so ``append_many`` asks once per request and sends a whole request of
    #: records to that one task, and ``append_async`` once per batch window (until the batch holding the
    #: task's records leaves; ``conductor.client.batching.StickyTasks``): Kafka's sticky partitioner, KIP-480.
    #: One replog entry on one task group per request, however many groups there are, instead of a sliver of
    #: the request on every group
    sticky: bool = False
    #: the record's key (``hash_by``'s ``key_fn``), which key compaction keeps the latest record of; and
    #: whether a record is a tombstone (its key's deletion); None: records have no key to compact by
    key: Callable[[Any], Any] | None = None
    tombstone: Callable[[Any], bool] | None = None

    def __call__(self, record: Any, tasks: int) -> int:
        task = self.choose(record, tasks)
        if not isinstance(task, int) or not 0 <= task < tasks:
            raise ValueError(f"partitioner {self.name} returned task {task!r}; it must be an int in [0, {tasks})")
        return task


#: Any task, chosen uniformly: spreads load when no key needs colocating. ``append_many`` chooses once per
#: request (up to the client's ``max_batch_records`` records), ``append_async`` once per batch window, so a
#: batch costs one entry on one group.
random = Partitioner("random", lambda _record, tasks: _random.randrange(tasks), sticky=True)

#: Task 0 always: one global order for small, ordered streams.
global_ = Partitioner("global", lambda _record, _tasks: 0)


def hash_by(key_fn: Callable[[Any], Any], *, tombstone: Callable[[Any], bool] | None = None) -> Partitioner:
    """Records with the same `key_fn(record)` land on the same task, in append order.

    A depot with key compaction (``depot.compaction``) keeps the latest record per key; ``tombstone(record)``
    says a record deletes its key (it goes too, ``depot.delete.retention.ms`` later).
    """
    name = getattr(key_fn, "__name__", "key")
    return Partitioner(f"hash_by({name})", lambda record, tasks: task_for_key(key_fn(record), tasks),
                       key=key_fn, tombstone=tombstone)


def custom(name: str, fn: Callable[[Any, int], int]) -> Partitioner:
    """A user partitioner `fn(record, tasks) -> task`; it must be deterministic for retries to be safe."""
    return Partitioner(name, fn)
