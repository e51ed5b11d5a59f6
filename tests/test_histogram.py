import numpy as np
import pytest

from tasks.driver.histogram import (
    MAX_RELATIVE_ERROR,
    bucket_bounds,
    bucket_of,
    bucket_value,
    percentile,
    summarize,
)


def test_every_value_lands_in_a_bucket_that_contains_it():
    rng = np.random.default_rng(7)
    values = list(range(0, 3000)) + [int(v) for v in rng.integers(1, 10**10, 20_000)]
    for value in values:
        lower, upper = bucket_bounds(bucket_of(value))
        assert lower <= value < upper


def test_bucket_midpoint_is_within_the_stated_relative_error():
    for value in [1, 127, 128, 129, 1000, 65_537, 10**6 + 3, 987_654_321]:
        assert abs(bucket_value(bucket_of(value)) - value) <= max(0.5, value * MAX_RELATIVE_ERROR)


def test_buckets_are_ordered_like_values():
    indexes = [bucket_of(v) for v in range(0, 100_000, 7)]
    assert indexes == sorted(indexes)


@pytest.mark.parametrize("pct", [50, 90, 95, 99, 99.9])
def test_percentiles_match_numpy_within_bucket_precision(pct):
    rng = np.random.default_rng(1)
    samples = rng.lognormal(mean=7.0, sigma=1.0, size=50_000).astype(int) + 1
    counts: dict[int, int] = {}
    for value in samples:
        index = bucket_of(int(value))
        counts[index] = counts.get(index, 0) + 1
    exact = np.percentile(samples, pct, method="inverted_cdf")
    assert abs(percentile(counts, pct) - exact) <= exact * MAX_RELATIVE_ERROR + 0.5


def test_empty_histogram_has_no_percentile_rather_than_zero():
    assert percentile({}, 99) is None
    assert summarize({}) == {"count": 0}
