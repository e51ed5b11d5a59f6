"""The detector bar read against the bound at the spend its own A/A check allows.

    .state/venv/bin/python bench/budget_cells.py BENCH_LOG [--budget 0.005] [--learned]

BENCH_LOG is the output of `bench_detector.py` (its sensitivity table). The bar compares
perfpipe's recall within two nights with the Neyman-Pearson bound at 1 alarm per 100 A/A
series; its A/A check (the worst of 22 measured rates, each on 2000 series, at most 1 per
100) passes a detector at that spend 0 times in 100 and at 0.5 per 100 97 times
(`detector_bounds.check_passes`). For every cell the bar judges, this prints the bound at
`--budget` beside the log's, and in how many cells perfpipe reaches 80% of each: how much
of the gap is the budget the check leaves a detector. Takes about 30 s.

With ``--learned``, for every cell where perfpipe is short of 80% of the bound at
`--budget`, it also prints the best tests that must learn the noise's scale at that
budget (`detector_bounds.learned_bounds`: from the stage's own 20 nights, and from the
suite's 80 as if known to share the noise, the ceiling of a detector that pools), and in
how many of those cells perfpipe reaches 80% of each: the part of the gap the best
scale-invariant test that learns its noise from these nights could not close at this
spend, against the part that is the rule's; and in how many the suite's test reaches 80%
of the log's bound, the bar as written. Took 22 min in all on 12 cells when it also
simulated the candidate rule, whose figures it does not use; it no longer does (two cells
at 4,000 series: 28.5 s with it, 11.5 s without, the learned figures the same).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# bench/, the script's own folder
from detector_bounds import CHECKED_BUDGET, learned_bounds, recall_bound  # noqa: E402
from simulated_nights import log_step, step_name  # noqa: E402
from rule_cells import judged_cells, meets  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--budget", type=float, default=CHECKED_BUDGET,
                    help="alarms per A/A series the bound may spend (the log's: 0.01)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--learned", action="store_true",
                    help="also the tests that learn the noise, at --budget, where perfpipe "
                    "is short of 80%% of the bound at it")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    cells = judged_cells(args.log.read_text())
    met = at_budget = 0
    short = []
    for metric, noise, step, got, bound in cells:
        low = recall_bound(noise, log_step(metric, step), rng, draws=1_000_000,
                           budget=args.budget)[1]
        met += meets(got, bound)
        at_budget += meets(got, low)
        if not meets(got, low):
            short.append((metric, noise, step, got, low, bound))
        print(f"{step_name(metric, step):30} at {100 * noise:2.0f}%: perfpipe "
              f"{100 * got:5.1f}%, bound {100 * bound:5.1f}%, at {args.budget:g} per series "
              f"{100 * low:5.1f}%")
    print(f"{len(cells)} cells: perfpipe at 80% of the bound in {met}, of the bound at "
          f"{args.budget:g} alarms per series in {at_budget}")
    if args.learned and short:
        learned_rows(short, args.budget, rng)
    return 0


def learned_rows(short: list[tuple[str, float, float, float, float, float]], budget: float,
                 rng: np.random.Generator) -> None:
    """The cells short of 80% of the bound at `budget` (metric, noise, step, perfpipe's
    recall, that bound, the log's bound), against the best tests that learn the noise's
    scale at that budget from the stage's own nights and from the suite's."""
    learned = learned_bounds([(noise, log_step(metric, step))
                              for metric, noise, step, *_ in short], rng, budget=budget,
                             with_rule=False)
    print(f"the {len(short)} cells short of 80% of the bound at {budget:g}, against the best "
          f"tests that learn the noise's scale at {budget:g} alarms per series "
          "(bench/scale_bound.py; the level and noise law given):")
    own_met = suite_met = own_short = suite_bar = 0
    for (metric, noise, step, got, low, bound), (own, suite_wide, _) in zip(short, learned):
        own_met += meets(got, own)
        suite_met += meets(got, suite_wide)
        own_short += not meets(own, low)
        suite_bar += meets(suite_wide, bound)
        print(f"  {step_name(metric, step):30} at {100 * noise:2.0f}%: perfpipe "
              f"{100 * got:5.1f}%, learned own {100 * own:5.1f}%, suite "
              f"{100 * suite_wide:5.1f}%, bound {100 * low:5.1f}%")
    print(f"  in {own_short} of the {len(short)} even the test learning from the stage's own "
          f"nights is short of 80% of the bound at {budget:g}; perfpipe reaches 80% of that "
          f"test in {own_met} of the {len(short)}, of the suite's (every peer trusted) in "
          f"{suite_met}; the suite's test reaches 80% of the log's bound (the bar as "
          f"written) in {suite_bar}")


if __name__ == "__main__":
    sys.exit(main())
