"""The store side of a replica as its host drives it (:class:`EntryApplier`): apply, stage, checkpoint, close.

``ReplicaStore`` implements it over RocksDB; the host's unit tests drive the same calls. Its own module so
the host (the task thread's driver) and the store can change apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from conductor.worker.store_swap import PreparedStore
from pstate.checkpoint import Checked, Manifest
from topology.dataflow.group import GroupDataflow


class EntryApplier(Protocol):
    """The store side of a replica: applies replog entries atomically with its applied offset."""

    @property
    def applied_offset(self) -> int: ...

    def apply_entries(self, entries: list[tuple[int, int, bytes]], flow: GroupDataflow | None = None) -> None: ...

    def stage(self, offset: int, builder: Any, payload: bytes | None = None) -> bytes: ...

    def drop_staged(self) -> None: ...

    def stage_inherited(self, entries: list[tuple[int, int, bytes]]) -> None: ...

    def flush(self) -> None: ...

    def checkpoint(self, directory: Path, leader_epoch: int) -> Manifest: ...

    def prepare_install(self, staging: Path, manifest: Manifest, checked: Checked) -> PreparedStore:
        """Off the task thread: a fetched checkpoint made ready to swap in (conductor.worker.store_swap)."""

    def install_prepared(self, prepared: PreparedStore) -> None:
        """Task thread: swap it in (the caller claimed it)."""

    def close(self) -> None: ...

    def abandon(self) -> None: ...
