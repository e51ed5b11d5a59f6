"""Units a person reads: the report shows latency in ms, memory in MiB and ratios in %,
whatever unit `tasks.metrics` stores them in. Pure."""

from __future__ import annotations

from html import escape

from ..metrics import METRICS

# stored unit -> (shown unit, factor)
_READABLE = {"us": ("ms", 1e-3), "bytes": ("MiB", 2**-20), "bytes/s": ("MiB/s", 2**-20),
             "ratio": ("%", 100.0)}


def unit_of(name: str) -> str:
    """The unit a metric is shown in ("" for a name `tasks.metrics` does not know)."""
    stored = METRICS[name].unit if name in METRICS else ""
    return _READABLE.get(stored, (stored, 1.0))[0]


def readable(name: str, value: float | None) -> float | None:
    """`value` of metric `name` in the unit `unit_of` names."""
    if value is None or name not in METRICS:
        return value
    return value * _READABLE.get(METRICS[name].unit, ("", 1.0))[1]


def number(value: float, name: str = "") -> str:
    """A number of metric `name` in its readable unit (`readable`), without the unit:
    thousands separated, three decimals below 10 (three significant digits below 0.001),
    one below 100, none above."""
    value = readable(name, float(value))
    if value.is_integer():
        return f"{int(value):,}"
    if abs(value) < 0.001:  # three decimals would read 0.000: three significant digits
        return f"{value:.3g}"
    return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}" if abs(value) >= 100 \
        else f"{value:,.1f}"


def show(value, name: str = "") -> str:
    """A value as the report prints it (`number`; text escaped; a dash for nothing)."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return escape(str(value))
    return number(value, name)


def with_unit(name: str, value: float | None) -> str:
    """A value of metric `name` as plain text with its unit ('1.235 ms', '2,000 msg/s',
    '5.000%'), as Slack shows it; 'n/a' for none."""
    if value is None:
        return "n/a"
    unit = unit_of(name)
    return f"{number(value, name)}{'' if unit in ('%', '') else ' '}{unit}"
