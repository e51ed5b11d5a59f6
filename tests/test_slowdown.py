"""A broker made slower or costlier in a known way, caught by the nightly: A nights of the
real pipeline (real Mosquitto, drivers, Spark, SQLite, the Slack Web API server) build a
history, then B nights run the same broker with the slowdown. The A nights must raise no
alert; the B nights must raise the regression by the second night at the latest, told in
Slack exactly once.

- An unmanaged broker with a host (a Mosquitto started here, found by its command line):
  capacity comes through a proxy whose deliveries share one token bucket, so the broker
  can deliver `CAPACITY` msg/s exactly; B nights cut the bucket by `CAPACITY_STEP` and load
  the burn plugin, which adds `BURN_US` of the broker's own CPU time to every message
  (infra/slowdown). Each night runs one capacity search, held, with the cost at capacity.
- A managed broker (perfpipe starts it): B nights load the burn plugin through the
  inventory's broker.extra_config. Each night runs one rated stage, whose cost per message
  is judged, the driver's CPU a message recorded beside it (the driver on the broker's
  host: the cost's covariate, once the stage has 8 nights of it; these nights are fewer).

The unmanaged inventory runs the search's probes and holds on 2 driver processes
(`search_procs`), the managed one its rated stage on its `procs`, 1: each test checks it.

`bench/bench_capacity.py` measures the same on more nights and prints the figures.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from infra.slowdown.slowdown import (
    ThrottledProxy,
    build_burn_plugin,
    burn_config,
    unmanaged_inventory,
)
from sql import Store
from tasks.analysis.policy import Policy
from tasks.driver.procfs import TICKS, read_host
from tasks.driver.wire import Template
from tests.conftest import Broker

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # 14 pipeline runs

A_NIGHTS, B_NIGHTS = 5, 2
# The steps are large on purpose: with 5 nights of history a stage is still learning its
# noise (8 nights), and only a change beyond doubt (15% or more and 5x the widest swing
# of the A nights) two nights in a row is a regression: the first B night is `learning`
# (marked beyond doubt once), the second a `regression`. How small a step the detector
# catches, and at which noise, is bench/bench_capacity.py's and bench_detector.py's job.
CAUGHT = ["learning", "regression"]  # the B nights' verdicts
# A night the hypervisor disturbed is not judged (`tasks.analysis.host_gates`: on the shared
# VMs this runs on, two clean clones of 2026-12-03 each had an A night whose host_steal_pct
# was 47 and 58, 0-15 on the others, and the broker's cost 2.4x the rest), so it leaves
# the history a night short of what the learning rule needs to call a step beyond doubt,
# or leaves a B night unjudged: such a night is excluded, as its operator would exclude
# it, and measured again.
# Steal comes in spells: a run of 2026-12-03 met 41% of a core on two measurements of one
# night in a row.
REMEASURED = 4  # nights measured again, at most, per call of run_nights
# ... once the host is quiet again: a spell of steal outlasts a night of these tests (a
# clean clone of 2026-12-03 met 24-46% of a core over four managed nights in a row, 32 s,
# and ran out of measurements), so an excluded night is measured again, as its operator
# would run it again, once the hypervisor took under QUIET_STEAL_PCT of a core for
# QUIET_S seconds in a row (QUIET_WAIT_S at most)
QUIET_STEAL_PCT, QUIET_S, QUIET_WAIT_S = 10.0, 2, 60
STOLEN_PCT = 20.0  # an A night whose search saw more steal than this is measured again
TOPIC, PAYLOAD, PUBLISHERS = "perfpipe/slowdown", 256, 10
PACKET = len(Template(TOPIC, 0, PAYLOAD, 0, 0).packet)  # a QoS 0 delivery, as sent
CAPACITY = 2_000  # msg/s the proxy lets the broker deliver to the one subscriber
CAPACITY_STEP = -0.25  # B nights: the bucket 25% smaller
BURN_US = 160  # B nights: CPU microseconds the broker spends more on every message
RATED = 2_000  # msg/s of the managed broker's rated stage
# The search's probes measure 1 s: a probe is judged by its sent and received ratios (the
# backlog gate needs 2 s of a window), and the holds, 2 s each, by every gate; the answer
# is the held rate, so an overshooting probe is corrected by a failing hold. At a 2.5%
# precision the best probe sits close to the bucket's rate, so a hold there may fail on a
# loaded machine: three holds, as capacity_fanin has (with two, 2 of about 10 runs beside
# other tests ended a B night with no rate held).

SEARCH = f"""
name: slow_capacity
source: "perfpipe's slowdown test: fan-in capacity through a throttled delivery path"
qos: [0]
publishers:
  - {{group: pub, count: {PUBLISHERS}, topic: "{TOPIC}", aggregate_rate: 1000,
     payload_bytes: {PAYLOAD}}}
subscribers:
  - {{group: sub, count: 1, topics: ["{TOPIC}"]}}
stages:
  warmup_s: 1
  measure_s: 1
  cooldown_s: 0
  search: {{growth: 2.0, precision: 0.025, max_probes: 10, hold_s: 2, holds: 3}}
"""
RATED_STAGE = f"""
name: slow_rated
source: "perfpipe's slowdown test: fan-in at a rated load"
qos: [0]
publishers:
  - {{group: pub, count: {PUBLISHERS}, topic: "{TOPIC}", aggregate_rate: {RATED},
     payload_bytes: {PAYLOAD}}}
subscribers:
  - {{group: sub, count: 1, topics: ["{TOPIC}"]}}
stages: {{warmup_s: 1, measure_s: 2, cooldown_s: 0}}
"""


@pytest.fixture
def slowdown_env(tmp_path, monkeypatch, perfpipe_env, spark_connect, slack):
    scenarios = tmp_path / "scenarios"
    (scenarios / "catalog").mkdir(parents=True)
    (scenarios / "catalog" / "slow_capacity.yml").write_text(SEARCH)
    (scenarios / "catalog" / "slow_rated.yml").write_text(RATED_STAGE)
    (scenarios / "suites.yml").write_text(
        "suites: {capacity: [slow_capacity], rated: [slow_rated]}\n")
    monkeypatch.setenv("PERFPIPE_SCENARIOS_DIR", str(scenarios))
    monkeypatch.setenv("PERFPIPE_SLACK_TOKEN", "xoxb-slowdown")
    monkeypatch.setenv("PERFPIPE_SLACK_BASE_URL", slack.base_url)
    return slack


def night(suite: str, inventory: Path) -> str:
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings

    outcome = run_pipeline(load_settings(), suite=suite, inventory=inventory, kind="nightly",
                           say=lambda _: None)
    assert outcome.status == "ok", outcome
    return outcome.run_id


def verdicts(run_id: str) -> dict[str, dict]:
    from tasks.settings import load_settings

    (stage,) = [s for s in Store(load_settings().database_url()).stages(run_id)
                if not s["params"].get("probe_of")]
    return {"stage": stage, **{c["metric"]: c for c in stage["comparisons"]}}


def run_nights(suite: str, inventories: list[Path], slack, first: int = 1) -> list[dict]:
    """Nights `first`, `first` + 1, ... in order; Slack must stay quiet through the A nights
    (whatever a short history's verdicts) and the first B night (a suspicion waits for the
    next night). A night not judged as the hypervisor took its host (`steal_gated`), an A
    night it took much of (`stolen`), and after the A nights one their baseline leaves out
    (`left_out`), is excluded and measured again once the host is quiet (`REMEASURED`
    times a call at most), saying so."""
    nights, again = [], 0
    for number, inventory in enumerate(inventories, first):
        tonight = verdicts(night(suite, inventory))
        while again < REMEASURED and (why := steal_gated(tonight)
                                      or (number <= A_NIGHTS and stolen(tonight))):
            again += 1
            exclude(tonight["stage"]["run_id"], why)
            print(f"night {number}: {why}: excluded, measured again "
                  f"{wait_for_a_quiet_host()}")
            tonight = verdicts(night(suite, inventory))
        nights.append(tonight)
        if number <= A_NIGHTS + 1:
            assert slack.posts() == [], f"night {number} alerted: {slack.posts()[-1].body}"
    while first == 1 and again < REMEASURED and (out := left_out(nights)):
        again += 1
        why = (f"host_steal_pct {out['stage']['metrics']['host_steal_pct']:.0f}, off the "
               "usual of the A nights")
        exclude(out["stage"]["run_id"], why)
        print(f"an A night: {why}: excluded, another measured {wait_for_a_quiet_host()}")
        nights.remove(out)
        nights.append(verdicts(night(suite, inventories[-1])))
        assert slack.posts() == [], f"an A night alerted: {slack.posts()[-1].body}"
    return nights


def wait_for_a_quiet_host() -> str:
    """Wait until the hypervisor leaves the host alone again (`QUIET_STEAL_PCT`); says how
    long that took."""
    started = last_at = time.monotonic()
    last, quiet = read_host().steal_ticks, 0
    while quiet < QUIET_S and time.monotonic() - started < QUIET_WAIT_S:
        time.sleep(1)
        now, now_at = read_host().steal_ticks, time.monotonic()
        stolen_pct = 100 * (now - last) / TICKS / (now_at - last_at)
        quiet = quiet + 1 if stolen_pct < QUIET_STEAL_PCT else 0
        last, last_at = now, now_at
    return f"after {time.monotonic() - started:.0f} s waiting for a quiet host"


def steal_gated(tonight: dict) -> str | None:
    """The note of a metric tonight did not judge as the hypervisor took its host."""
    return next((c["detail"]["note"] for name, c in tonight.items()
                 if name != "stage" and "steal_over_pct" in (c.get("detail") or {})), None)


def stolen(tonight: dict) -> str | None:
    """An A night the hypervisor took much of the host through (`STOLEN_PCT`): judged at its
    time against a usual that such nights themselves set, it falls out of the baseline
    once quieter nights follow (a clean clone of 2026-12-04: three A nights at 64-83% of a
    core, left out at the second B night, which then had three nights, too few to see a
    25% drop beyond doubt)."""
    steal = tonight["stage"]["metrics"].get("host_steal_pct") or 0.0
    return f"host_steal_pct {steal:.0f}" if steal > STOLEN_PCT else None


def left_out(nights: list[dict]) -> dict | None:
    """A night the baseline of a steal-gated metric leaves out, by the host's usual over all
    of `nights` (`tasks.analysis.nights.at_usual`): a night judged at its time falls out
    once later nights set the usual (the first has no usual to be judged against), and
    leaves the history a night short."""
    from tasks.analysis.nights import at_usual

    history = [{"metrics": n["stage"]["metrics"]} for n in reversed(nights)]
    kept = at_usual("broker_cpu_s_per_10k", history, history, Policy())
    return next((n for n, h in zip(reversed(nights), history) if h not in kept), None)


def exclude(run_id: str, reason: str) -> None:
    from tasks.settings import load_settings

    store = Store(load_settings().database_url())
    store.finish_run(run_id, store.run(run_id)["status"], excluded=True, reason=reason)


def last_run_dir() -> Path:
    from tasks.settings import load_settings

    return Path(Store(load_settings().database_url()).latest_runs(1)[0]["artifact_dir"])


def last_report() -> str:
    return (last_run_dir() / "report.html").read_text()


def driver_processes() -> dict[str, int]:
    """The last night's stages -> how many driver processes each ran."""
    return {path.parent.name: len(json.loads(path.read_text())["processes"])
            for path in (last_run_dir() / "raw").glob("*/stage.json")}


def flagged(nights: list[dict], metric: str) -> list[str]:
    return [n[metric]["verdict"] for n in nights if metric in n]


def report(name: str, nights: list[dict], metric: str, injected: str) -> None:
    values = [n["stage"]["metrics"][metric] for n in nights]
    before = sorted(values[:A_NIGHTS])[A_NIGHTS // 2]
    after = values[A_NIGHTS:]
    detected = [n[metric]["change_pct"] for n in nights[A_NIGHTS:]]
    print(f"\n{name} {metric}: A nights {[round(v, 4) for v in values[:A_NIGHTS]]}, "
          f"B nights {[round(v, 4) for v in after]}; injected {injected}, measured "
          f"{[f'{100 * (v / before - 1):+.1f}%' for v in after]} against the A median, "
          f"detected {[f'{d:+.1f}%' if d is not None else 'none' for d in detected]} "
          f"({' -> '.join(flagged(nights, metric)[A_NIGHTS:])})"
          + "".join(f"; night {i} invalid: {n['stage']['reason']}"
                    for i, n in enumerate(nights, 1) if n["stage"]["validity"] != "valid"))


def test_an_unmanaged_broker_made_slower_and_costlier_is_caught_by_the_second_night(
        slowdown_env, tmp_path):
    plugin = build_burn_plugin()
    work = tmp_path / "broker"
    work.mkdir()
    broker = Broker(work)
    proxy = ThrottledProxy(broker.port, CAPACITY * PACKET)
    inventory = unmanaged_inventory(tmp_path / "unmanaged.yml", proxy.port, work,
                                    search_procs=2)
    try:
        nights = run_nights("capacity", [inventory] * A_NIGHTS, slowdown_env)
        broker.kill()  # the same broker, now with the burn plugin and a smaller bucket
        broker = Broker(work, extra_conf="\n".join(burn_config(plugin, BURN_US)) + "\n")
        proxy.upstream, proxy.rate = broker.port, CAPACITY * (1 + CAPACITY_STEP) * PACKET
        nights += run_nights("capacity", [inventory] * B_NIGHTS, slowdown_env, A_NIGHTS + 1)
    finally:
        proxy.close()
        broker.kill()
    for n in nights[:A_NIGHTS]:  # the search finds the capacity the bucket allows
        assert n["stage"]["validity"] == "valid", n["stage"]["reason"]
        assert abs(n["stage"]["metrics"]["max_rate"] - CAPACITY) <= 0.10 * CAPACITY
    report("unmanaged", nights, "max_rate", f"{100 * CAPACITY_STEP:+.0f}%")
    base_cost = sorted(n["stage"]["metrics"]["broker_cpu_s_per_10k"] for n in nights[:A_NIGHTS])
    report("unmanaged", nights, "broker_cpu_s_per_10k",
           f"+{BURN_US * 10_000 / 1e6:.2f} CPU-s per 10K msgs "
           f"(+{100 * BURN_US * 0.01 / base_cost[A_NIGHTS // 2]:.0f}%)")
    confirmed = [m for m in ("max_rate", "broker_cpu_s_per_10k")
                 if flagged(nights, m)[A_NIGHTS:] == CAUGHT
                 and nights[A_NIGHTS][m]["detail"]["doubt_once"]]
    assert confirmed, ({m: flagged(nights, m) for m in ("max_rate", "broker_cpu_s_per_10k")},
                       [n["stage"]["reason"] for n in nights])
    (told,) = slowdown_env.posts()  # exactly one message, on the second B night
    assert "regression" in told.body["text"]
    blocks = json.dumps(told.body["blocks"])
    assert all(f"`{m}`" in blocks for m in confirmed) and "before: " in blocks  # with history
    # the bucket stopped the broker, not its CPU: the nights' capacities say so, in Slack
    # too (the host's figure is the whole machine's, so a busy neighbour may fill a night)
    spare = [n["max_rate"]["detail"].get("cpu_to_spare") for n in nights]
    assert sum(1 for s in spare if s and s["broker_pct"] < 85) >= len(nights) - 2, spare
    assert "max_rate" not in confirmed or "CPU to spare: broker" in blocks
    # the last night's report draws capacity and cost night by night, all seven nights
    html = last_report()
    for metric in ("max_rate", "broker_cpu_s_per_10k"):
        chart = html.split(f'id="history-slow_capacity.q0.c100.search-{metric}"')[1]
        assert chart.split("</svg>")[0].count("<circle") == A_NIGHTS + B_NIGHTS
    ran = driver_processes()  # every probe and hold on the inventory's search_procs
    assert ran and set(ran.values()) == {2}, ran
    assert all(n["stage"]["params"]["drivers"] == {"localhost": 2} for n in nights)  # recorded


def test_a_managed_broker_made_costlier_is_caught_by_the_second_night(slowdown_env, tmp_path):
    plugin = build_burn_plugin()
    plain, burning = tmp_path / "managed.yml", tmp_path / "managed-burning.yml"
    broker = "broker: {kind: mosquitto, host: localhost, address: 127.0.0.1"
    hosts = ("hosts: [{name: localhost, transport: local, roles: [broker, driver], procs: 1, "
             "search_procs: 2}]\n")  # a rated stage runs procs
    plain.write_text(f"{hosts}{broker}}}\n")
    burning.write_text(f"{hosts}{broker}, extra_config: {json.dumps(burn_config(plugin, BURN_US))}}}\n")
    nights = run_nights("rated", [plain] * A_NIGHTS + [burning] * B_NIGHTS, slowdown_env)
    for n in nights:
        assert n["stage"]["validity"] == "valid", n["stage"]["reason"]
    base_cost = sorted(n["stage"]["metrics"]["broker_cpu_s_per_10k"] for n in nights[:A_NIGHTS])
    report("managed", nights, "broker_cpu_s_per_10k",
           f"+{BURN_US * 10_000 / 1e6:.2f} CPU-s per 10K msgs "
           f"(+{100 * BURN_US * 0.01 / base_cost[A_NIGHTS // 2]:.0f}%)")
    # the driver shares the broker's host: its CPU a message is recorded every night, the
    # covariate the cost is judged at once the stage has the nights to fit it
    assert all(n["stage"]["metrics"]["driver_cpu_s_per_10k"] > 0 for n in nights)
    assert flagged(nights, "broker_cpu_s_per_10k")[A_NIGHTS:] == CAUGHT
    assert nights[A_NIGHTS]["broker_cpu_s_per_10k"]["detail"]["doubt_once"]
    (told,) = slowdown_env.posts()
    assert "`broker_cpu_s_per_10k`" in json.dumps(told.body["blocks"])
    assert driver_processes() == {"slow_rated.q0.c100.r100": 1}
    assert nights[-1]["stage"]["params"]["drivers"] == {"localhost": 1}  # as recorded
