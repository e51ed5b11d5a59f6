"""Synthetic nights whose noise is this machine's own (bench/noise_measured.json): the
stages and suites `bench_detector.py` runs the detector on.

Noise per metric: night-to-night log noise from a Student t with 3 degrees of freedom
(the measured latency and CPU figures have sd / robust-sigma ratios of 1.2 to 2.4, a normal
has 1), scaled so its robust sigma (1.4826 x MAD) is the measured one (the sd, where the
measured MAD is 0); delivered and published msg/s are the mean of 10 per-second samples,
an AR(1) process with the measured per-second CV and lag-1 autocorrelation around the
night's level. A metric judged on a covariate (`MetricDef.adjusted_by`) is drawn as the
measured slope times the covariate's log (one t3 draw a night for all its metrics: the
host's pace, each stage's own or shared with its suite, `Host`) plus its own t3 noise
along the slope.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: see learning_aa.py

from tasks.analysis.noise import noise_sigma  # noqa: E402
from tasks.analysis.thresholds import t_robust_sigma  # noqa: E402
from tasks.metrics import METRICS  # noqa: E402

RATES = {"delivered_rate": "delivered_per_s", "published_rate": "published_per_s"}
SECONDS = 10
WARM, WATCH, AA_NIGHTS = 20, 5, 30
SUITE = 4  # stages per simulated run, sharing a fingerprint (the smoke suite has 4)
MIXED_NOISE = 2.0  # the mixed suite's noisy stage, in its peers' noise
TAIL = "e2e_latency_p99_no_stall"  # the judged tail (tasks.analysis.tails)
T_DOF = 3
T_ROBUST = t_robust_sigma(T_DOF)  # the robust sigma (1.4826 x MAD) of the standard t


@dataclass(frozen=True)
class Covaried:
    """A metric judged on its covariate (`MetricDef.adjusted_by`), as measured: its log is
    the slope times the covariate's log plus its own noise (noise_measured.json
    ``covariates``, the medians over the stages)."""

    by: str
    slope: float
    covariate_sigma: float  # robust sigma of the covariate's logs, night to night
    own_sigma: float  # robust sigma of the metric's logs along the slope


@dataclass(frozen=True)
class Noise:
    night: dict[str, float]  # robust sigma of the log values, night to night
    per_second_cv: float
    per_second_ar: float
    covaried: dict[str, Covaried] = field(default_factory=dict)

    def judged(self, metric: str) -> float:
        """The noise the detector judges `metric` with: along its covariate, if it has one."""
        return self.covaried[metric].own_sigma if metric in self.covaried else self.night.get(
            metric, 0.0)


def load_noise(path: Path) -> tuple[Noise, dict]:
    doc = json.loads(path.read_text())
    metrics = doc["metrics"]
    night = {}
    for m, d in metrics.items():
        robust, sd = d.get("night_log_mad_sigma_median"), d.get("night_log_sd_median")
        if robust is not None or sd is not None:  # measured, if only as 0 (a rate at its target)
            night[m] = robust or (sd or 0.0) * T_ROBUST / math.sqrt(T_DOF)
    rate = metrics["delivered_rate"]
    covaried = {m: Covaried(c["by"], c["median"]["slope"], c["median"]["covariate_sigma"],
                            c["median"]["adjusted_sigma"])
                for m, c in doc.get("covariates", {}).items()
                if c.get("median") and m in METRICS and METRICS[m].adjusted_by == c["by"]}
    return Noise(night, rate["per_second_cv_median"] or 0.0,
                 rate["per_second_lag1_autocorr_median"] or 0.0, covaried), doc


class Host:
    """The host's pace on each night, shared by a suite's stages (`--shared-host`): a
    stage's pace is sqrt(1 - rho) x its own t3 draw + sqrt(rho) x the night's, so two
    stages' paces correlate at rho, rescaled so its robust sigma is one t3 draw's (mixed,
    two draws of one variance have lighter tails than one, so a larger robust sigma)."""

    def __init__(self, rho: float, rng: np.random.Generator) -> None:
        if not 0 < rho < 1:
            raise ValueError(f"a shared host's correlation is above 0 and below 1, not {rho}")
        self.rho, self.rng = rho, rng
        self.nights: dict[tuple[int, str], float] = {}
        self.unit = _mixed_unit(rho)

    def pace(self, k: int, by: str, own: float) -> float:
        """A stage's pace on night `k` along covariate `by`, from its own draw `own`."""
        if (k, by) not in self.nights:
            self.nights[k, by] = self.rng.standard_t(T_DOF)
        shared = self.nights[k, by]
        return (math.sqrt(1 - self.rho) * own + math.sqrt(self.rho) * shared) * self.unit


@lru_cache(maxsize=16)
def _mixed_unit(rho: float, draws: int = 400_000) -> float:
    """T_ROBUST over the robust sigma of sqrt(1 - rho) T + sqrt(rho) T' (T, T' t3), from a
    generator of its own, so the bench's draws do not depend on it."""
    t = np.random.default_rng(0).standard_t(T_DOF, (2, draws))
    mixed = math.sqrt(1 - rho) * t[0] + math.sqrt(rho) * t[1]
    return T_ROBUST / noise_sigma(list(mixed))


class Stage:
    """One simulated stage history: tonight's metrics, with a step on one metric; the
    host's pace its own or shared with its suite (`host`)."""

    def __init__(self, noise: Noise, metrics: list[str], rng: np.random.Generator,
                 step_metric: str | None = None, step: float = 0.0, step_night: int = 0,
                 host: Host | None = None) -> None:
        self.noise, self.metrics, self.rng, self.host = noise, metrics, rng, host
        self.step_metric, self.step, self.step_night = step_metric, step, step_night

    def night(self, k: int) -> tuple[dict[str, float], dict[str, list[float]]]:
        values, series = {}, {}
        hosts: dict[str, float] = {}  # covariate -> tonight's host (log): one for its metrics
        for m in self.metrics:
            scale = self.noise.night.get(m, 0.0) / T_ROBUST
            level = 1000.0 * math.exp(scale * self.rng.standard_t(T_DOF))
            if m in self.noise.covaried:  # the host's pace, shared with its covariate
                c = self.noise.covaried[m]
                if c.by not in hosts:
                    pace = self.rng.standard_t(T_DOF)
                    if self.host is not None:
                        pace = self.host.pace(k, c.by, pace)
                    hosts[c.by] = c.covariate_sigma / T_ROBUST * pace
                    values[c.by] = 1000.0 * math.exp(hosts[c.by])
                host = hosts[c.by]
                level = 1000.0 * math.exp(c.slope * host
                                          + c.own_sigma / T_ROBUST * self.rng.standard_t(T_DOF))
            if m == self.step_metric and k >= self.step_night:
                worse_up = METRICS[m].better == "lower"
                level *= (1 + self.step) if worse_up else (1 - self.step)
            if m in RATES:
                seconds = self._seconds(level)
                series[RATES[m]] = seconds
                level = float(np.mean(seconds))
            values[m] = level
        return values, series

    def _seconds(self, level: float) -> list[float]:
        phi, cv = self.noise.per_second_ar, self.noise.per_second_cv
        e = self.rng.normal(0.0, cv * math.sqrt(1 - phi * phi), SECONDS)
        x = np.empty(SECONDS)
        x[0] = self.rng.normal(0.0, cv)
        for i in range(1, SECONDS):
            x[i] = phi * x[i - 1] + e[i]
        return list(level * (1 + x))


def suite(noise: Noise, metrics: list[str], rng: np.random.Generator,
          step_metric: str | None = None, step: float = 0.0,
          scales: tuple[float, ...] | None = None, everywhere: bool = False,
          shared_host: float = 0.0) -> list[Stage]:
    """`SUITE` stages on one fingerprint with the same noise (times `scales`, when given);
    the first one takes the step, or every one (`everywhere`: a change of the broker); the
    host's pace shared between them at `shared_host` (0: each stage its own)."""
    stages = []
    host = Host(shared_host, rng) if shared_host else None
    for i, factor in enumerate(scales or (1.0,) * SUITE):
        scaled = Noise({m: factor * v for m, v in noise.night.items()}, noise.per_second_cv,
                       noise.per_second_ar,
                       {m: replace(c, own_sigma=factor * c.own_sigma)
                        for m, c in noise.covaried.items()})
        stages.append(Stage(scaled, metrics, rng, step_metric if i == 0 or everywhere else None,
                            step, WARM, host))
    return stages


def log_step(metric: str, size: float) -> float:
    """The size of a step in the worse direction as a log change (how `Stage` applies it)."""
    return math.log1p(size) if METRICS[metric].better == "lower" else -math.log1p(-size)


def step_name(metric: str, size: float) -> str:
    """"delivered_rate -5%": the metric and its step, signed in the worse direction."""
    return f"{metric} {'-' if METRICS[metric].better == 'higher' else '+'}{100 * size:.0f}%"
