"""Poison inputs: bounded retries with backoff, then the dead-letter depot, and the topology moves on.

User code that raises must neither stop a task group nor be retried forever.
On the record's home group, the client's append is refused with the error (the
appender is the one who can fix or drop it). Anywhere else (a hop message, a
record appended by a topology or a microbatch) nobody is waiting to be told,
so the consumer retries the envelope a few times with growing pauses (the
code may depend on something that comes back), holding later envelopes from
the same source so their order is kept; when the retries are spent, each
message that still fails becomes a record of the module's ``*dead_letters``
depot (with the error and the hop it failed at) in the same entry that
consumes the envelope, and everything else in it takes effect.

Attempts are counted in the consumer's memory: a leader change starts the
count again, which at worst retries a poison envelope a few more times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: attempts of an envelope before its failing messages go to the dead-letter depot
ATTEMPTS = 4
#: pause after the first failed attempt; each further one waits BACKOFF_FACTOR times longer
BACKOFF_MS = 100
BACKOFF_FACTOR = 4
#: longest error text kept in a dead letter
MAX_ERROR_CHARS = 2000

Key = tuple[int, int]  # (source group, envelope seq)


@dataclass
class RetryBook:
    """Failed attempts per envelope and when the next may run."""

    attempts: int = ATTEMPTS
    backoff_ms: int = BACKOFF_MS
    factor: int = BACKOFF_FACTOR
    _failures: dict[Key, tuple[int, int]] = field(default_factory=dict)  # key -> (failures, retry at ms)

    def last_attempt(self, key: Key) -> bool:
        """True when the coming attempt is the last: its failures go to the dead-letter depot."""
        return self._failures.get(key, (0, 0))[0] + 1 >= self.attempts

    def failed(self, key: Key, now_ms: int) -> int:
        """An attempt failed (not the last); returns when the next may run."""
        n = self._failures.get(key, (0, 0))[0] + 1
        assert n < self.attempts, f"{key}: the last attempt dead-letters instead of failing"
        at: int = now_ms + self.backoff_ms * self.factor ** (n - 1)
        self._failures[key] = (n, at)
        return at

    def retry_at(self, key: Key) -> int:
        """When the envelope may be tried again (0: now)."""
        return self._failures.get(key, (0, 0))[1]

    def attempts_made(self, key: Key) -> int:
        return self._failures.get(key, (0, 0))[0]

    def forget(self, key: Key) -> None:
        self._failures.pop(key, None)

    def __len__(self) -> int:
        return len(self._failures)


def dead_letter(hop: str, error: str, task: int, message: Any, src: int, attempts: int) -> dict[str, Any]:
    """The dead-letter record of a message: what failed, where, and what it was given."""
    record = {"hop": hop, "error": error[:MAX_ERROR_CHARS], "task": task, "from_group": src, "attempts": attempts}
    if isinstance(message, list) and len(message) == 4:
        record.update(handler=message[0], key=_plain(message[2]), args=_plain(message[3]))
    else:
        record["message"] = repr(message)[:MAX_ERROR_CHARS]
    return record


def _plain(v: Any) -> Any:
    """A value a depot can store: sets become (sorted where possible) lists; msgpack takes the rest."""
    if isinstance(v, (set, frozenset)):
        items = [_plain(x) for x in v]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {(str(k) if isinstance(k, (set, frozenset)) else k): _plain(x) for k, x in v.items()}
    return v
