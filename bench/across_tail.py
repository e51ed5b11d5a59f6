"""Is the test across stages calibrated where it decides? Its z is the inverse-variance
weighted mean of the stages' changes over that mean's sd, and its threshold takes that z to
follow the nights' law (Student t3 at robust sigma 1) like one stage's. On the real nights
the combined z's robust sigma came out above one stage's (bench/README.md, real_nights.py).
This draws stages' changes from that law, known sd, and prints both: the robust sigma, and
the single- and two-night tail at the thresholds the detector uses.

    .state/venv/bin/python bench/across_tail.py            # 4 stages, 4M nights, ~5 s
    .state/venv/bin/python bench/across_tail.py --stages 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent.parent))

from tasks.analysis.noise import noise_sigma  # noqa: E402
from tasks.analysis.policy import Policy  # noqa: E402
from tasks.analysis.thresholds import bad_threshold, t_robust_sigma  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=int, default=4, help="stages combined (default 4)")
    ap.add_argument("--nights", type=int, default=4_000_000, help="nights drawn (default 4M)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.stages < 2:
        ap.error(f"--stages {args.stages}: give 2 or more (one stage is its own test)")
    rng = np.random.default_rng(args.seed)
    changes = rng.standard_t(3, size=(args.nights, args.stages)) / t_robust_sigma(3.0)
    one = changes[:, 0]  # robust sigma 1: one stage's z
    combined = changes.mean(axis=1) * np.sqrt(args.stages)  # the mean over its sd
    sample = slice(0, 200_000)  # the robust sigma of 200,000 nights is exact to 0.3%
    print(f"{args.stages} stages, {args.nights:,} nights of t3 changes at robust sigma 1, sd "
          f"known: robust sigma of z, one stage {noise_sigma(list(one[sample])):.3f}, "
          f"combined {noise_sigma(list(combined[sample])):.3f}")
    print(f"{'u':>4} {'P(one > u)':>11} {'P(comb > u)':>12} {'two nights: one':>16} "
          f"{'combined':>9}")
    for u in (2.0, 3.0, 4.0, 5.0, 6.0, 8.0):
        p1, pc = float(np.mean(one > u)), float(np.mean(combined > u))
        print(f"{u:4.0f} {p1:11.2e} {pc:12.2e} {p1 * p1:16.2e} {pc * pc:9.2e}")
    level = Policy().across_level
    print(f"the test's bad-night threshold at across_level {level:g}: u "
          + ", ".join(f"{bad_threshold(level, dof, 3.0):.2f} with a sigma worth {dof:g} d.o.f."
                      for dof in (1e6, 30.0, 10.0)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
