"""Entries built and applied one after another on a task group store with one depot (unit tests of depots)."""

from __future__ import annotations

from typing import Any

from pstate.store import TaskGroupStore

#: the store's one depot
D = "*d"


class Applier:
    """Builds one entry with ``build(builder)`` and applies it at the next offset; returns what ``build`` did."""

    def __init__(self, store: TaskGroupStore) -> None:
        self.store = store
        self.offset = 0

    def __call__(self, build: Any) -> Any:
        b = self.store.changes()
        out = build(b)
        self.store.apply(self.offset, b.changeset())
        self.offset += 1
        return out

