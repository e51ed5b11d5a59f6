"""Stored runs as files other tools read: pure (data in, documents out; `tasks.export` does
the reading and writing).

- **Bencher Metric Format** (BMF JSON, what `bencher run --adapter json` reads):
  `{benchmark: {measure slug: {"value", "lower_value"?, "upper_value"?}}}`. A benchmark is
  a stage key (the like-with-like key runs are compared by, e.g.
  `mosquitto|ibm_fanin_smoke.q1.c100.r100`); the host fingerprint is Bencher's testbed.
  Measures are the stage's metrics that have a better-direction (`tasks.metrics`), as
  kebab-case slugs, the form Bencher's slugs take (`e2e_latency_p99` -> `e2e-latency-p99`);
  a slug Bencher does not know yet becomes a new measure. Two metrics are Bencher's
  built-in measures, in its units: `delivered_rate` (msg/s) is `throughput`
  (operations/s: a delivered message is one operation) and `e2e_latency_p50` (us) is
  `latency` (ns, so x 1000). `lower_value`/`upper_value` are, as with Bencher's own
  adapters, a spread around the value itself: tonight's value times exp(-/+ sigma), sigma
  the night-to-night noise the detector measured for this metric (`noise_pct` of the
  verdict). They are there only when the noise is known: a verdict past learning.
- **Apache Otava** (formerly Hunter) CSV: one file per stage key and fingerprint (Otava's
  `csv` test analyses each metric column over rows sorted by time, so one file holds one
  comparable series), a row per run: `time` (ISO 8601, UTC), the attributes `run_id`,
  `kind`, `broker_version`, and one column per judged metric, named as in
  `tasks.metrics`. The `otava.yaml` beside them has one `csv` test per file, each metric
  with the direction perfpipe judges it by (1: higher is better, -1: lower is better).
  Otava reads every metric cell as a number, so a run that lacks one of the file's
  metrics is left out of the file, and counted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ..analysis.policy import Policy, judged_metrics
from ..catalog.stages import is_probe
from ..metrics import METRICS
from .history import noise_band

# perfpipe metric -> (Bencher's built-in measure, factor from perfpipe's unit to Bencher's)
BENCHER_BUILTINS: dict[str, tuple[str, float]] = {
    "delivered_rate": ("throughput", 1.0),  # msg/s -> operations/s
    "e2e_latency_p50": ("latency", 1000.0),  # us -> ns
}
OTAVA_TIME = "time"
OTAVA_ATTRIBUTES = ("run_id", "kind", "broker_version")
OTAVA_DIRECTION = {"higher": 1, "lower": -1}


def exported(stages: Iterable[dict]) -> list[dict]:
    """The stages other tools should track: valid ones, without a max-rate search's probes
    (their rate depends on the night; the search's own stage carries the answer)."""
    return [s for s in stages
            if s["validity"] == "valid" and not is_probe(s)]


def measure_slug(metric: str) -> str:
    """The Bencher measure a metric is reported as."""
    builtin = BENCHER_BUILTINS.get(metric)
    return builtin[0] if builtin else metric.replace("_", "-")


def bencher_bmf(stages: Iterable[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """BMF JSON of a run's stages (as `Store.stages` gives them): see the module docstring."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for stage in exported(stages):
        comparisons = {c["metric"]: c for c in stage.get("comparisons", [])}
        measures: dict[str, dict[str, float]] = {}
        for name, value in stage["metrics"].items():
            known = METRICS.get(name)  # a name since removed from tasks.metrics: not sent
            if value is None or known is None or known.better == "none":
                continue
            factor = BENCHER_BUILTINS.get(name, ("", 1.0))[1]
            metric = {"value": value * factor}
            spread = noise_band(value, comparisons.get(name))
            if spread is not None:
                metric["lower_value"], metric["upper_value"] = (v * factor for v in spread)
            measures[measure_slug(name)] = metric
        if measures:
            out[stage["stage_key"]] = measures
    return out


def otava_name(stage_key: str, fingerprint_hash: str | None) -> str:
    """The Otava test (and file stem) of one comparable series: letters, digits, `.`, `_`
    and `-` only (a stage key holds `|`)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", stage_key)
    return f"{safe}__{fingerprint_hash or 'any'}"


def otava_metrics(stage: dict) -> list[str]:
    """The columns of a stage's Otava file: the metrics perfpipe judges that it has."""
    return [m for m in judged_metrics(Policy()) if stage["metrics"].get(m) is not None]


def otava_files(history: list[dict], metrics: list[str]) -> list[tuple[str, list[str]]]:
    """(file suffix, its metrics) for one series: the metrics every run of `history` has in
    one file (suffix ""), each other one in a file of its own (``__<metric>``), so a metric
    newer than the history, or missing on some night, costs no run its place in the
    others (Otava reads every cell as a number: a file leaves out the runs without one of
    its metrics)."""
    whole = [m for m in metrics if all(e["metrics"].get(m) is not None for e in history)]
    return ([("", whole)] if whole else []) + [(f"__{m}", [m]) for m in metrics
                                               if m not in whole]


def otava_rows(history: list[dict], metrics: list[str]) -> tuple[list[list[str]], int]:
    """(CSV rows with their header first, runs left out): one row per run, oldest first;
    `history` entries are {"run_id", "started_at", "kind", "broker_version", "metrics"}. A
    run missing one of `metrics` is left out (Otava reads every cell as a number)."""
    rows: list[list[str]] = [[OTAVA_TIME, *OTAVA_ATTRIBUTES, *metrics]]
    left_out = 0
    for entry in sorted(history, key=lambda e: (e["started_at"], e["run_id"])):
        values = [entry["metrics"].get(m) for m in metrics]
        if any(v is None for v in values):
            left_out += 1
            continue
        rows.append([_iso(entry["started_at"]), *(entry.get(a) or "" for a in OTAVA_ATTRIBUTES),
                     *(repr(float(v)) for v in values)])
    return rows, left_out


def otava_test(file: str, metrics: list[str]) -> dict[str, Any]:
    """One `csv` test of otava.yaml for a file written by `otava_rows`."""
    return {"type": "csv", "file": file, "time_column": OTAVA_TIME,
            "attributes": list(OTAVA_ATTRIBUTES),
            "metrics": {m: {"column": m, "direction": OTAVA_DIRECTION[METRICS[m].better]}
                        for m in metrics}}


def _iso(when: datetime) -> str:
    return when.isoformat(timespec="seconds")
