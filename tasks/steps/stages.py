"""Step stages: run each stage's driver processes on the driver hosts, in plan order.

Per stage: place clients on every driver process, start the processes, wait until all
are connected and subscribed (readiness barrier), hand them one common start time, sample
the broker over the same window, and wait for every process to finish within a bound.
"""

from __future__ import annotations

import csv
import io
import json
import math
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple
from datetime import datetime, timezone

from .. import rundir
from ..analysis.failfast import FailFast, breach, progress_line
from ..analysis.validity import (
    backlog_rising,
    broken_promises,
    deliveries_per_message,
    delivered_qos,
    drivers_cpus_used_pct,
    message_loss,
    process_cpu_pct,
    promised_qos,
    throughput_cv,
    unstable,
)
from ..brokers import ADAPTERS
from ..catalog.cpus import kept_on, others, parse, pinned
from ..catalog.placement import (
    ProcessPlan,
    expected_delivery_rate,
    place,
    process_spec,
    receivers,
    recorded_params,
    stage_slots,
)
from ..catalog.ratesearch import ProbeResult, RateSearch, SearchPolicy
from ..catalog.stages import Stage, probe
from ..driver.output import (
    COUNTERS_FILE,
    PROGRESS_FILE,
    READY_FILE,
    START_FILE,
    SUMMARY_FILE,
)
from ..hosts import Host, HostError, died
from ..run_context import RunContext
from . import STEPS, Call
from .broker import kept_for_search, let_go
from .load_metrics import stage_key
from .provision import host_pythonpath, run_fingerprint, usable_cpus
from .teardown import stop_stage_processes

READY_TIMEOUT_S = 60.0
# seconds at least between the barrier and the common start (a whole second): enough to
# hand every process its start file, over SSH or on this machine
START_LEAD_S = {"ssh": 1.0, "local": 0.15}
PROGRESS_EVERY_S = 5.0  # live progress lines while a stage runs
# How often the orchestrator looks at the drivers' files: slowly while a window is
# measured (each look is a process or an SSH command on a host under test), briskly at
# the barrier and once the window is over, when a stage's start, which is rounded up to
# a whole second, waits on it.
POLL_MEASURING_S, POLL_IDLE_S = 0.2, 0.05


class StageError(RuntimeError):
    """A stage could not be run (a driver failed to start or never got ready)."""


@dataclass
class Launched:
    host: Host
    plan: ProcessPlan
    out_dir: str
    group_pid: int


def _put_json(host: Host, document: dict, remote: str) -> None:
    host.put_text(json.dumps(document), remote)


def _launch(ctx: RunContext, stage: Stage, plan: ProcessPlan, broker: dict) -> Launched:
    host = ctx.host(plan.host)
    out_dir = f"{ctx.remote_run_dir(host)}/{rundir.process_dir(stage.stage_id, plan.host, plan.proc)}"
    host.mkdir(out_dir)
    endpoint = {"host": broker["address"], "port": broker["port"]}
    _put_json(host, process_spec(stage, plan, run_id=ctx.run_id, broker=endpoint),
              f"{out_dir}/spec.json")
    argv = ["env", f"PYTHONPATH={host_pythonpath(ctx, plan.host)}", host.python, "-m", "tasks.driver",
            "--spec", f"{out_dir}/spec.json", "--out", out_dir]
    return Launched(host, plan, out_dir, host.launch(pinned(argv, own_cpus(broker, plan.host)),
                                                     f"{out_dir}/driver.log"))


def during(broker: dict, search: bool) -> dict:
    """broker.json's state (`broker`) as a stage sees it: `cpus` only where the broker is
    kept on them during the stage (`search`: a max-rate search's; `tasks.catalog.cpus.kept_on`),
    so perfpipe's processes on its host run on the others then, and anywhere otherwise."""
    kept = kept_on(broker.get("cpus"), broker.get("cpus_for", "all"), search)
    return {**broker, "cpus": kept} if kept else {k: v for k, v in broker.items() if k != "cpus"}


def own_cpus(broker: dict, host: str) -> str | None:
    """The CPUs perfpipe's own processes on `host` run on: where the broker runs on some
    (`broker.cpus`, as `broker`, broker.json, records them), the others it may use; else
    None (anywhere; also where the broker has them all, on a host without drivers)."""
    if not broker.get("cpus") or broker.get("host") != host:
        return None
    return others(broker["cpus"], parse(broker["host_cpus"])) or None


def _wait_ready(launched: list[Launched], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = list(launched)
    while waiting and time.monotonic() < deadline:
        for proc in list(waiting):
            if proc.host.exists(f"{proc.out_dir}/{READY_FILE}"):
                waiting.remove(proc)
            elif proc.host.exit_code(f"{proc.out_dir}/driver.log") is not None:
                log = proc.host.run(["tail", "-n", "3", f"{proc.out_dir}/driver.log"], check=False)
                raise StageError(f"driver {proc.plan.host}/{proc.plan.proc} exited before it was "
                                 f"ready: {log.stdout.strip()}")
        time.sleep(POLL_IDLE_S)
    if waiting:
        names = [f"{p.plan.host}/{p.plan.proc}" for p in waiting]
        raise StageError(f"drivers not ready after {timeout_s:.0f} s: {names}")


def _progress(launched: list[Launched]) -> list[dict]:
    docs = []
    for proc in launched:
        text = proc.host.read_file(f"{proc.out_dir}/{PROGRESS_FILE}")
        try:
            docs.append(json.loads(text) if text else {})
        except ValueError:
            docs.append({})  # being replaced right now: next time
    return docs


def _wait_done(launched: list[Launched], until: float, *, started: float, ends: float,
               progress=print, rule: FailFast = FailFast(),
               cannot_go_on: Callable[[], str | None] = lambda: None) -> tuple[dict, str | None]:
    """Wait for every process to exit; meanwhile say how the stage goes every few seconds
    and stop it early when a fail-fast rule is broken or it `cannot_go_on` (the broker
    gone, the disk full). (exit codes, why it was stopped)."""
    codes: dict[str, int | None] = {}
    pending = list(launched)
    stopped, said_at = None, time.monotonic()
    while pending and time.time() < until:
        for proc in list(pending):
            code = proc.host.exit_code(f"{proc.out_dir}/driver.log")
            if code is not None:
                codes[f"{proc.plan.host}/{proc.plan.proc}"] = code
                pending.remove(proc)
        if pending and time.monotonic() - said_at >= PROGRESS_EVERY_S:
            said_at = time.monotonic()
            snapshot = _progress(launched)
            progress(progress_line(snapshot, max(0.0, time.time() - started)))
            if stopped is None and (stopped := cannot_go_on() or breach(snapshot, rule)):
                progress(f"    stopping the stage: {stopped}")
                for proc in pending:
                    proc.host.kill_group(proc.group_pid)  # SIGTERM: partial files are written
                until = min(until, time.time() + 15)
        time.sleep(POLL_MEASURING_S if time.time() < ends else POLL_IDLE_S)
    for proc in pending:  # overran its bound: stop it, the partial files say the rest
        proc.host.kill_group(proc.group_pid)
        codes[f"{proc.plan.host}/{proc.plan.proc}"] = None
    # a broker that died in the window's last seconds is the stage's first reason too
    return codes, stopped or cannot_go_on()


@dataclass(frozen=True)
class BrokerSampler:
    """Where the broker sampler runs and what it reads (`tasks.driver.sampler`)."""

    host: str
    args: list[str]
    sampled: dict  # stage.json's "sampler": what the aggregation finds in its folder


def broker_sampler(ctx: RunContext, broker: dict) -> BrokerSampler | None:
    """The broker's sampler, whether perfpipe started the broker or not. On the broker's
    host: its processes (the process group perfpipe launched; else the inventory's
    broker.processes, else the adapter's command-line pattern), the host's own counters,
    and the broker's own view; with no broker host, only the broker's own view, read from
    the first driver host (None when the broker publishes none)."""
    config = ctx.inventory.broker
    adapter = ADAPTERS[broker["kind"]]
    stats = adapter(None).stats_args(broker, config.metrics_url)
    described = stats[0].lstrip("-") + " " + stats[1] if stats else None
    if not broker.get("host"):
        if not stats:
            return None
        return BrokerSampler(ctx.inventory.driver_hosts()[0].name, stats,
                             {"processes": None, "host": False, "stats": described})
    if broker.get("group_pid"):
        way = ("session", str(broker["group_pid"]))
    elif config.processes is not None:
        way = config.processes.way()
    else:
        way = ("match", adapter.process_pattern) if adapter.process_pattern else None
    args = [f"--{way[0].replace('_', '-')}", way[1]] if way else []
    dedicated = "driver" not in ctx.inventory.host(broker["host"]).roles
    return BrokerSampler(broker["host"], [*args, "--host-counters", *stats],
                         {"processes": way and f"{way[0]} {way[1]}", "host": True,
                          "dedicated": dedicated, "stats": described})


class Group(NamedTuple):
    """A process group a stage launched on a host (a driver process, the sampler)."""

    host_name: str
    host: Host
    group_pid: int


def _start_sampler(ctx: RunContext, sampler: BrokerSampler, stage: Stage, until: int,
                   broker: dict) -> Group:
    host = ctx.host(sampler.host)
    out_dir = f"{ctx.remote_run_dir(host)}/{rundir.sampler_dir(stage.stage_id, sampler.host)}"
    host.mkdir(out_dir)
    return Group(sampler.host, host, host.launch(
        pinned(["env", f"PYTHONPATH={host_pythonpath(ctx, sampler.host)}", host.python,
                "-m", "tasks.driver.sampler", *sampler.args, "--until", str(until),
                "--out", out_dir], own_cpus(broker, sampler.host)),
        f"{out_dir}/sampler.log"))


def record_launched(ctx: RunContext, stage_id: str, launched: list[Group],
                    recorded: list[dict] = ()) -> list[dict]:
    """processes/<stage>.json, for teardown: each process group (the drivers, then the
    sampler, which ends by itself at the stage's end, but not when a run stops early),
    written before anything else is asked of a host, then again with when each started
    (`Host.started`: None for one already gone, nothing for a host that did not answer),
    so a group whose id the kernel gave another process since is left alone. `recorded`:
    the groups written already (the drivers, when the sampler is added), kept as they are;
    returns them all."""
    path = rundir.processes_file(stage_id)
    new = [{"host": g.host_name, "group_pid": g.group_pid} for g in launched]
    ctx.write_json(path, {"processes": [*recorded, *new]})
    for group, launch in zip(new, launched):
        try:
            group["started"] = launch.host.started(launch.group_pid)
        except HostError:
            continue
    ctx.write_json(path, {"processes": [*recorded, *new]})
    return [*recorded, *new]


def run_stage(ctx: RunContext, stage: Stage, broker: dict, progress=print) -> dict:
    inventory = ctx.inventory
    plans = place(stage, stage_slots(stage, inventory, usable_cpus(ctx)))
    launched = [_launch(ctx, stage, plan, broker) for plan in plans]
    recorded = record_launched(ctx, stage.stage_id,
                               [Group(p.plan.host, p.host, p.group_pid) for p in launched])
    try:
        _wait_ready(launched, READY_TIMEOUT_S)
    except StageError:
        for proc in launched:
            proc.host.kill_group(proc.group_pid)
        raise
    refused = breach(_progress(launched))  # connection failures show at the barrier
    if refused:
        progress(f"    not starting the stage: {refused}")
        for proc in launched:
            proc.host.kill_group(proc.group_pid)
    lead = max(START_LEAD_S[ctx.inventory.host(p.host).transport] for p in plans)
    start_at = math.ceil(time.time() + lead)
    windows = {"start": start_at, "measure_start": start_at + stage.warmup_s,
               "measure_end": start_at + stage.warmup_s + stage.measure_s,
               "end": start_at + stage.duration_s}
    expected = expected_delivery_rate(plans)
    sampler = None if refused else broker_sampler(ctx, broker)  # a refused stage: nothing runs
    ctx.write_json(rundir.stage_file(stage.stage_id), {
        "run_id": ctx.run_id, "stage_id": stage.stage_id, "scenario": stage.scenario,
        "qos": stage.qos, "clients": stage.publishers + stage.subscribers,
        "windows": windows, "target_publish_rate": stage.target_publish_rate,
        "expected_delivery_rate": expected, "receivers": receivers(plans),
        "processes": [{"host": p.host, "proc": p.proc} for p in plans],
        "broker_host": sampler and sampler.host,
        "sampler": sampler and sampler.sampled,
    })
    if sampler is not None:
        record_launched(ctx, stage.stage_id,
                        [_start_sampler(ctx, sampler, stage, windows["end"], broker)], recorded)
    for proc in launched:
        _put_json(proc.host, {"start_at": start_at}, f"{proc.out_dir}/{START_FILE}")
    codes, stopped = _wait_done(launched, windows["end"] + 30, started=start_at,
                                ends=windows["end"], progress=progress,
                                cannot_go_on=_stop_check(ctx, broker))
    stopped = refused or stopped
    if stopped:
        ctx.write_json(rundir.failfast_file(stage.stage_id),
                       {"reason": stopped, "started": not refused})
    failed = [f"driver {name} {how}" for name, code in sorted(codes.items())
              if code is not None and (how := died(code))]
    for line in failed:
        progress(f"    {line}")
    if failed:
        ctx.write_json(rundir.drivers_failed_file(stage.stage_id),
                       {"failures": failed, "exit_codes": codes})
    return {"stage_id": stage.stage_id, "processes": len(launched), "exit_codes": codes,
            "stopped": stopped, "drivers_failed": failed,
            "windows": windows, "expected_delivery_rate": expected,
            "out_dirs": [(p.plan.host, p.out_dir) for p in launched]}


def probe_result(ctx: RunContext, stage: Stage, ran: dict, hold: bool = False) -> ProbeResult:
    """How a probe stage went, or a `hold` (`probe_outcome`), from its stage.json and its
    processes' counters and summaries read straight from the hosts: the search decides
    before the next one."""
    counters = [ctx.host(host_name).read_file(f"{out_dir}/{COUNTERS_FILE}") or ""
                for host_name, out_dir in ran["out_dirs"]]
    summaries = [_summary(ctx.host(host_name).read_file(f"{out_dir}/{SUMMARY_FILE}"))
                 for host_name, out_dir in ran["out_dirs"]]
    planned = json.loads((ctx.run_dir / rundir.stage_file(stage.stage_id)).read_text())
    return probe_outcome(planned, counters, summaries, hold)


def _summary(text: str | None) -> dict:
    """A process's summary, or {} (as if it left none) when it has none or one cut short."""
    try:
        return json.loads(text or "{}")
    except ValueError:
        return {}


def _counted(text: str) -> Iterator[dict[str, int] | None]:
    """The rows of a process's counters CSV as integers; None for a row cut short (a
    driver killed mid-line), which the aggregation drops as malformed too."""
    for row in csv.DictReader(io.StringIO(text)):
        try:
            yield {name: int(row[name]) for name in
                   ("second", "published", "received", "duplicated", "errors")}
        except (TypeError, ValueError):
            yield None


def probe_outcome(planned: Mapping, counters: list[str], summaries: list[dict],
                  hold: bool = False) -> ProbeResult:
    """A probe from what was `planned` (its stage.json: rates, measure window, QoS,
    receivers) and its processes' per-second counters (the CSV texts) and summaries
    (clients that never connected, CPU, what was received). Pure. Sends and deliveries are
    counted over the measure window; the promise of the QoS over the whole probe, as the
    validity gate holds its stage to it (a message dropped in the warm-up is lost too). A
    `hold` is judged on its throughput's stability too, as the gate judges its stage (the
    answer and its cost stand on it); a probe's few seconds are too few to tell a swing
    from one catch-up burst."""
    rate, expected_rate = planned["target_publish_rate"], planned["expected_delivery_rate"]
    first, last = planned["windows"]["measure_start"], planned["windows"]["measure_end"]
    columns = ("published", "received", "duplicated", "errors")
    per_second = {second: dict.fromkeys(columns, 0) for second in range(first, last)}
    errors = 0  # over the whole probe, as the gate counts its stage's
    for row in (row for text in counters for row in _counted(text) if row):
        errors += row["errors"]
        if row["second"] in per_second:
            for name in columns:
                per_second[row["second"]][name] += row[name]
    totals = {name: sum(s[name] for s in per_second.values()) for name in columns}
    whole = {name: sum((s.get("totals") or {}).get(name, 0) for s in summaries)
             for name in ("connects_failed", "duplicated")}
    promised = promised_qos(planned["qos"], {"delivery_qos": delivered_qos(summaries)})
    # loss needs every process's summary (the aggregation computes none without them)
    loss = message_loss(summaries, planned["receivers"]) if all(summaries) else None
    broken = broken_promises(promised, loss.lost if loss else 0, whole["duplicated"],
                             loss.unacked if loss else 0)
    busiest = [pct for pct in map(process_cpu_pct, summaries) if pct is not None]
    seconds = last - first
    offered = rate * seconds
    expected = expected_rate * seconds
    series = {"published_per_s": [s["published"] for s in per_second.values()],
              "delivered_per_s": [s["received"] - s["duplicated"] for s in per_second.values()]}
    return ProbeResult(rate=rate,
                       sent_ratio=totals["published"] / offered if offered else 0.0,
                       received_ratio=(totals["received"] - totals["duplicated"]) / expected
                       if expected else 0.0, errors=errors,
                       connects_failed=whole["connects_failed"],
                       backlog=backlog_rising(series, deliveries_per_message(expected_rate, rate)),
                       unstable=unstable(throughput_cv(series["delivered_per_s"]))
                       if hold else None,
                       broken="; ".join(broken) or None,
                       driver_cpu=max(busiest, default=None),
                       drivers_cpus_used=drivers_cpus_used_pct(summaries))


def last_capacity(ctx: RunContext, template: Stage) -> float | None:
    """The capacity this search stage last measured on this run's fingerprint and setup
    (its newest comparable night's max_rate): where a warm start begins, and below which a
    probe that falls behind is run again. Only the same setup's: after a change of setup,
    such as more driver processes, the last capacity may be the old setup's limit (and a
    night of another setup in between is another history's)."""
    key = stage_key(ctx.inventory.broker.kind, template.stage_id)
    nights = ctx.store().history(key, run_fingerprint(ctx), before_run=ctx.run_id, limit=1,
                                 setup=recorded_params(template, ctx.inventory, usable_cpus(ctx)))
    return nights[0]["metrics"].get("max_rate") if nights else None


def run_search(ctx: RunContext, template: Stage, broker: dict, progress=print) -> dict:
    """A max-rate search: probe stages at rates chosen by `tasks.catalog.ratesearch` from how the
    previous probes went. Each probe is recorded in search.json before it runs, so the
    later steps collect, aggregate and report it like any stage."""
    settings = dict(template.search)
    warm = settings.pop("warm_start", False)
    last = last_capacity(ctx, template)  # a stall below it is probed again, warm or not
    search = RateSearch(template.target_publish_rate, SearchPolicy(**settings),
                        last_capacity=last, warm=warm)
    if last and warm:
        progress(f"  warm start at {search.start_rate:,.0f} msg/s: 90% of the capacity last "
                 f"measured here, {last:,.0f} msg/s")
    record = ctx.searches()

    def run_probe(stage: Stage, record_result, hold: bool = False) -> None:
        record["probes"].append(stage.to_dict())
        ctx.write_json(rundir.SEARCH, record)
        result = probe_result(ctx, stage, run_stage(ctx, stage, broker, progress), hold)
        kept = record_result(result)
        again = ("; against the capacity last measured here: run again" if search.retrying
                 else "")
        progress(f"  {stage.stage_id}: {result.rate:,.0f} msg/s "
                 f"{'kept up' if kept else 'fell behind: ' + result.reason(search.policy.tolerance)}"
                 f"{again}")

    while (rate := search.next_rate()) is not None:
        run_probe(probe(template, rate, len(search.probes) + 1), search.record)
    while (rate := search.next_hold()) is not None:
        run_probe(probe(template, rate, len(search.held) + 1, hold_s=search.policy.hold_s),
                  search.record_hold, hold=True)
    record["outcomes"][template.stage_id] = search.outcome()
    record.setdefault("broker_cpus", {})[template.stage_id] = broker.get("cpus")
    ctx.write_json(rundir.SEARCH, record)
    outcome = record["outcomes"][template.stage_id]
    progress(f"  {template.stage_id}: max rate {outcome['max_rate'] or 0:,.0f} msg/s"
             + (f" ({outcome['reason']})" if outcome["reason"] else ""))
    return {"stage_id": template.stage_id, "search": outcome}


def start_clean(ctx: RunContext) -> str | None:
    """Start the stages step from clean folders when an earlier attempt ran in this run (an
    Airflow task cleared or retried, `perfpipe step stages` again): that attempt's drivers
    are stopped, its raw files, process list, searches and any broker_gone.json (the new
    attempt finds the broker afresh) moved to discarded/<n>/ here and on every host (kept,
    never read again), and the marks of the steps after it removed, so those steps run
    again on the new data. Returns what was done, or None."""
    local = [name for name in (rundir.RAW_DIR, rundir.PROCESSES_DIR, rundir.SEARCH,
                               rundir.BROKER_GONE, rundir.METRICS_DIR, rundir.VERDICTS)
             if (ctx.run_dir / name).exists()]
    remote = [(host, raw) for host, folder in ctx.remote_dirs()
              if host.exists(raw := f"{folder}/{rundir.RAW_DIR}")]
    if not local and not remote:
        return None
    stopped = stop_stage_processes(ctx)
    discarded = ctx.run_dir / rundir.DISCARDED_DIR
    attempt = f"{rundir.DISCARDED_DIR}/{len(list(discarded.iterdir())) + 1 if discarded.exists() else 1}"
    (ctx.run_dir / attempt).mkdir(parents=True)
    for name in local:
        (ctx.run_dir / name).rename(ctx.run_dir / attempt / name)
    for host, raw in remote:
        target = f"{ctx.remote_run_dir(host)}/{attempt}"
        host.mkdir(target)
        host.run(["mv", raw, target])
    later = [s.name for s in STEPS[[s.name for s in STEPS].index("stages"):] if not s.always]
    for name in later:
        (ctx.run_dir / rundir.step_mark(name)).unlink(missing_ok=True)
    return (f"an earlier attempt of this step left files: {stopped} of its drivers stopped, "
            f"its files moved to {attempt}/ ({', '.join(local + [h.name for h, _ in remote])})")


def _stop_check(ctx: RunContext, broker: dict) -> Callable[[], str | None]:
    """Why a stage cannot go on: the broker gone or the run folder's disk full."""
    broker_gone = broker_check(ctx, broker, probe_port=False)
    return lambda: broker_gone() or ctx.disk_full()


def broker_check(ctx: RunContext, broker: dict, *,
                 probe_port: bool = True) -> Callable[[], str | None]:
    """A check that says since when and why the broker under test is gone, or None while
    it is there: a managed broker's process, or an unmanaged one's listening port (not
    with `probe_port` False: inside a window a probe would count as a broker connection)."""
    if not (broker.get("managed") and broker.get("pid")) and not probe_port:
        return lambda: None
    if broker.get("managed") and broker.get("pid"):
        host = ctx.host(broker["host"])

        def gone() -> str | None:
            return None if host.alive(broker["pid"]) else (
                f"the broker died (pid {broker['pid']} on {host.name} gone at {_clock()})")
    else:
        def gone() -> str | None:
            try:
                socket.create_connection((broker["address"], broker["port"]), timeout=3).close()
                return None
            except OSError as exc:
                return (f"the broker stopped answering on {broker['address']}:{broker['port']} "
                        f"({exc.strerror or exc}) at {_clock()}")
    return gone


def _clock() -> str:
    return datetime.now(timezone.utc).strftime("%H:%M:%S UTC")


def run(ctx: RunContext, call: Call) -> list[dict]:
    """Every planned stage in order (a search template runs its probes); one result per
    planned stage, each said as it ends. An earlier attempt's files are set aside first
    (`start_clean`). When the broker is gone the stages left are skipped, and why is
    recorded for teardown (`rundir.BROKER_GONE`)."""
    progress = call.say
    broker = ctx.broker()
    let_go(ctx, broker)  # where an earlier attempt stopped in a search
    cleaned = start_clean(ctx)
    if cleaned:
        progress(f"starting from clean folders: {cleaned}")
    results = []
    for number, stage in enumerate(ctx.stages, 1):
        full = ctx.disk_full()
        if full:  # nothing of the stages left could be kept
            raise StageError(f"{full}: {len(ctx.stages) - number + 1} stages left not run")
        progress(f"stage {number}/{len(ctx.stages)} {stage.stage_id}: {stage.publishers} pubs, "
                 f"{stage.subscribers} subs, {stage.target_publish_rate:g} msg/s, "
                 f"{stage.duration_s} s")
        if stage.search is not None:
            with kept_for_search(ctx, broker):
                results.append(run_search(ctx, stage, during(broker, search=True), progress))
        else:
            results.append(run_stage(ctx, stage, during(broker, search=False), progress))
        why = broker_check(ctx, broker)()
        if why:
            skipped = [s.stage_id for s in ctx.stages[number:]]
            progress(f"{why}: {len(skipped)} stages left skipped")
            ctx.write_json(rundir.BROKER_GONE, {"reason": why, "stage_id": stage.stage_id,
                                                "skipped": skipped})
            break
    return results
