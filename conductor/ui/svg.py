"""Line charts as inline SVG, drawn on the server: no JavaScript, no charting library, nothing to load.

A chart is a few hundred points at most per series (an hour at the scrape interval, thinned to the plot's
width), so a polyline per series is small and every browser, a text-mode one aside, draws it. Each series is
a ``<polyline>`` with ``data-series`` and ``data-points`` attributes, which is what the browser test counts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape
from typing import Any

#: high-contrast line colours, in series order (dark blue, dark red, dark green, black)
COLOURS = ("#0b3d91", "#b00020", "#006400", "#000000")

WIDTH, HEIGHT = 640, 200
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 12, 12, 28


def _thin(points: Sequence[Sequence[float]], most: int) -> list[Sequence[float]]:
    """At most ``most`` points, evenly picked (the last one always kept)."""
    if len(points) <= most:
        return list(points)
    step = len(points) / most
    picked = [points[int(i * step)] for i in range(most)]
    picked[-1] = points[-1]
    return picked


def span(seconds: float) -> str:
    """``90 s``, ``15 min``: how far back a chart reaches."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def window(charts: Sequence[dict[str, Any]], history_s: float, now: float | None = None,
           least_s: float = 60.0) -> float:
    """The seconds the charts span: back to their oldest point (at least ``least_s``), at most the history
    kept, so a conductor that just started shows what it has instead of a sliver at the right edge."""
    now = time.time() if now is None else now
    oldest = min((p[0] for c in charts for s in c["series"] for p in s["points"]), default=now)
    return min(history_s, max(least_s, now - oldest))


def _label(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 10 or v == int(v) else f"{v:.2f}"


def line_chart(chart_id: str, series: Sequence[dict[str, Any]], window_s: float, now: float | None = None) -> str:
    """An SVG chart of ``series`` (``{"name", "legend", "points": [[t, v], ...]}``) over the last ``window_s``."""
    now = time.time() if now is None else now
    start = now - window_s
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM
    values = [v for s in series for t, v in s["points"] if t >= start]
    top = max([*values, 1.0]) * 1.1
    bottom = min([*values, 0.0])

    def x(t: float) -> float:
        return float(_LEFT + (t - start) / window_s * plot_w)

    def y(v: float) -> float:
        return float(_TOP + plot_h - (v - bottom) / ((top - bottom) or 1.0) * plot_h)

    parts = [f'<svg class="chart" id="chart-{escape(chart_id)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
             f'width="{WIDTH}" height="{HEIGHT}" role="img" xmlns="http://www.w3.org/2000/svg">',
             f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#000"/>']
    for frac in (0.0, 0.5, 1.0):
        v = bottom + frac * (top - bottom)
        parts.append(f'<line x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#bbb"/>'
                     f'<text x="{_LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end" font-size="12">{_label(v)}</text>')
    for frac, label in ((0.0, f"-{span(window_s)}"), (1.0, "now")):
        parts.append(f'<text x="{_LEFT + frac * plot_w:.1f}" y="{HEIGHT - 8}" '
                     f'text-anchor="{"start" if frac == 0 else "end"}" font-size="12">{label}</text>')
    for i, s in enumerate(series):
        pts = _thin([p for p in s["points"] if p[0] >= start], plot_w)
        colour = COLOURS[i % len(COLOURS)]
        coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        dash = ' stroke-dasharray="6 4"' if i % 2 else ""
        parts.append(f'<polyline data-series="{escape(s["name"])}" data-points="{len(pts)}" points="{coords}" '
                     f'fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        if len(pts) == 1:  # one point draws no line: show it as a dot
            parts.append(f'<circle cx="{x(pts[0][0]):.1f}" cy="{y(pts[0][1]):.1f}" r="3" fill="{colour}"/>')
    parts.append("</svg>")
    return "".join(parts)


def legend(series: Sequence[dict[str, Any]]) -> str:
    """The chart's legend as HTML: a swatch, the series' name and its latest value."""
    items = []
    for i, s in enumerate(series):
        last = _label(s["points"][-1][1]) if s["points"] else "no data"
        items.append(f'<span class="swatch" style="background:{COLOURS[i % len(COLOURS)]}"></span>'
                     f'{escape(s["legend"])}: <b>{last}</b>')
    return '<div class="legend">' + " &nbsp; ".join(items) + "</div>"
