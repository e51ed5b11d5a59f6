"""Log-linear latency histogram: the one bucketing shared by the driver and the Spark job.

Values are integer microseconds. Values below 128 us get a bucket each (exact); above
that every power of two is split into 64 linear sub-buckets, so a bucket is at most 1/64
of its lower bound wide and the midpoint used to report a percentile is within 1/128
(0.78%) of every value in it. Bucket indexes are small integers that sum across
processes, hosts and seconds, so a percentile over any window is read from summed counts,
never averaged from per-process percentiles.

Only the standard library is used: this module is shipped to driver hosts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from fractions import Fraction

SUB_BUCKET_BITS = 6
SUB_BUCKETS = 1 << SUB_BUCKET_BITS  # 64
MAX_RELATIVE_ERROR = 1.0 / (2 * SUB_BUCKETS)  # of the midpoint, for values >= 2*SUB_BUCKETS


def bucket_of(value_us: int) -> int:
    """Bucket index of a value in microseconds (negative values count as 0)."""
    if value_us < 2 * SUB_BUCKETS:
        return value_us if value_us > 0 else 0
    shift = value_us.bit_length() - (SUB_BUCKET_BITS + 1)
    return (shift << SUB_BUCKET_BITS) + (value_us >> shift)


def bucket_bounds(index: int) -> tuple[int, int]:
    """Lowest value and one past the highest value of a bucket, in microseconds."""
    shift = max(0, (index >> SUB_BUCKET_BITS) - 1)
    lower = (index - (shift << SUB_BUCKET_BITS)) << shift
    return lower, lower + (1 << shift)


def bucket_value(index: int) -> float:
    """The value reported for a bucket: its midpoint (exact below 128 us)."""
    lower, upper = bucket_bounds(index)
    return lower + (upper - 1 - lower) / 2.0


def percentile(counts: Mapping[int, int], pct: float) -> float | None:
    """The pct-th percentile (0..100) of a histogram {bucket: count}, nearest-rank.

    None for an empty histogram: "no samples" must never read as a latency of zero.
    """
    total = sum(counts.values())
    if total <= 0:
        return None
    # ceil(pct/100 * total) in exact arithmetic (floats misplace p99.9 at some totals)
    rank = max(1, math.ceil(Fraction(str(pct)) * total / 100))
    seen = 0
    for index in sorted(counts):
        seen += counts[index]
        if seen >= rank:
            return bucket_value(index)
    return bucket_value(max(counts))


def summarize(counts: Mapping[int, int], pcts: Iterable[float] = (50, 95, 99, 99.9)) -> dict:
    """Count, mean, stddev, min, max and percentiles of a histogram, from bucket midpoints."""
    total = sum(counts.values())
    if total <= 0:
        return {"count": 0}
    mean = sum(bucket_value(i) * c for i, c in counts.items()) / total
    var = sum(c * (bucket_value(i) - mean) ** 2 for i, c in counts.items()) / total
    out = {
        "count": total,
        "avg": mean,
        "stddev": var**0.5,
        "min": bucket_value(min(counts)),
        "max": bucket_value(max(counts)),
    }
    for pct in pcts:
        out[f"p{pct:g}".replace(".", "_")] = percentile(counts, pct)
    return out
