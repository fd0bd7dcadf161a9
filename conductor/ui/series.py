"""Time series kept in the conductor's memory for the UI's charts: a ring buffer per series, a bounded count.

The registry is generic: a series is a name and a set of labels (``module``, ``node``, ...), and whoever
computes a value (the scraper today, histograms from the workers later) records it under any name. Memory
is bounded twice: each series keeps at most ``points`` samples (a ``deque`` with ``maxlen``: the oldest
drops out), and the registry holds at most ``max_series`` series (a new one past that is refused and
counted, never evicting a series a chart is showing).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

#: a series' identity: its name and its labels as sorted (key, value) pairs
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def series_key(name: str, labels: Mapping[str, str]) -> SeriesKey:
    return name, tuple(sorted(labels.items()))


@dataclass(frozen=True)
class Point:
    """One sample: wall-clock seconds and a value."""

    t: float
    v: float


class SeriesStore:
    """Bounded ring buffers keyed by (name, labels); safe to use from the scraper and the HTTP threads."""

    def __init__(self, points: int, max_series: int = 2000) -> None:
        assert points > 0 and max_series > 0, (points, max_series)
        self.points = points
        self.max_series = max_series
        #: samples refused because the registry was full (shown on the UI, so a cut is never silent)
        self.refused = 0
        self._series: dict[SeriesKey, deque[Point]] = {}
        self._lock = threading.Lock()

    def record(self, name: str, labels: Mapping[str, str], t: float, value: float) -> bool:
        """Append one sample; False if the series is new and the registry is full."""
        key = series_key(name, labels)
        with self._lock:
            ring = self._series.get(key)
            if ring is None:
                if len(self._series) >= self.max_series:
                    self.refused += 1
                    return False
                ring = self._series[key] = deque(maxlen=self.points)
            ring.append(Point(t, value))
        return True

    def get(self, name: str, labels: Mapping[str, str], since: float = 0.0) -> list[Point]:
        """The samples of one series at or after ``since`` (oldest first); [] for an unknown series."""
        with self._lock:
            ring = self._series.get(series_key(name, labels))
            return [p for p in ring if p.t >= since] if ring is not None else []

    def select(self, name: str, **match: str) -> dict[tuple[tuple[str, str], ...], list[Point]]:
        """Every series called ``name`` whose labels include ``match``, by its labels."""
        with self._lock:
            return {labels: list(ring) for (n, labels), ring in self._series.items()
                    if n == name and all((k, v) in labels for k, v in match.items())}

    def label_values(self, label: str) -> set[str]:
        """Every value ``label`` takes across the series (the modules that have charts)."""
        with self._lock:
            return {v for _, labels in self._series for k, v in labels if k == label}

    def forget(self, **match: str) -> None:
        """Drop every series whose labels include ``match`` (a destroyed module's)."""
        with self._lock:
            for key in [k for k in self._series if all((m, v) in k[1] for m, v in match.items())]:
                del self._series[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._series)
