"""How small a capacity step does the nightly catch within two nights, here? Measured, in one
run, with the pipeline itself (real Mosquitto, drivers, Spark, SQLite).

    .state/venv/bin/python bench/bench_capacity.py [--nights 8] [--real-nights 6]
                                                   [--pin off|on|alternate] [--qos 0|1]
                                                   [--series 2000] [--out FILE]

1. The method's own precision: `--nights` nights of a capacity search (capacity_fanin's
   search: precision 2%, up to 3 holds of 10 s, warm starts) against a Mosquitto whose
   deliveries pass a token bucket (infra/slowdown), so its capacity is known
   exactly; then two nights with the bucket 5% smaller, and whether perfpipe's verdicts
   caught it (suspected, then regression).
2. This machine's own noise: `--real-nights` nights of the shipped `capacity_fanin` search
   at `--qos` (0 unless told) against a plain Mosquitto perfpipe starts (no throttle: the 2
   vCPUs are the limit), and the broker's cost per message at its hold; and how much of each
   is explained, night to night (4 valid nights or more), by what was measured over the
   hold: the host's pace (`tasks/driver/pace.py`), the driver's CPU a message, the host's
   CPU use and the broker's context switches; and the nights grouped by what the verdict on
   max_rate says of them: the broker or its host used its CPU up, or they had CPU to spare
   (`tasks/analysis/capacity.py`; here, the broker slept while it fell behind). `--pin`
   keeps the broker on the first CPU and perfpipe's processes on the others (the inventory's
   `broker.cpus`), for every night or every other night.
3. For every measured noise, the smallest step caught within two nights: the
   Neyman-Pearson bound (no detector can beat it at that noise and a false-alarm budget of
   1 per 100 series; bench/detector_bounds.py's `recall_bound`) and perfpipe's own
   detector on simulated histories of that noise (`--series` each), both at 90%.

The figures go to stdout and, with --out, to a JSON file (bench/noise_measured.json keeps
them under "capacity"). Nothing is timed: wall time only decides how long it runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from detector_bounds import recall_bound  # noqa: E402
from paired_change import (  # noqa: E402
    EMBEDDED,
    PIN,
    local_inventory,
    pin_problem,
    pinned_nights,
)
from replayed_detector import Replay  # noqa: E402
from simulated_nights import Noise  # noqa: E402

from infra.slowdown.slowdown import ThrottledProxy, unmanaged_inventory  # noqa: E402
from tasks.analysis.capacity import BROKER_USED_UP_PCT, HOST_USED_UP_PCT  # noqa: E402
from tasks.analysis.noise import noise_sigma  # noqa: E402
from tasks.metrics import DRIVER_CPU, HOST_PACE  # noqa: E402
from tasks.driver.wire import Template  # noqa: E402

TOPIC, PAYLOAD = "perfpipe/bench/capacity", 256
CAPACITY = 2_000  # msg/s the bucket lets through to the one subscriber
STEPS = (0.02, 0.03, 0.05, 0.07, 0.10, 0.15, 0.20, 0.30, 0.50)
TARGET = 0.90  # recall within two nights that counts as "caught"
HOST_CPU, BROKER_SWITCHES = "host_cpu_avg", "broker_ctx_switches_per_s"
# read over the hold that confirmed a night's answer, and fitted against its figures
AT_HOLD = (HOST_PACE, DRIVER_CPU, HOST_CPU, BROKER_SWITCHES)

THROTTLED = f"""
name: bench_throttled
source: "bench_capacity: fan-in capacity through a throttled delivery path"
qos: [0]
publishers:
  - {{group: pub, count: 10, topic: "{TOPIC}", aggregate_rate: 500, payload_bytes: {PAYLOAD}}}
subscribers:
  - {{group: sub, count: 1, topics: ["{TOPIC}"]}}
stages:
  warmup_s: 1
  measure_s: 3
  cooldown_s: 1
  search: {{growth: 2.0, precision: 0.02, max_probes: 14, hold_s: 10, holds: 3}}
"""


def robust_sigma(values: list[float]) -> float:
    """1.4826 x MAD of the logs: the robust sigma, the unit the detector's noise is in."""
    return noise_sigma([math.log(v) for v in values if v])


def night(suite: str, inventory: Path) -> dict:
    from sql import Store
    from tasks import rundir
    from tasks.catalog.ratesearch import ProbeResult
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings
    from tasks.steps.load_metrics import confirming_hold

    outcome = run_pipeline(load_settings(), suite=suite, inventory=inventory, kind="nightly",
                           say=lambda _: None)
    stages = Store(load_settings().database_url()).stages(outcome.run_id)
    searches = [s for s in stages if s["stage_id"].endswith(".search")]
    if not searches:  # the run failed before it stored its search: say why, go on
        trace = load_settings().run_dir(outcome.run_id) / rundir.ERROR_LOG
        lines = trace.read_text().strip().splitlines() if trace.exists() else ["no error.log"]
        return {"run": outcome.run_id, "status": outcome.status, "validity": outcome.status,
                "reason": lines[-1], "max_rate": None, "verdicts": {}}
    (search,) = searches
    verdicts = {c["metric"]: c["verdict"] for c in search["comparisons"]}
    spare = next((c["detail"].get("cpu_to_spare") for c in search["comparisons"]
                  if c["metric"] == "max_rate"), None)  # what the verdict says of its limit
    ran = search["params"]["search_outcome"]
    runs = {kind: (len(ran[kind]), sum(r["retried"] for r in ran[kind]))
            for kind in ("probes", "holds")}
    held = confirming_hold(search["stage_id"], ran)  # what AT_HOLD reads is read over it
    at_hold = next((s["metrics"] for s in stages if s["stage_id"] == held), {})
    # each hold's rate and what the broker delivered of it (the search's own rule), in order
    holds = [{"rate": h["rate"], "kept_up": h["kept_up"], "retried": h["retried"],
              "unstable": bool(h.get("unstable")), "broken": h.get("broken"),
              "delivered_rate": ProbeResult(h["rate"], h["sent_ratio"],
                                            h["received_ratio"]).delivered_rate}
             for h in ran["holds"]]
    return {"run": outcome.run_id, "status": outcome.status, "validity": search["validity"],
            "reason": search["reason"], **search["metrics"], "verdicts": verdicts, "runs": runs,
            "holds": holds, "cpu_to_spare": spare,
            "hold": {name: at_hold.get(name) for name in AT_HOLD}}


def throttled_nights(work: Path, nights: int) -> tuple[list[dict], list[dict]]:
    """`nights` A nights against a Mosquitto started here behind a bucket of CAPACITY msg/s
    (an unmanaged broker with a host), then two B nights with the bucket 5% smaller."""
    from broker_side import Broker

    packet = len(Template(TOPIC, 0, PAYLOAD, 0, 0).packet)
    broker = Broker(work)
    proxy = ThrottledProxy(broker.port, CAPACITY * packet)
    inventory = unmanaged_inventory(work / "throttled.yml", proxy.port, work)
    try:
        a = [say_night("throttled A", i, night("throttled", inventory)) for i in range(nights)]
        proxy.rate = CAPACITY * 0.95 * packet
        b = [say_night("throttled B -5%", i, night("throttled", inventory)) for i in range(2)]
    finally:
        proxy.close()
        broker.stop()
    return a, b


def real_nights(nights: int, pin: str, work: Path) -> list[dict]:
    """The shipped capacity_fanin search (at the suite's QoS: `scenarios_dir`) against the
    Mosquitto perfpipe starts here, kept on the first CPU with perfpipe's processes on the
    others (`broker.cpus`) on every night (`pin` on), every other night (alternate) or none.
    A pinned night is of another fingerprint, so each kind is judged on its own history."""
    pinned_inventory = local_inventory(work / "pinned.yml", pinned=True)
    results = []
    for i, pinned in enumerate(pinned_nights(nights, pin)):
        results.append(say_night("real" + (" pinned" if pinned else ""), i,
                                 {**night("real", pinned_inventory if pinned else EMBEDDED),
                                  "pinned": pinned}))
    return results


def say_night(label: str, number: int, result: dict) -> dict:
    ran = [f"{n} {kind}" + (f" ({again} run again: it fell behind below the last capacity)"
                            if again else "")
           for kind, (n, again) in result.get("runs", {}).items()]
    reason = f": {result['reason']}" if result["reason"] else ""
    hold = result.get("hold") or {}
    read = (f"over the hold host pace {hold[HOST_PACE]:.1f} us, driver "
            f"{hold[DRIVER_CPU]:.3f} CPU-s/10K, host CPU {hold[HOST_CPU]:.0f}%, broker "
            f"{hold[BROKER_SWITCHES]:,.0f} context switches/s, "
            if None not in (hold.get(name) for name in AT_HOLD) else "")
    used = (f"the broker at {result['broker_cpu_used_pct']:.0f}% of its core(s) and the host "
            f"at {result['host_cpu_used_pct']:.0f}% of its own"
            f"{' (CPU to spare)' if result.get('cpu_to_spare') else ''}, "
            if None not in (result.get(n) for n in ("broker_cpu_used_pct", "host_cpu_used_pct"))
            else "")
    held = " -> ".join(f"{h['rate']:,.0f} ("
                       + ("kept up" if h["kept_up"] else f"{h['delivered_rate'] / h['rate']:.1%}"
                          + ("; unstable" if h["unstable"] else "")
                          + (f"; {h['broken']}" if h["broken"] else ""))
                       + ("; run again" if h["retried"] else "") + ")"
                       for h in result.get("holds", []))
    print(f"  {label} night {number + 1}: max_rate {result['max_rate'] or 0:,.0f} msg/s, "
          f"cost {result.get('broker_cpu_s_per_10k') or 0:.3f} CPU-s/10K, {read}{used}"
          f"{''.join(r + ', ' for r in ran)}{f'holds {held}, ' if held else ''}"
          f"{result['validity']}{reason}; verdicts {result['verdicts']}", flush=True)
    return result


def smallest_step(sigma: float, series: int, rng: np.random.Generator) -> dict:
    """The smallest step in STEPS caught within two nights with TARGET probability: by
    the Neyman-Pearson bound, and by perfpipe's detector on simulated 20-night histories of
    log-normal-like noise (t, 3 d.o.f., this robust sigma), the stage judged on its own
    noise (no other stage to pool with)."""
    found = {"bound": None, "perfpipe": None}
    for step in STEPS:
        delta = math.log1p(step)
        _, bound2 = recall_bound(sigma, delta, rng, draws=200_000)
        if found["bound"] is None and bound2 >= TARGET:
            found["bound"] = step
        if found["perfpipe"] is None and simulated_recall(sigma, step, series, rng) >= TARGET:
            found["perfpipe"] = step
        if None not in found.values():
            break
    return found


def simulated_recall(sigma: float, step: float, series: int, rng: np.random.Generator) -> float:
    """Share of simulated max_rate histories (t3 noise of this robust sigma) where perfpipe
    says `regression` on the first or second night after a capacity drop of `step`, 20
    quiet nights before: the stage alone, judged as bench_detector.py judges one."""
    noise = Noise({"max_rate": sigma}, 0.0, 0.0)
    replay = Replay()
    return replay.run_step(replay.perfpipe, noise, ["max_rate"], "max_rate", step, series, rng,
                           scales=(1.0,))["recall2"]


def scenarios_dir(work: Path, qos: int) -> Path:
    """The shipped catalog, plus the throttled scenario, with the bench's two suites (the
    real one capacity_fanin at `qos`)."""
    import shutil

    target = work / "scenarios"
    shutil.copytree(REPO / "scenarios", target)
    (target / "catalog" / "bench_throttled.yml").write_text(THROTTLED)
    (target / "suites.yml").write_text(
        "suites:\n  throttled: [bench_throttled]\n"
        f"  real: [{{scenario: capacity_fanin, qos: [{qos}]}}]\n")
    return target


def series_spread(nights: list[dict], metric: str) -> dict:
    """A metric's valid nights as recorded (the nights the detector judges): the values, how
    many, and their robust sigma (of 3 nights or more)."""
    values = [n[metric] for n in nights if n.get(metric) and n["validity"] == "valid"]
    return {"values": [round(v, 6) for v in values], "nights": len(values),
            "robust_sigma": round(robust_sigma(values), 5) if len(values) >= 3 else None}


def night_groups(nights: list[dict]) -> dict[str, dict]:
    """The valid nights' max_rate by whether the broker or its host used its CPU up over the
    confirming hold, as the pipeline's verdict tells it (`tasks.analysis.capacity`: the
    broker ran out of CPU; else it fell behind with CPU to spare, as when it sleeps waiting
    to be woken), and by whether the night was pinned, where any was. Nights without the
    readings are left out."""
    read = [n for n in nights if n.get("host_cpu_used_pct") is not None
            and n.get("broker_cpu_used_pct") is not None]
    pinnings = [("pinned", True), ("unpinned", False)] if any(n["pinned"] for n in nights) \
        else [("", None)]
    groups = {}
    for pin_label, pinned in pinnings:
        for cpu_label, up in (("CPU used up", True),
                              (f"CPU to spare (broker under {BROKER_USED_UP_PCT:.0f}% of its "
                               f"core(s), host under {HOST_USED_UP_PCT:.0f}%)", False)):
            group = [n for n in read if pinned in (None, n["pinned"])
                     and (not n["cpu_to_spare"]) == up]
            groups[", ".join(filter(None, (pin_label, cpu_label)))] = \
                series_spread(group, "max_rate")
    return groups


def hold_explains(nights: list[dict]) -> dict[str, dict[str, dict]]:
    """What each figure read over a valid night's confirming hold (AT_HOLD) explains of the
    night's max_rate and cost (`host_pace.explained`: the correlation of the logs, and the
    spread left with the line fitted on the other nights); left out with fewer than 4 such
    nights, or where no line can be fitted (the covariate the same on the other nights), so
    the run's figures are still written."""
    import statistics

    from host_pace import explained

    out: dict[str, dict[str, dict]] = {}
    for metric in ("max_rate", "broker_cpu_s_per_10k"):
        for by in AT_HOLD:
            pairs = [(n["hold"][by], n[metric]) for n in nights
                     if n["validity"] == "valid" and n.get(metric) and n.get("hold", {}).get(by)]
            if len(pairs) < 4:
                continue
            try:
                out.setdefault(metric, {})[by] = explained(*map(list, zip(*pairs)))
            except (ZeroDivisionError, statistics.StatisticsError) as exc:
                print(f"  real {metric} on {by}: no line fitted ({exc})")
    return {metric: fits for metric, fits in out.items() if fits}


def pairs_line(e: dict) -> str:
    return (f"r {e['r']:+.2f} over {e['pairs']} nights, slope {e['slope']:+.2f}, sd of the logs "
            f"{100 * e['sd']:.1f}% -> {100 * e['left_sd']:.1f}% left")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nights", type=int, default=8,
                        help="A nights of the throttled broker (0: none, nor its 5%% step)")
    parser.add_argument("--real-nights", type=int, default=6, help="nights of the real one")
    parser.add_argument("--pin", choices=PIN, default="off",
                        help="the real nights' broker on the first CPU and drivers on the "
                             "others: on no night, every night, or every other night "
                             "(the first pinned)")
    parser.add_argument("--qos", type=int, choices=(0, 1), default=0,
                        help="the real nights' QoS (capacity_fanin runs both every night)")
    parser.add_argument("--series", type=int, default=2000, help="simulated histories per step")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    if pin_problem(args.pin):
        parser.error(pin_problem(args.pin))
    rng = np.random.default_rng(args.seed)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="perfpipe-bench-capacity-") as tmp:
        work = Path(tmp)
        os.environ.update(PERFPIPE_STATE_DIR=str(work / "state"),
                          PERFPIPE_SCENARIOS_DIR=str(scenarios_dir(work, args.qos)))
        for name in ("PERFPIPE_DB_URL", "PERFPIPE_SLACK_TOKEN", "PERFPIPE_INVENTORY"):
            os.environ.pop(name, None)
        a, b = [], []
        if args.nights:
            print(f"1. throttled Mosquitto, capacity {CAPACITY} msg/s exactly:", flush=True)
            a, b = throttled_nights(work, args.nights)
        print(f"2. this machine's Mosquitto, capacity_fanin QoS {args.qos} (perfpipe starts "
              "it):", flush=True)
        real = real_nights(args.real_nights, args.pin, work)
    figures = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_at_end": os.getloadavg(),
               "command": "bench/bench_capacity.py " + " ".join(sys.argv[1:]),
               "seconds": round(time.time() - started), "qos": args.qos,
               "throttled": {"capacity": CAPACITY, "max_rate": series_spread(a, "max_rate"),
                             "cost": series_spread(a, "broker_cpu_s_per_10k"),
                             "step_5pct": [{"max_rate": n["max_rate"],
                                            "verdict": n["verdicts"].get("max_rate")}
                                           for n in b]},
               "real": {"max_rate": series_spread(real, "max_rate"),
                        "cost": series_spread(real, "broker_cpu_s_per_10k"),
                        "validity": [n["validity"] for n in real],
                        "reasons": sorted({n["reason"] for n in real if n["reason"]}),
                        "explained": hold_explains(real),
                        "nights": [{key: n.get(key) for key in (
                            "max_rate", "validity", "pinned", "hold", "holds",
                            "broker_cpu_used_pct", "host_cpu_used_pct", "cpu_to_spare")}
                                   for n in real],
                        "groups": night_groups(real)},
               # probes and holds run, and of them run again after falling behind below the
               # last capacity (a stall, or a broker that lost capacity: the B nights)
               "runs": {label: {kind: [sum(n["runs"][kind][i] for n in nights if "runs" in n)
                                       for i in (0, 1)] for kind in ("probes", "holds")}
                        for label, nights in (("throttled A", a), ("throttled B", b),
                                              ("real", real))}}
    print("\n3. the smallest step caught within two nights (90%), at each measured noise:")
    rows = [("throttled max_rate", figures["throttled"]["max_rate"]),
            ("throttled cost/msg", figures["throttled"]["cost"]),
            ("real max_rate", figures["real"]["max_rate"]),
            ("real cost/msg", figures["real"]["cost"])]
    print(f"  {'series':20} {'nights':>6} {'noise':>7} {'bound':>7} {'perfpipe':>9}")
    for label, noise in rows:
        sigma = noise["robust_sigma"]
        if sigma is None:
            print(f"  {label:20} {noise['nights']:>6}  (too few nights)")
            continue
        smallest = smallest_step(max(sigma, 1e-4), args.series, rng)
        noise["smallest_step"] = smallest
        fmt = lambda x: "none" if x is None else f"{100 * x:.0f}%"  # noqa: E731
        print(f"  {label:20} {noise['nights']:>6} {100 * sigma:>6.2f}% {fmt(smallest['bound']):>7} "
              f"{fmt(smallest['perfpipe']):>9}")
    for metric, by_covariate in figures["real"]["explained"].items():
        print(f"  real {metric} on what was read over the hold: "
              + "; ".join(f"{by}: {pairs_line(e)}" for by, e in by_covariate.items()))
    for label, noise in figures["real"]["groups"].items():
        if not noise["nights"]:
            continue
        print(f"  real max_rate, {label}: valid nights {noise['nights']}, robust sigma "
              + (f"{100 * noise['robust_sigma']:.2f}%" if noise["robust_sigma"] else "-")
              + "".join(f", {v:,.0f}" for v in noise["values"]) + " msg/s")
    caught = [s["verdict"] for s in figures["throttled"]["step_5pct"]]
    if caught:
        print(f"\n  a 5% capacity step on the throttled broker: {' -> '.join(map(str, caught))}")
    print("  run again after falling behind below the last capacity: " + "; ".join(
        f"{label} {runs['probes'][1]} of {runs['probes'][0]} probes, {runs['holds'][1]} of "
        f"{runs['holds'][0]} holds" for label, runs in figures["runs"].items()
        if runs["probes"][0]))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
        print(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
