"""The detector bar read against the bound at the spend its own A/A check allows.

    .state/venv/bin/python bench/budget_cells.py BENCH_LOG [--budget 0.005]

BENCH_LOG is the output of `bench_detector.py` (its sensitivity table). The bar compares
perfpipe's recall within two nights with the Neyman-Pearson bound at 1 alarm per 100 A/A
series; its A/A check (the worst of 22 measured rates, each on 2000 series, at most 1 per
100) passes a detector at that spend 0 times in 100 and at 0.5 per 100 97 times
(`bench_detector.check_passes`). For every cell the bar judges, this prints the bound at
`--budget` beside the log's, and in how many cells perfpipe reaches 80% of each: how much
of the gap is the budget the check leaves a detector. Takes about 30 s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_detector as bench  # noqa: E402  (bench/, the script's own folder)
from rule_cells import judged_cells, meets  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--budget", type=float, default=bench.CHECKED_BUDGET,
                    help="alarms per A/A series the bound may spend (the log's: 0.01)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    cells = judged_cells(args.log.read_text())
    met = at_budget = 0
    for metric, noise, step, got, bound in cells:
        low = bench.recall_bound(noise, bench.log_step(metric, step), rng, draws=1_000_000,
                                 budget=args.budget)[1]
        met += meets(got, bound)
        at_budget += meets(got, low)
        print(f"{bench.step_name(metric, step):30} at {100 * noise:2.0f}%: perfpipe "
              f"{100 * got:5.1f}%, bound {100 * bound:5.1f}%, at {args.budget:g} per series "
              f"{100 * low:5.1f}%")
    print(f"{len(cells)} cells: perfpipe at 80% of the bound in {met}, of the bound at "
          f"{args.budget:g} alarms per series in {at_budget}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
