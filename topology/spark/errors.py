"""The errors the Spark sources raise: each says what went wrong and what to do."""

from __future__ import annotations

from typing import Any


class MillraceSourceError(Exception):
    """Base of the errors the Spark sources raise; the message says what to do."""


class SourceOptionError(MillraceSourceError, ValueError):
    """A missing or malformed option of ``millrace.depot`` / ``millrace.pstate``."""


class DepotOffsetOutOfRange(MillraceSourceError):
    """Offsets a query committed (or planned) are no longer in the depot: truncated or trimmed (KIP-320).

    ``problems`` holds one dict per partition: task, kind (``truncated`` |
    ``trimmed``), committed offset and epoch, and the partition's current
    start, end and leader epoch.
    """

    def __init__(self, module: str, depot: str, problems: list[dict[str, Any]]) -> None:
        self.module = module
        self.depot = depot
        self.problems = problems
        lines = []
        for p in problems:
            if p["kind"] == "truncated":
                lines.append(
                    f"partition {p['task']}: offset {p['offset']} (read at leader epoch {p['epoch']}) is beyond "
                    f"the applied end {p['end']} (leader epoch {p['current_epoch']}): the log was truncated "
                    f"(data loss, or the module was destroyed and deployed again)")
            else:
                lines.append(
                    f"partition {p['task']}: offset {p['offset']} (read at leader epoch {p['epoch']}) is below "
                    f"the partition start {p['start']} (leader epoch {p['current_epoch']}): records "
                    f"[{p['offset']}, {p['start']}) were trimmed before this query read them")
        super().__init__(
            f"depot {module}/{depot}: committed offsets are no longer valid; refusing to skip or re-read "
            f"records silently.\n  " + "\n  ".join(lines) + "\nTo start over knowingly, run the query with a new "
            "checkpointLocation (and startingOffsets=earliest or latest), or delete this query's checkpoint.")


class ValueSchemaMismatch(MillraceSourceError):
    """A record does not fit the ``valueSchema`` option (not a dict, or a field of the wrong type)."""
