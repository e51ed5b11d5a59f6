"""Inline SVG charts for the report: pure functions, strings out, no network to view them.

Hand-drawn rather than a JavaScript charting library on purpose: the report must open
anywhere without a network (a library would be inlined into every report: uPlot, the
smallest kept one, is 51 KB), draw the same bytes for the same run (reports are re-rendered
from the store and compared), and be checked by reading its DOM (tests/test_report.py
counts the drawn series, bands and markers, which a canvas would hide). What a library
would add here is zoom and hover; each point carries a `<title>` with its value instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
VERDICT_COLORS = {"regression": "#d62728", "suspected": "#ff7f0e", "improvement": "#2ca02c"}
Point = tuple[float, float]
# The log-percentile axis: x = -log10(1 - p/100), so 90, 99, 99.9 are evenly spaced
PERCENTILE_TICKS = (50.0, 90.0, 99.0, 99.9, 99.99, 99.999)


def _nice_step(raw: float) -> float:
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def _fmt(value: float) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:.4g}"


def percentile_x(pct: float) -> float:
    """Where percentile `pct` (0-100, below 100) sits on the log-percentile axis."""
    return -math.log10(1 - pct / 100)


@dataclass(frozen=True)
class Scale:
    """An axis: data -> a fraction of its length, and its ticks. `kind` is "linear", "log"
    (values > 0) or "percentile" (values already `percentile_x`, ticks as percentiles)."""

    lo: float
    hi: float
    kind: str = "linear"

    @classmethod
    def fit(cls, values: Sequence[float], kind: str = "linear", zero: bool = True) -> Scale:
        """The scale that holds `values`; a linear one from 0 (when `zero`) to a nice top."""
        values = [v for v in values if v is not None and (kind != "log" or v > 0)]
        if kind == "log":
            lo, hi = (min(values), max(values)) if values else (1.0, 10.0)
            return cls(10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi) + 1e-9),
                       "log")
        lo = min([0.0, *values]) if zero else min(values, default=0.0)
        hi = max(values, default=1.0)
        # one value, or all equal to within rounding (1000.0 and 1000.0000000000002 would
        # make a tick step that rounds to nothing): in the middle
        if hi - lo <= 1e-9 * max(abs(hi), abs(lo)):
            pad = abs(hi) * 0.05 or 1.0
            lo, hi = (lo if zero and lo == 0 else lo - pad), hi + pad
        if kind == "linear":
            step = _nice_step((hi - lo) / 4)
            lo, hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
        return cls(lo, hi, kind)

    def fraction(self, value: float) -> float:
        if self.kind == "log":
            return (math.log10(max(value, self.lo)) - math.log10(self.lo)) / (
                math.log10(self.hi) - math.log10(self.lo))
        return (value - self.lo) / (self.hi - self.lo)

    def ticks(self) -> list[tuple[float, str]]:
        if self.kind == "percentile":
            return [(percentile_x(p), f"{p:g}") for p in PERCENTILE_TICKS
                    if percentile_x(p) <= self.hi * 1.0001]
        if self.kind == "log":
            decades = range(round(math.log10(self.lo)), round(math.log10(self.hi)) + 1)
            steps = (1, 2, 5) if len(decades) <= 3 else (1,)  # a label per decade when many
            return [(m * 10 ** d, _fmt(m * 10 ** d)) for d in decades for m in steps
                    if m * 10 ** d <= self.hi]
        step = _nice_step((self.hi - self.lo) / 4)
        count = round((self.hi - self.lo) / step)
        return [(self.lo + i * step, _fmt(self.lo + i * step)) for i in range(count + 1)]


class Frame:
    """Maps data to pixels inside margins; draws axes, ticks and labels."""

    def __init__(self, width: int, height: int, x: Scale, y: Scale) -> None:
        self.w, self.h, self.xs, self.ys = width, height, x, y
        self.left, self.right, self.top, self.bottom = 52, 10, 10, 32

    def x(self, value: float) -> float:
        return self.left + (self.w - self.left - self.right) * self.xs.fraction(value)

    def y(self, value: float) -> float:
        return self.top + (self.h - self.top - self.bottom) * (1 - self.ys.fraction(value))

    def axes(self, x_label: str, y_label: str,
             x_ticks: Sequence[tuple[float, str]] | None = None) -> str:
        base = self.h - self.bottom
        parts = [f'<line x1="{self.left}" y1="{base}" x2="{self.w - self.right}" y2="{base}" '
                 'stroke="#444"/>',
                 f'<line x1="{self.left}" y1="{self.top}" x2="{self.left}" y2="{base}" stroke="#444"/>']
        for tick, label in self.ys.ticks():
            parts.append(f'<text x="{self.left - 4}" y="{self.y(tick) + 4:.1f}" font-size="10" '
                         f'text-anchor="end">{label}</text>'
                         f'<line x1="{self.left}" x2="{self.w - self.right}" y1="{self.y(tick):.1f}" '
                         f'y2="{self.y(tick):.1f}" stroke="#eee"/>')
        for tick, label in (self.xs.ticks() if x_ticks is None else x_ticks):
            parts.append(f'<text x="{self.x(tick):.1f}" y="{base + 13}" font-size="10" '
                         f'text-anchor="middle">{escape(label)}</text>')
        middle = (self.top + base) / 2
        parts.append(f'<text x="{(self.left + self.w - self.right) / 2:.1f}" y="{self.h - 3}" '
                     f'font-size="11" text-anchor="middle">{escape(x_label)}</text>'
                     f'<text x="11" y="{middle:.1f}" font-size="11" text-anchor="middle" '
                     f'transform="rotate(-90 11 {middle:.1f})">{escape(y_label)}</text>')
        return "".join(parts)

    def polyline(self, points: Sequence[Point], color: str, *, dashed: bool = False,
                 dots: bool = True, css: str = "line") -> str:
        coords = " ".join(f"{self.x(x):.1f},{self.y(y):.1f}" for x, y in points)
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        marks = "".join(f'<circle cx="{self.x(x):.1f}" cy="{self.y(y):.1f}" r="2.5" '
                        f'fill="{color}"><title>{_fmt(y)}</title></circle>'
                        for x, y in points) if dots and not dashed else ""
        return (f'<polyline class="{css}" fill="none" stroke="{color}" stroke-width="2"{dash} '
                f'points="{coords}"/>{marks}')

    def svg(self, body: Sequence[str], title: str, *, css: str = "chart",
            chart_id: str = "") -> str:
        ident = f' id="{escape(chart_id)}"' if chart_id else ""
        return (f'<svg{ident} class="{css}" role="img" width="{self.w}" height="{self.h}" '
                f'viewBox="0 0 {self.w} {self.h}"><title>{escape(title)}</title>'
                + "".join(body) + "</svg>")


def _legend(frame: Frame, labels: Sequence[tuple[str, str]]) -> str:
    return "".join(f'<text x="{frame.left + 8}" y="{frame.top + 12 * (i + 1)}" font-size="11" '
                   f'fill="{color}">{escape(label)}</text>' for i, (label, color) in enumerate(labels))


def line_chart(lines: dict[str, Sequence[Point]], *,
               targets: dict[str, Sequence[Point]] | None = None,
               x_label: str, y_label: str, title: str, width: int = 520,
               height: int = 300, chart_id: str = "", x_kind: str = "linear",
               y_kind: str = "linear", x_ticks: Sequence[tuple[float, str]] | None = None) -> str:
    """Lines of (x, y) points, one colour each, and dashed target lines: a line's own
    (`targets` under its label) in its colour, or one for all (under any other label) in
    grey."""
    targets = targets or {}
    everything = [*lines.values(), *targets.values()]
    xs = [x for points in everything for x, _ in points]
    ys = [y for points in everything for _, y in points]
    frame = Frame(width, height, Scale.fit(xs, x_kind), Scale.fit(ys, y_kind))
    if x_ticks is None and x_kind == "linear":
        x_ticks = [(x, _fmt(x)) for x in sorted(set(xs))]
    body = [frame.axes(x_label, y_label, x_ticks)]
    legend = []
    colors = {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(sorted(lines))}
    for label, points in sorted(lines.items()):
        body.append(frame.polyline(sorted(points), colors[label]))
        legend.append((label, colors[label]))
    # drawn last: a line that follows its target stays visible under the dashes
    for label, points in sorted(targets.items()):
        body.append(frame.polyline(sorted(points), colors.get(label, "#555"), dashed=True))
        legend.append((f"{label} expected (every intended delivery)" if label in colors
                       else "expected (every intended delivery)", colors.get(label, "#666")))
    return frame.svg([*body, _legend(frame, legend)], title, chart_id=chart_id)


def time_series(seconds: Sequence[int], values: Sequence[float | None], *,
                window: tuple[int, int], title: str, y_label: str = "msg/s",
                width: int = 330, height: int = 150, color: str = PALETTE[0]) -> str:
    """Per-second values (null: no value that second), the measure window shaded."""
    if not seconds:
        return ""
    start = seconds[0]
    points = [(s - start + 0.5, v) for s, v in zip(seconds, values) if v is not None]
    frame = Frame(width, height, Scale(0, seconds[-1] - start + 1),
                  Scale.fit([v for _, v in points]))
    shade = (f'<rect class="window" x="{frame.x(window[0] - start):.1f}" y="{frame.top}" '
             f'width="{frame.x(window[1] - start) - frame.x(window[0] - start):.1f}" '
             f'height="{frame.y(frame.ys.lo) - frame.top:.1f}" fill="#dfe8f5"/>')
    return frame.svg([shade, frame.axes("seconds since stage start", y_label),
                      frame.polyline(points, color, dots=len(points) <= 30)], title, css="series")


@dataclass(frozen=True)
class Night:
    """One night of a metric's history as the history chart draws it."""

    label: str  # e.g. the night's date
    value: float
    verdict: str | None = None  # tonight's word on it (None: not judged)
    baseline: float | None = None  # the baseline it was judged against
    band: tuple[float, float] | None = None  # the baseline's noise band (low, high)


def history_chart(nights: Sequence[Night], *, title: str, y_label: str,
                  change_at: int | None = None, chart_id: str = "",
                  scale: Callable[[float], float] = float, width: int = 360,
                  height: int = 190) -> str:
    """A metric night by night (oldest first): its values, the baseline each night was judged
    against with its noise band shaded, flagged nights marked in their verdict's colour, and
    a dashed line where the level shift began (`change_at`: an index into `nights`)."""
    xs = range(1, len(nights) + 1)
    values = [scale(n.value) for n in nights]
    bands = [(x, scale(n.band[0]), scale(n.band[1])) for x, n in zip(xs, nights) if n.band]
    baselines = [(x, scale(n.baseline)) for x, n in zip(xs, nights) if n.baseline is not None]
    frame = Frame(width, height, Scale(0.5, len(nights) + 0.5),
                  Scale.fit(values + [v for _, lo, hi in bands for v in (lo, hi)]
                            + [v for _, v in baselines], zero=False))
    step = max(1, len(nights) // 6)
    ticks = [(x, nights[x - 1].label) for x in xs if (len(nights) - x) % step == 0]
    body = [frame.axes("night", y_label, ticks)]
    if bands:
        edge = [(x, hi) for x, _, hi in bands] + [(x, lo) for x, lo, _ in reversed(bands)]
        body.append('<polygon class="band" fill="#e6e6e6" points="'
                    + " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in edge) + '"/>')
    if baselines:
        body.append(frame.polyline(baselines, "#777", dashed=True, css="baseline"))
    body.append(frame.polyline(list(zip(xs, values)), PALETTE[0], dots=False))
    for x, night, value in zip(xs, nights, values):
        color = VERDICT_COLORS.get(night.verdict or "", PALETTE[0])
        flagged = night.verdict in VERDICT_COLORS
        body.append(f'<circle class="{"flag " + night.verdict if flagged else "night"}" '
                    f'cx="{frame.x(x):.1f}" cy="{frame.y(value):.1f}" r="{4.5 if flagged else 2.5}" '
                    f'fill="{color}"><title>{escape(night.label)}: {_fmt(value)}'
                    f'{" " + escape(night.verdict) if night.verdict else ""}</title></circle>')
    if change_at is not None:
        x = frame.x(change_at + 0.5)
        body.append(f'<line class="change-point" x1="{x:.1f}" x2="{x:.1f}" y1="{frame.top}" '
                    f'y2="{frame.h - frame.bottom}" stroke="#d62728" stroke-dasharray="3 3"/>')
    return frame.svg(body, title, chart_id=chart_id)


def sparkline(values: Sequence[float], *, color: str = PALETTE[0], width: int = 90,
              height: int = 22) -> str:
    """A tiny trend: the values left to right, the last one dotted in `color`."""
    if len(values) < 2:
        return ""
    frame = Frame(width, height, Scale(0, len(values) - 1), Scale.fit(values, zero=False))
    frame.left = frame.right = frame.top = frame.bottom = 3
    last = len(values) - 1
    return frame.svg([frame.polyline(list(enumerate(values)), "#888", dots=False),
                      f'<circle cx="{frame.x(last):.1f}" cy="{frame.y(values[-1]):.1f}" r="2.5" '
                      f'fill="{color}"/>'], "trend", css="sparkline")
