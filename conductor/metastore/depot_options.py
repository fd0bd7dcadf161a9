"""Depot options: retention by age and size, key compaction, how often a leader checks them.

Each is a module option (``conductor set-option``, live: the worker's retention driver reads the spec at
every check) naming a bound for every depot of the module, and may be set for one depot by suffixing the
depot's name: ``depot.retention.bytes.*clicks``. The per-depot value wins. ``*dead_letters`` is kept
:data:`DEAD_LETTERS_RETENTION_MS` unless an option says otherwise, so failed messages never fill a disk.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from topology.module import DEAD_LETTERS

RETENTION_MS = "depot.retention.ms"
RETENTION_BYTES = "depot.retention.bytes"
COMPACTION = "depot.compaction"
DELETE_RETENTION_MS = "depot.delete.retention.ms"
CHECK_INTERVAL_MS = "depot.retention.check.interval.ms"
#: the options that may name one depot (``<option>.<*depot>``)
PER_DEPOT = (RETENTION_MS, RETENTION_BYTES, COMPACTION, DELETE_RETENTION_MS)

DEAD_LETTERS_RETENTION_MS = 7 * 24 * 3600 * 1000
DEFAULT_DELETE_RETENTION_MS = 24 * 3600 * 1000
DEFAULT_CHECK_INTERVAL_MS = 5000
#: records a retention check's key compaction may index, over all the group's partitions (its task-thread
#: pause is bounded by it)
CHECK_COMPACTION_LIMIT = 10_000


def split_depot_option(key: str) -> tuple[str, str | None]:
    """``depot.retention.ms.*clicks`` -> (``depot.retention.ms``, ``*clicks``); other keys -> (key, None)."""
    base, sep, depot = key.partition(".*")
    if sep and base in PER_DEPOT and depot:
        return base, "*" + depot
    return key, None


def depot_settings(options: Mapping[str, str], depot: str, parse: Callable[[str, str], int]) -> dict[str, int]:
    """The fields of ``depot``'s :class:`pstate.retention.RetentionPolicy` under a module's stored ``options``
    (validated already); plain values, so that the client, which reads specs, never loads the store."""

    def value(base: str, default: int) -> int:
        for key in (f"{base}.{depot}", base):
            if key in options:
                return parse(key, options[key])
        return default

    return {"retention_ms": value(RETENTION_MS, DEAD_LETTERS_RETENTION_MS if depot == DEAD_LETTERS else 0),
            "retention_bytes": value(RETENTION_BYTES, 0),
            "compaction": value(COMPACTION, 0),
            "delete_retention_ms": value(DELETE_RETENTION_MS, DEFAULT_DELETE_RETENTION_MS)}
