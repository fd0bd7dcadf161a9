"""Replication options, with their operator-facing names and defaults.

The dotted names (``replication.max.time.lag.millis`` ...) are what operators
type in ``conductor set-option`` and what module specs carry in ZooKeeper; the
state machines only ever see a frozen :class:`ReplicationConfig`, so a change of
options is a new object handed to a new state machine, never a field mutated
under a running leader.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

#: ``replog.segment.bytes``: retention deletes whole segments, so this is also the granularity of disk use
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024

#: dotted option name -> field of :class:`ReplicationConfig`
OPTION_NAMES: dict[str, str] = {
    "replication.factor": "replication_factor",
    "replication.min.isr": "min_isr",
    "replication.max.time.lag.millis": "max_time_lag_ms",
    "replication.depot.append.timeout.millis": "append_timeout_ms",
    "replication.max.near.sync.message.lag": "max_near_sync_message_lag",
    "replication.max.inflight.entries": "max_inflight_entries",
    "replication.max.inflight.bytes": "max_inflight_bytes",
    "replication.max.unapplied.entries": "max_unapplied_entries",
    "replication.max.unapplied.bytes": "max_unapplied_bytes",
    "replication.max.batch.entries": "max_batch_entries",
    "replication.request.timeout.millis": "request_timeout_ms",
    "replication.heartbeat.interval.millis": "heartbeat_interval_ms",
    "replication.far.horizon.retry.millis": "far_horizon_retry_ms",
}


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    """Limits and timeouts of one task group's replication.

    Every limit exists so that a slow or dead peer costs bounded memory and a
    bounded wait, never an unbounded queue: in-flight data per follower, the
    leader's lead over the apply offset, and how long an append may wait.
    """

    replication_factor: int = 3
    #: replicas that must hold an entry before it is applied; ``None`` means
    #: the default ``replication_factor - 1`` (at least 1), see :attr:`effective_min_isr`.
    min_isr: int | None = None
    #: an ISR member that has not confirmed an entry this long is moved to the OSR.
    max_time_lag_ms: int = 10_000
    #: a client append not answered at its ack level by then fails (StalledGroup / Backpressure).
    append_timeout_ms: int = 30_000
    #: followers further behind than this many entries use far-horizon catchup.
    max_near_sync_message_lag: int = 20_000
    #: per-follower bound on entries sent but not yet acknowledged.
    max_inflight_entries: int = 50_000
    #: per-follower bound on bytes sent but not yet acknowledged.
    max_inflight_bytes: int = 64 * 1024 * 1024
    #: bound on the leader's log end over its apply offset, in entries; appends beyond fail with Backpressure.
    max_unapplied_entries: int = 100_000
    #: same bound in bytes (counting entries appended under this leadership).
    max_unapplied_bytes: int = 256 * 1024 * 1024
    #: most entries in one replication frame (the driver may split further by bytes).
    max_batch_entries: int = 5_000
    #: resend unacknowledged frames / epoch requests after this long.
    request_timeout_ms: int = 1_000
    #: the leader sends an empty frame (apply offset, epoch) at least this often. Only an idle group beats
    #: (entries carry the same news), and nothing waits on a beat: ISR lag is measured from entries and
    #: failures are detected by sessions, so a beat only repairs a lost message. At 200 ms the beats and
    #: their acks were most of an idle cluster's CPU; a new apply offset or epoch goes out at once anyway.
    heartbeat_interval_ms: int = 1_000
    #: re-issue StartFarHorizon if the follower has not caught up after this long.
    far_horizon_retry_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.replication_factor < 1:
            raise ValueError(f"replication.factor must be >= 1, got {self.replication_factor}")
        if self.min_isr is not None and not 1 <= self.min_isr <= self.replication_factor:
            raise ValueError(
                f"replication.min.isr must be between 1 and replication.factor "
                f"({self.replication_factor}), got {self.min_isr}"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("replication_factor", "min_isr") and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{_dotted(f.name)} must be a positive integer, got {value!r}")

    @property
    def effective_min_isr(self) -> int:
        """min-ISR as the design defines it: ``replicationFactor - 1`` unless set, and at least 1."""
        if self.min_isr is not None:
            return self.min_isr
        return max(1, self.replication_factor - 1)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ReplicationConfig:
        """Build from dotted option names (as stored in the module spec); unknown names are an error."""
        kwargs: dict[str, int | None] = {}
        for name, value in options.items():
            field = OPTION_NAMES.get(name)
            if field is None:
                known = ", ".join(sorted(OPTION_NAMES))
                raise ValueError(f"unknown replication option {name!r}; known options: {known}")
            kwargs[field] = None if value is None else int(value)
        return cls(**kwargs)  # type: ignore[arg-type]

    def to_options(self) -> dict[str, int | None]:
        """The inverse of :meth:`from_options`."""
        return {name: getattr(self, field) for name, field in OPTION_NAMES.items()}


def _dotted(field: str) -> str:
    for name, f in OPTION_NAMES.items():
        if f == field:
            return name
    return field
