"""The pipeline's detector replayed on synthetic suites, in memory, as the compare step
runs it: `tasks.analysis.detector.compare_stage` on each stage (its noise pooled with the
other stages' histories), the night's stages judged together by
`tasks.analysis.across.judge_stages`, and the store's rules for what comes next: history
newest first, flagged values held out of the baseline until the next night clears them,
the previous verdict handed back. Beside it, the plain "percentage vs last night" detector
(`naive`), and the counts the bench reads off the verdicts: recall of a step (`run_step`)
and A/A false alarms (`run_aa`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: see learning_aa.py

from tasks.analysis.across import judge_stages  # noqa: E402
from tasks.analysis.detector import Verdict, compare_stage  # noqa: E402
from tasks.analysis.noise import noise_sigma, pooled_noise  # noqa: E402
from tasks.analysis.policy import Policy  # noqa: E402
from tasks.metrics import METRICS  # noqa: E402

from simulated_nights import AA_NIGHTS, SUITE, WARM, WATCH, Noise, Stage, suite  # noqa: E402

Detector = Callable[[list[Stage], int], list[list[dict[str, Verdict]]]]
NOISE_VERDICTS = ("suspected", "regression", "improvement")


def perfpipe(stages: list[Stage], nights: int, policy: Policy) -> list[list[dict[str, Verdict]]]:
    """Verdicts per stage and night by the pipeline's detector and the store's rules, in
    memory: the noise pooled over the other stages as the compare step pools it; a flagged
    value held out of the baseline; when a night clears a suspicion, every night of that
    suspicion (its alert's span) rejoins the baseline."""
    histories: list[list[dict]] = [[] for _ in stages]
    previous: list[dict[str, dict]] = [{} for _ in stages]
    suspicion: list[dict[str, list[dict]]] = [{} for _ in stages]
    out: list[list[dict[str, Verdict]]] = [[] for _ in stages]
    for k in range(nights):
        tonight = [stage.night(k)[0] for stage in stages]
        def judge(i: int, own: Policy) -> list[Verdict]:
            return compare_stage("s", tonight[i], "valid", histories[i], own,
                                 previous=previous[i], run_id=f"n{k}",
                                 peers=pooled_noise(histories[:i] + histories[i + 1:], policy))

        judged = judge_stages(judge, ["fp"] * len(stages), previous, policy, f"n{k}")
        for i, (values, verdicts) in enumerate(zip(tonight, judged)):
            out[i].append({v.metric: v for v in verdicts})
            follow(verdicts, {"run_id": f"n{k}", "metrics": values}, histories[i],
                   previous[i], suspicion[i])
        for history in histories:
            del history[2 * policy.window:]
    return out


def follow(verdicts: list[Verdict], entry: dict, history: list[dict], previous: dict[str, dict],
           suspicion: dict[str, list[dict]]) -> None:
    """The store's rules for one stage's night: held-out values, cleared suspicions."""
    entry["held_out"] = [v.metric for v in verdicts if v.detail.get("hold")]
    for v in verdicts:
        if v.verdict == "suspected":
            suspicion.setdefault(v.metric, []).append(entry)
        elif v.verdict == "regression":
            suspicion.pop(v.metric, None)
        elif v.verdict in ("unchanged", "improvement", "learning"):
            for night in suspicion.pop(v.metric, []):  # cleared
                night["held_out"] = [m for m in night["held_out"] if m != v.metric]
        if v.verdict not in ("no_baseline", "invalid"):
            previous[v.metric] = {"verdict": v.verdict, "detail": v.detail}
    history.insert(0, entry)


def naive(stages: list[Stage], nights: int) -> list[list[dict[str, Verdict]]]:
    """Percentage against last night: worse by the minimum practical effect is an alarm."""
    return [naive_stage(stage, nights) for stage in stages]


def naive_stage(stage: Stage, nights: int) -> list[dict[str, Verdict]]:
    out, last = [], None
    for k in range(nights):
        values, _ = stage.night(k)
        tonight = {}
        for m, v in values.items():
            verdict = "no_baseline"
            if last is not None:
                change = v / last[m] - 1
                worse = -change if METRICS[m].better == "higher" else change
                verdict = "regression" if worse >= Policy().effect(m) else "unchanged"
            tonight[m] = Verdict("s", m, verdict, v, None, None, None, {})
        last = values
        out.append(tonight)
    return out


def alarms(verdicts: list[dict[str, Verdict]], metric: str, start: int = 0) -> int:
    """Times `metric` enters regression from night `start` on (one alert each)."""
    count, was = 0, False
    for tonight in verdicts[start:]:
        v = tonight.get(metric)
        now = v is not None and v.verdict == "regression"
        count += now and not was
        was = now
    return count


def learning_flags(verdicts: list[dict[str, Verdict]], metric: str) -> int:
    """Verdicts of a change (suspected, regression, improvement) given while learning."""
    return sum(1 for tonight in verdicts if (v := tonight.get(metric)) is not None
               and "doubt_once" in v.detail and v.verdict in NOISE_VERDICTS)


@dataclass
class AA:
    """A/A figures per metric over `series` stage histories (suites of `SUITE` stages)."""

    series: int
    alarms: dict[str, int]  # times a metric entered regression
    stages_alarmed: int  # histories with an alarm on any metric
    learning_flags: dict[str, int]  # change verdicts while learning (noise, every one)
    later_flags: dict[str, int]  # suspected or improvement verdicts after learning
    mde_pct: dict[str, list[float]]  # the MDE each series reported on its last night
    too_noisy: dict[str, int]  # series whose last night said the metric is too noisy
    # metric judged across stages -> per suite, its stages' z on each night judged so
    across_z: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def count(self, verdicts: list[dict[str, Verdict]], metrics: list[str]) -> None:
        """Add one stage's history of verdicts."""
        counts = {m: alarms(verdicts, m) for m in metrics}
        for m, c in counts.items():
            self.alarms[m] += c
            self.learning_flags[m] += learning_flags(verdicts, m)
            self.later_flags[m] += sum(1 for tonight in verdicts
                                       if tonight[m].verdict in ("suspected", "improvement")
                                       and "doubt_once" not in tonight[m].detail)
            last = verdicts[-1][m].detail
            if last.get("mde_pct") is not None:
                self.mde_pct[m].append(last["mde_pct"])
            self.too_noisy[m] += "too_noisy" in last
        self.stages_alarmed += any(counts.values())


def across_z(stages: list[list[dict[str, Verdict]]], metric: str) -> np.ndarray:
    """The suite's nights judged across its stages, a row a night, as real_nights.py reads
    them from the store: each stage's change over its sd (z), then the combination's."""
    rows = [judged_z([night[metric].detail for night in tonight]) for tonight in zip(*stages)]
    return np.array([r for r in rows if r is not None]).reshape(-1, len(stages) + 1)


def judged_z(details: list[dict]) -> list[float] | None:
    """One night of a metric judged across its stages, from its verdicts' details: each
    stage's change over its sd under no change (z), then the combination's; None unless
    every stage was judged so (or there is none)."""
    if not details or not all("evidence" in d and "across" in d for d in details):
        return None
    across = details[0]["across"]
    return ([d["evidence"]["change"] / d["evidence"]["sd"] for d in details]
            + [math.log1p(across["change_pct"] / 100) / (across["sd_pct"] / 100)])


def across_z_line(metric: str, suites: list[np.ndarray]) -> str:
    """What real_nights.py prints of the real nights, for these: how the stages' z move
    together, per suite's nights (the mean of the pairwise rank correlations; the median
    and the middle 90% over the suites), and the robust sigma of each stage's z and of
    the combination's (near 1 each when the sds are right and the stages independent)."""
    mean_pairs = []
    for z in (z[:, :-1] for z in suites if len(z) >= 3):
        corr = spearmanr(z).correlation
        mean_pairs.append(float(np.mean(corr[np.triu_indices(z.shape[1], 1)])))
    if not mean_pairs:
        return f"{metric}: too few nights judged across the stages to say how they move together"
    nights = np.concatenate([z for z in suites if len(z)])
    low, mid, high = np.nanpercentile(mean_pairs, [5, 50, 95])
    return (f"{metric} across the stages, {len(nights)} nights of {len(mean_pairs)} suites: "
            f"the stages' z correlate {mid:+.2f} on average in a suite (5% to 95% of the suites "
            f"{low:+.2f} to {high:+.2f}); robust sigma of a stage's z "
            f"{noise_sigma(list(nights[:, :-1].ravel())):.2f}, combined "
            f"{noise_sigma(list(nights[:, -1])):.2f}")


@dataclass(frozen=True)
class Replay:
    """What one run of the bench holds fixed: the detector's policy (`--level`,
    `--pool-level`, ...) and how closely a suite's stages share the host's pace
    (`--shared-host`, 0: each its own)."""

    policy: Policy = field(default_factory=Policy)
    shared_host: float = 0.0

    def perfpipe(self, stages: list[Stage], nights: int) -> list[list[dict[str, Verdict]]]:
        """The pipeline's detector at this run's policy (`perfpipe`)."""
        return perfpipe(stages, nights, self.policy)

    def all_pooled(self, stages: list[Stage], nights: int) -> list[list[dict[str, Verdict]]]:
        """perfpipe with every stage's noise pooled with its peers' in full whatever their
        noises say (`pool_prior` 1, the power guard off): what the rule makes of all the
        suite's nights when their noise is known to be equal, which a real suite cannot know
        (the mixed suite is why perfpipe weighs it)."""
        return perfpipe(stages, nights, replace(self.policy, pool_prior=1.0, pool_power=0.0))

    def stages_alone(self, stages: list[Stage], nights: int) -> list[list[dict[str, Verdict]]]:
        """perfpipe without the test across stages: each stage's own test spends the whole
        false-alarm budget of a metric judged across stages."""
        return perfpipe(stages, nights, replace(self.policy, across_level=0.0))

    def run_step(self, detector: Detector, noise: Noise, metrics: list[str], metric: str,
                 step: float, series: int, rng: np.random.Generator,
                 everywhere: bool = False, scales: tuple[float, ...] | None = None) -> dict:
        """Recall of a step on the first stage of each suite (`everywhere`: on every stage;
        `scales`: the suite's stages' noise, as `suite` takes them; (1.0,): a stage alone)."""
        delays, early, mdes = [], 0, {"own": [], "across": []}
        for _ in range(series):
            stages = suite(noise, metrics, rng, metric, step, scales, everywhere,
                           self.shared_host)
            verdicts = detector(stages, WARM + WATCH)[0]
            early += alarms(verdicts[:WARM], metric) > 0
            hit = next((k - WARM + 1 for k in range(WARM, WARM + WATCH)
                        if verdicts[k][metric].verdict == "regression"), None)
            delays.append(hit)
            before = verdicts[WARM - 1][metric].detail  # the MDE reported the night before it
            for kind, mde in (("own", before.get("mde_pct")),
                              ("across", (before.get("across") or {}).get("mde_pct"))):
                if mde is not None:
                    mdes[kind].append(mde)
        found = sorted(d for d in delays if d is not None)
        return {"mde": {k: float(np.median(v)) if v else None for k, v in mdes.items()},
                "recall1": sum(d == 1 for d in found) / series,
                "recall2": sum(d <= 2 for d in found) / series,
                "recall5": len(found) / series,
                "median": found[len(found) // 2] if found else None,
                "p95": found[min(len(found) - 1, int(0.95 * len(found)))] if found else None,
                "early": early}

    def run_aa(self, detector: Detector, noise: Noise, metrics: list[str], series: int,
               rng: np.random.Generator, scales: tuple[float, ...] | None = None,
               watched: int | None = None) -> AA:
        """`series` stage histories in suites; `watched`: count only that stage of each suite."""
        per = len(scales or (1.0,) * SUITE) if watched is None else 1
        runs = math.ceil(series / per)
        zero = dict.fromkeys(metrics, 0)
        aa = AA(runs * per, dict(zero), 0, dict(zero), dict(zero), {m: [] for m in metrics},
                dict(zero))
        for _ in range(runs):
            stages = detector(suite(noise, metrics, rng, scales=scales,
                                    shared_host=self.shared_host), AA_NIGHTS)
            for verdicts in stages if watched is None else [stages[watched]]:
                aa.count(verdicts, metrics)
            if watched is None:
                for m in (m for m in metrics if METRICS[m].across_stages):
                    aa.across_z.setdefault(m, []).append(across_z(stages, m))
        return aa
