"""The promise rule of depot trims: where a trim entry may start a partition, over offsets only.

Depot retention (``depot.retention.*``, ``Depot.trim``, ``conductor trim``) deletes records by appending a
trim entry, so every replica deletes the same ones. Which records that entry may drop is a replication
rule, not a storage one: a trim drops only records the leader that built it had *applied*. Applied entries
are committed (in every ISR member's log), so no trim covers a record whose append could still be truncated
or retried, and what a reader was told is readable (a partition's applied end) stays readable until a trim
built after it. The leader's store (:func:`pstate.retention.trim`) and the simulator (``tests/sim``, which
checks every committed trim against the committed prefix) call this one function, so the rule they run is
the same. Pure: offsets in, offset out.
"""

from __future__ import annotations


def trim_point(before: int, start: int, applied_end: int) -> int:
    """The new start of a partition holding ``start <= offset < applied_end`` (applied) asked to drop records
    below ``before``.

    Never below the start (a trim only removes a prefix) and never above the applied end (records not yet
    applied are not trimmed: their append may still be truncated, and no reader was told of them).
    """
    assert 0 <= start <= applied_end, (start, applied_end)
    return min(max(before, start), applied_end)
