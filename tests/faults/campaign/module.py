"""The module the campaign deploys: three depots and two stream topologies that keep exact counts.

``*events`` is partitioned by key and counted on the task that owns the key (no hop); ``*moves`` is
partitioned by the record's unique id and its count is a hop to the key's task; ``*plain`` (by id too) has no
topology. The checker replays the depots and compares the counts, so every record must be applied exactly as
often as it is in its depot. Every partitioner is deterministic (never ``random``), so the history knows the
task group of every append.
"""

from pstate import Map
from topology import Module, hash_by

#: Every record's key is one of these, so the checker knows every PState key there is to read.
KEYS = tuple(f"k{i}" for i in range(12))
#: Depot -> the PState that counts its records by key (None: no topology).
COUNTED = {"*events": "$$counts", "*moves": "$$tally", "*plain": None}


def by_key(record: dict) -> str:
    return record["key"]


def by_id(record: dict) -> str:
    return record["id"]


def plus_one(n: int | None) -> int:
    return (n or 0) + 1


class Campaign(Module):
    def define(self, m):
        events = m.depot("*events", hash_by(by_key))
        moves = m.depot("*moves", hash_by(by_id))
        m.depot("*plain", hash_by(by_id))
        m.pstate("$$counts", Map(str, int))
        m.pstate("$$tally", Map(str, int))

        @m.stream(events)
        def count(ctx, record):
            ctx.update("$$counts", record["key"], plus_one)

        @m.stream(moves)
        def tally(ctx, record):
            ctx.update("$$tally", record["key"], plus_one)  # a hop when another task owns the key
