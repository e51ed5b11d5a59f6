"""Inline SVG charts for the report: pure functions, strings out, no network to view them."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
Point = tuple[float, float]


def _ticks(top: float, count: int = 4) -> list[float]:
    if top <= 0:
        return [0.0]
    raw = top / count
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(count + 2) if i * step <= top * 1.0001 + step]


def _fmt(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:g}M"
    if value >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


class _Frame:
    """Maps data to pixels inside margins; draws axes, ticks and labels."""

    def __init__(self, width: int, height: int, x_max: float, y_max: float,
                 x_min: float = 0.0) -> None:
        self.w, self.h = width, height
        self.left, self.right, self.top, self.bottom = 56, 12, 12, 34
        self.x_min = x_min
        self.x_max = x_max if x_max > x_min else x_min + 1
        self.y_ticks = _ticks(y_max or 1.0)
        self.y_max = max(self.y_ticks[-1], y_max or 1.0)

    def x(self, value: float) -> float:
        span = self.w - self.left - self.right
        return self.left + span * (value - self.x_min) / (self.x_max - self.x_min)

    def y(self, value: float) -> float:
        span = self.h - self.top - self.bottom
        return self.top + span * (1 - value / self.y_max)

    def axes(self, x_label: str, y_label: str, x_ticks: Sequence[float]) -> str:
        parts = [f'<line x1="{self.left}" y1="{self.y(0):.1f}" x2="{self.w - self.right}" '
                 f'y2="{self.y(0):.1f}" stroke="#444"/>',
                 f'<line x1="{self.left}" y1="{self.top}" x2="{self.left}" y2="{self.y(0):.1f}" '
                 f'stroke="#444"/>']
        for tick in self.y_ticks:
            parts.append(f'<text x="{self.left - 4}" y="{self.y(tick) + 4:.1f}" font-size="10" '
                         f'text-anchor="end">{_fmt(tick)}</text>'
                         f'<line x1="{self.left}" x2="{self.w - self.right}" y1="{self.y(tick):.1f}" '
                         f'y2="{self.y(tick):.1f}" stroke="#eee"/>')
        for tick in x_ticks:
            parts.append(f'<text x="{self.x(tick):.1f}" y="{self.h - self.bottom + 14}" '
                         f'font-size="10" text-anchor="middle">{_fmt(tick)}</text>')
        parts.append(f'<text x="{(self.left + self.w - self.right) / 2:.1f}" y="{self.h - 4}" '
                     f'font-size="11" text-anchor="middle">{escape(x_label)}</text>'
                     f'<text x="12" y="{(self.top + self.h - self.bottom) / 2:.1f}" font-size="11" '
                     f'text-anchor="middle" transform="rotate(-90 12 '
                     f'{(self.top + self.h - self.bottom) / 2:.1f})">{escape(y_label)}</text>')
        return "".join(parts)


def _polyline(frame: _Frame, points: Sequence[Point], color: str, dashed: bool = False) -> str:
    coords = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in points)
    dash = ' stroke-dasharray="6 4"' if dashed else ""
    dots = "" if dashed else "".join(
        f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="3" fill="{color}"/>'
        for x, y in points)
    return f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{coords}"/>{dots}'


def line_chart(lines: dict[str, Sequence[Point]], *, target: Sequence[Point] = (),
               x_label: str, y_label: str, title: str, width: int = 520,
               height: int = 300, chart_id: str = "") -> str:
    """Lines of (x, y) points, one colour each, with an optional dashed target line."""
    xs = [x for points in lines.values() for x, _ in points] + [x for x, _ in target]
    ys = [y for points in lines.values() for _, y in points] + [y for _, y in target]
    frame = _Frame(width, height, max(xs, default=1.0), max(ys, default=1.0))
    body = [frame.axes(x_label, y_label, sorted(set(xs)))]
    legend = []
    for i, (label, points) in enumerate(sorted(lines.items())):
        color = PALETTE[i % len(PALETTE)]
        body.append(_polyline(frame, sorted(points), color))
        legend.append(f'<text x="{frame.left + 8}" y="{frame.top + 14 * (i + 1)}" font-size="11" '
                      f'fill="{color}">{escape(label)}</text>')
    if target:  # drawn last: a line that follows the target stays visible under the dashes
        body.append(_polyline(frame, sorted(target), "#555", dashed=True))
        legend.append(f'<text x="{frame.left + 8}" y="{frame.top + 14 * (len(lines) + 1)}" '
                      f'font-size="11" fill="#666">target (theoretical maximum)</text>')
    ident = f' id="{escape(chart_id)}"' if chart_id else ""
    return (f'<svg{ident} class="chart" role="img" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><title>{escape(title)}</title>'
            + "".join(body + legend) + "</svg>")


def time_series(seconds: Sequence[int], values: Sequence[float], *, window: tuple[int, int],
                title: str, width: int = 360, height: int = 160) -> str:
    """Per-second values over a whole stage, the measure window shaded."""
    if not seconds:
        return ""
    start = seconds[0]
    frame = _Frame(width, height, seconds[-1] - start + 1, max(values, default=1.0) or 1.0)
    shade = (f'<rect class="window" x="{frame.x(window[0] - start):.1f}" y="{frame.top}" '
             f'width="{frame.x(window[1] - start) - frame.x(window[0] - start):.1f}" '
             f'height="{frame.y(0) - frame.top:.1f}" fill="#dfe8f5"/>')
    points = [(s - start + 0.5, v) for s, v in zip(seconds, values)]
    ticks = list(range(0, seconds[-1] - start + 2, max(1, (seconds[-1] - start) // 5 or 1)))
    return (f'<svg class="series" role="img" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><title>{escape(title)}</title>{shade}'
            + frame.axes("seconds since stage start", "msg/s", ticks)
            + _polyline(frame, points, PALETTE[0]) + "</svg>")
