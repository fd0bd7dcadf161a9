"""The leader-epoch cache: which epoch wrote which range of the replog.

Truncating a follower "to the high watermark" loses or diverges data when
leaders change quickly (KIP-101); truncating by epoch does not. The cache maps
each leader epoch to the first offset written in it, so that
``end_offset_for(e)`` answers "where did epoch ``e`` (or the largest epoch not
after it) end in this log" — the question a follower asks its new leader before
trusting anything past the point where their histories may differ.

This class is in-memory only. It never touches disk: the caller persists
:meth:`to_pairs` durably (``replog/epoch_file.py``) whenever a method returns
``True`` / changes the pairs, and rebuilds with :meth:`from_pairs` on restart,
followed by ``truncate_from_end(recovered log end)`` because the pairs may
name epochs whose entries did not survive the crash.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

#: returned as the epoch by :meth:`EpochCache.end_offset_for` when no epoch at or
#: before the requested one is known.
UNDEFINED_EPOCH = -1


class EpochCache:
    """Ordered ``(epoch, start offset)`` pairs; epochs and starts both strictly increase."""

    __slots__ = ("_epochs", "_starts")

    def __init__(self, pairs: Iterable[tuple[int, int]] = ()) -> None:
        self._epochs: list[int] = []
        self._starts: list[int] = []
        for epoch, start in pairs:
            self.assign(epoch, start)

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[int, int]]) -> EpochCache:
        return cls(pairs)

    def to_pairs(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts, strict=True))

    def __len__(self) -> int:
        return len(self._epochs)

    def __repr__(self) -> str:
        return f"EpochCache({self.to_pairs()!r})"

    def latest_epoch(self) -> int | None:
        return self._epochs[-1] if self._epochs else None

    def latest_start(self) -> int | None:
        return self._starts[-1] if self._starts else None

    def assign(self, epoch: int, start: int) -> bool:
        """Record that ``epoch`` starts writing at ``start``; returns whether the pairs changed.

        Re-assigning the latest epoch is a no-op (every entry of a batch calls
        this). A new epoch whose start equals earlier starts replaces those
        epochs: they wrote nothing, and keeping them would make
        :meth:`end_offset_for` answer with an empty epoch.
        """
        assert epoch >= 0 and start >= 0, (epoch, start)
        if self._epochs:
            latest = self._epochs[-1]
            if epoch == latest:
                assert start >= self._starts[-1], f"epoch {epoch} re-assigned at {start} < {self._starts[-1]}"
                return False
            assert epoch > latest, f"epoch {epoch} assigned after newer epoch {latest}"
            assert start >= self._starts[-1], f"epoch {epoch} starts at {start}, before epoch {latest}"
            while self._starts and self._starts[-1] >= start:
                self._epochs.pop()
                self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start)
        return True

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """KIP-101/KIP-279 lookup: ``(largest known epoch <= epoch, its exclusive end offset)``.

        The end offset is the start of the next known epoch, or ``log_end`` for
        the latest one. If every known epoch is newer than ``epoch`` the answer
        is ``(UNDEFINED_EPOCH, first start)``: nothing from that point on can
        match the asker's history (Kafka answers UNDEFINED; giving the first
        start lets the follower truncate without a second round).
        """
        if not self._epochs:
            return UNDEFINED_EPOCH, log_end
        if epoch < self._epochs[0]:
            return UNDEFINED_EPOCH, self._starts[0]
        i = bisect_right(self._epochs, epoch) - 1
        if i == len(self._epochs) - 1:
            return self._epochs[i], log_end
        return self._epochs[i], self._starts[i + 1]

    def epoch_at(self, offset: int) -> int | None:
        """Epoch that wrote ``offset`` (assuming the log holds it), or None if before every start."""
        i = bisect_right(self._starts, offset) - 1
        return self._epochs[i] if i >= 0 else None

    def truncate_from_end(self, end: int) -> bool:
        """The log was cut to ``[.., end)``: forget epochs that start at or after ``end``."""
        changed = False
        while self._starts and self._starts[-1] >= end:
            self._epochs.pop()
            self._starts.pop()
            changed = True
        return changed

    def truncate_from_start(self, start: int) -> bool:
        """Segments below ``start`` were deleted: drop epochs that ended before it, clamp the one containing it."""
        i = bisect_right(self._starts, start) - 1
        if i < 0 or (i == 0 and self._starts[0] == start):
            return False
        del self._epochs[:i]
        del self._starts[:i]
        self._starts[0] = start
        return True
