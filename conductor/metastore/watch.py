"""What a ``watch`` call returns: a way to stop its callbacks."""

from __future__ import annotations


class WatchHandle:
    """Returned by ``watch_*``; ``cancel()`` stops further callbacks (kazoo drops the watch on its next event)."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
