"""The detector while a stage learns its noise: change verdicts on A/A histories, and how
often a large step is confirmed on its second night.

    .state/venv/bin/python bench/learning_aa.py like --series 25000 --seed 21   # ~70 s
    .state/venv/bin/python bench/learning_aa.py like-step --series 1000 --seed 5

KIND: `like` (suites of 4 stages, one noise), `mixed` (one stage of 4 twice as noisy),
`single` (a stage with no peers), each 9 nights from empty at --noise (robust sigma of the
log, t3), counting suspected, regression and improvement verdicts while learning over all
stages; `like-step` and `single-step`: 5 quiet nights at --step-noise, then --step on the
first stage, and how often its two nights read learning then regression. The metric is
broker_cpu_s_per_10k, drawn as bench_detector.py draws a metric (`simulated_nights.Stage`)
and judged as it judges one (`replayed_detector.perfpipe`: the compare step's detector,
the night's stages together, the store's rules).

To compare with the rule of another commit, run it with that checkout first on the path:
    PYTHONPATH=/tmp/old .state/venv/bin/python bench/learning_aa.py like ...
(`git worktree add /tmp/old COMMIT`; this script's own copy is the one to run, and the
commit's `tasks` must have what `replayed_detector.py` and `simulated_nights.py` call).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent.parent))

from tasks.analysis.policy import Policy  # noqa: E402

# bench/, the script's own folder
from replayed_detector import learning_flags, perfpipe  # noqa: E402
from simulated_nights import MIXED_NOISE, Noise, Stage  # noqa: E402

METRIC = "broker_cpu_s_per_10k"
STEP_NIGHT = 5  # the step kinds' first stepped night (from 0)
SCALES = {"like": (1, 1, 1, 1), "mixed": (1, 1, 1, MIXED_NOISE), "single": (1,),
          "like-step": (1, 1, 1, 1), "single-step": (1,)}


def one_suite(scales: tuple[float, ...], sigma: float, step: float, nights: int,
              rng: np.random.Generator) -> tuple[int, list[str]]:
    """(change verdicts while learning over all stages, the first stage's verdicts);
    `step`: the log step on the first stage from `STEP_NIGHT` on."""
    stages = [Stage(Noise({METRIC: scale * sigma}, 0.0, 0.0), [METRIC], rng,
                    METRIC if i == 0 else None, math.expm1(step), STEP_NIGHT)
              for i, scale in enumerate(scales)]
    verdicts = perfpipe(stages, nights, Policy())
    return (sum(learning_flags(stage, METRIC) for stage in verdicts),
            [tonight[METRIC].verdict for tonight in verdicts[0]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=sorted(SCALES))
    parser.add_argument("--series", type=int, default=25_000, help="suites (or stages alone)")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--noise", type=float, default=0.12, help="A/A kinds: robust sigma")
    parser.add_argument("--step-noise", type=float, default=0.09, help="step kinds: the same")
    parser.add_argument("--step", type=float, default=math.log(6.2),
                        help="step kinds: the log step (default +520%%)")
    args = parser.parse_args(argv)
    rng, scales = np.random.default_rng(args.seed), SCALES[args.kind]
    stepped = args.kind.endswith("-step")
    flags = caught = 0
    for _ in range(args.series):
        got, first = one_suite(scales, args.step_noise if stepped else args.noise,
                               args.step if stepped else 0.0, 7 if stepped else 9, rng)
        flags += got
        caught += first[STEP_NIGHT:] == ["learning", "regression"]
    if stepped:
        print(f"{args.kind}: step {100 * math.expm1(args.step):+.0f}% at {args.step_noise:.0%} "
              f"noise, confirmed on its second night in {100 * caught / args.series:.1f}% "
              f"of {args.series} series (seed {args.seed})")
    else:
        print(f"{args.kind}: {flags} change verdicts while learning in "
              f"{args.series * len(scales)} stage histories at {args.noise:.0%} noise "
              f"(seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
