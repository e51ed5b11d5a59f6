"""A metric judged against a covariate that shares its night-to-night noise.

On a host the broker shares with its driver, both slow down when the host does (its other
tenants, its frequency): from night to night the log of the broker's CPU per message
follows the log of the driver's with a slope mostly below 1 (0.63 to 0.96 per stage in
three batches of the smoke suite, bench/README.md). Judging the broker's cost at the
driver's CPU of tonight takes most of the host's pace out of it, and what is left is mostly the
broker's own: the driver does the same work a message whatever the broker does. The
median end-to-end latency moves with it too, less steeply (0.27 to 0.34 per smoke stage):
it holds the driver's own send and read of every message.

A metric declares its covariate (`tasks.metrics.MetricDef.adjusted_by`). Its nights are
then fitted on the covariate's, log on log, with the Theil-Sen slope (the median of the
slopes between pairs of nights: one wild night of t3 noise does not tilt it), held to
`SLOPE_RANGE`. Each night is moved along the slope to the nights' median covariate
(`Fit.adjust`), and the detector judges those values as any metric's: their median, their
noise. Tonight is compared with the baseline moved to tonight's covariate (`Fit.rise`),
and the slope's own error adds to tonight's change's sd (`Fit.slope_error`).
Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy.stats import theilslopes

# A slope below 0 would say the broker's cost falls as the shared host slows, which is no
# shared pace; above 2, that it moves more than twice as much as its driver's, which no
# batch measured has shown: fits outside are noise and are held to this range.
SLOPE_RANGE = (0.0, 2.0)


@dataclass(frozen=True)
class Fit:
    """A metric's nights (logs) fitted on its covariate's (logs): log y = a + slope log x."""

    slope: float
    median_x: float  # the median log covariate of the nights fitted: where they are moved to
    mean_x: float  # their mean
    sxx: float  # the sum of their squared deviations from the mean

    def adjust(self, log_value: float, log_covariate: float) -> float:
        """A night's log value moved along the slope to the nights' median covariate."""
        return log_value - self.slope * (log_covariate - self.median_x)

    def rise(self, log_covariate: float) -> float:
        """How much higher, in log, the metric is expected at this covariate than at the
        nights' median."""
        return self.slope * (log_covariate - self.median_x)

    def slope_error(self, distance: float) -> float:
        """The variance the slope's own error adds to a value moved `distance` along the
        log covariate, in units of the nights' squared noise sigma: distance^2 / sxx, the
        least-squares slope's, which the Theil-Sen slope's is close to (a little more on
        normal noise, less on heavy tails)."""
        return distance ** 2 / self.sxx if self.sxx > 0 else 0.0


def log_of(value: float | None) -> float | None:
    """The log of a usable value (a positive number), else None: a night's metric or
    covariate as it is fitted."""
    return math.log(value) if value is not None and value > 0 else None


def fit(pairs: list[tuple[float, float]]) -> Fit:
    """The Theil-Sen fit of (log value, log covariate) pairs, at least two."""
    ys = [y for y, _ in pairs]
    xs = [x for _, x in pairs]
    mean = statistics.fmean(xs)
    sxx = sum((x - mean) ** 2 for x in xs)
    slope = 0.0
    if sxx > 0:
        slope = float(theilslopes(ys, xs).slope)
        slope = min(max(slope, SLOPE_RANGE[0]), SLOPE_RANGE[1]) if math.isfinite(slope) else 0.0
    return Fit(slope, statistics.median(xs), mean, sxx)
