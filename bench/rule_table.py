"""Set the detector's evidence thresholds and measure its power table.

`tasks/analysis/evidence.py` judges with an invariant likelihood ratio whose law under no
change is the same at every noise, so its thresholds and its power are properties of the
rule, not of a machine: this script simulates them once, on Student t (3 d.o.f.) nights,
and prints the constants that module holds. Run it again after changing the statistic
(its steps, its grid, the noise law) and paste what it prints.

- `PAIR`: a judged pair (last night and tonight, against the nights before last night)
  at or above it is a regression. Set so that A/A histories of 30 nights, judged from 8
  baseline nights on, enter an alarm on 0.6 in 100 (a run of alarms counts once): the
  bar of `bench/bench_detector.py` is 1 in 100 measured on 2000 histories, whose own
  sampling error is about 0.2, and the pipeline's histories are not the simulation's
  (flagged nights held out, noise laws other than t3: `tests/test_compare.py`'s A/A).
- `SINGLE`: tonight alone (against every night before it) at or above it is suspected:
  1 judged A/A night in 100.
- `MDE_STEPS`: by the baseline nights n (8 to 30), the step in noise scales that the
  pair catches within two nights 9 times in 10: the pair ending on the first stepped
  night (its history n - 1 nights) or on the second (n).

Usage: .state/venv/bin/python bench/rule_table.py [--series 50000] [--mde-series 4000]
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scale_bound import _threshold  # noqa: E402

from tasks.analysis.detector import MDE_POWER  # noqa: E402
from tasks.analysis.evidence import MDE_NIGHTS, TAIL, evidence  # noqa: E402

NIGHTS, FIRST = 30, 8  # A/A histories: nights, and baseline nights before the first judged
CHUNK = 2000
SUSPECT_RATE, BUDGET = 0.01, 0.006  # suspected nights; alarm entries per A/A history


def aa_statistics(series: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(pairs, singles) on A/A histories: pairs (series, judged pairs) in night order,
    singles flattened over every judged night."""
    pairs, singles = [], []
    for start in range(0, series, CHUNK):
        z = rng.standard_t(TAIL, (min(CHUNK, series - start), NIGHTS))
        pairs.append(np.stack([evidence(z[:, :t - 1], z[:, t - 1:t + 1])
                               for t in range(FIRST + 1, NIGHTS)], axis=1))
        singles.append(np.stack([evidence(z[:, :t], z[:, t:t + 1])
                                 for t in range(FIRST, NIGHTS)], axis=1).ravel())
    return np.concatenate(pairs), np.concatenate(singles)


def caught(nights: int, step: float, z: np.ndarray, pair: float) -> float:
    """How often the pair catches `step` within two nights after `nights` quiet ones."""
    shifted = z.copy()
    shifted[:, nights:] += step
    first = evidence(shifted[:, :nights - 1], shifted[:, nights - 1:nights + 1]) >= pair
    second = evidence(shifted[:, :nights], shifted[:, nights:nights + 2]) >= pair
    return float((first | second).mean())


def mde_step(nights: int, pair: float, series: int, rng: np.random.Generator) -> float:
    """The step caught 9 times in 10 (bisection on the same draws)."""
    z = rng.standard_t(TAIL, (series, nights + 2))
    low, high = 0.5, 60.0
    for _ in range(14):
        mid = (low * high) ** 0.5
        low, high = (low, mid) if caught(nights, mid, z, pair) >= MDE_POWER else (mid, high)
    return high


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=50_000, help="A/A histories")
    ap.add_argument("--mde-series", type=int, default=4000, help="histories per MDE cell")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    began = time.monotonic()
    print(f"# bench/rule_table.py --series {args.series} --mde-series {args.mde_series} "
          f"--seed {args.seed}; load average {os.getloadavg()[0]:.2f}")
    pairs, singles = aa_statistics(args.series, rng)
    pair = _threshold(pairs, BUDGET)
    single = float(np.quantile(singles, 1 - SUSPECT_RATE))
    print(f"PAIR = {pair:.3f}\nSINGLE = {single:.3f}")
    steps = [mde_step(n, pair, args.mde_series, rng) for n in MDE_NIGHTS]
    listed = ", ".join(f"{s:.2f}" for s in steps)
    print("MDE_STEPS = (" + textwrap.fill(listed, 86, subsequent_indent="             ") + ")")
    print(f"# {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
