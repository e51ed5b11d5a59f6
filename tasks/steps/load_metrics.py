"""Step load_metrics: the Spark job's per-stage metrics, judged by the validity gates, into
SQL; each max-rate search becomes a stage of its own whose metrics are `max_rate`, what
its confirming hold measured of the broker (`AT_CAPACITY`, `cpu_at_capacity`) and the
host's steal over the search (`search_steal`)."""

from __future__ import annotations

import json
from collections.abc import Callable

from .. import rundir
from ..analysis.capacity import broker_cores, cpu_used_pct
from ..analysis.validity import judge, stage_notes
from ..brokers import ADAPTERS
from ..catalog.cpus import parse
from ..catalog.placement import recorded_params
from ..catalog.stages import probe_id
from ..metrics import HOST_STEAL
from ..run_context import RunContext
from . import Call
from .provision import host_cpus, run_fingerprint, usable_cpus


def stage_key(broker_kind: str, stage_id: str) -> str:
    """What a stage is compared by across runs: the broker kind and the stage id."""
    return f"{broker_kind}|{stage_id}"


def drivers_failed(ctx: RunContext, stage_id: str) -> list[str]:
    """The stage's driver processes that died ('driver localhost/0 died (signal 9, SIGKILL)'),
    as the stages step recorded them."""
    path = ctx.run_dir / rundir.drivers_failed_file(stage_id)
    return json.loads(path.read_text())["failures"] if path.exists() else []


def broker_gone(ctx: RunContext) -> dict | None:
    """{reason, stage_id, skipped} when the broker died mid-run (the stages step)."""
    path = ctx.run_dir / rundir.BROKER_GONE
    return json.loads(path.read_text()) if path.exists() else None


def stage_failures(ctx: RunContext) -> dict[str, list[str]]:
    """stage id -> what broke in it that fails the run: driver processes that died
    (`drivers_failed`), the broker gone (`broker_gone`)."""
    pattern = rundir.drivers_failed_file("*")
    failures = {path.parent.name: json.loads(path.read_text())["failures"]
                for path in sorted(ctx.run_dir.glob(pattern))}
    gone = broker_gone(ctx)
    if gone:
        failures.setdefault(gone["stage_id"], []).append(
            f"{gone['reason']}; {len(gone['skipped'])} stages left skipped")
    return failures


def stop_reason(ctx: RunContext, stage_id: str) -> tuple[str, bool] | None:
    """Why the stage was stopped early or never started, and whether it started, if it
    was stopped (``failfast.json``, written by the stages step)."""
    path = ctx.run_dir / rundir.failfast_file(stage_id)
    if not path.exists():
        return None
    stopped = json.loads(path.read_text())
    return stopped["reason"], stopped.get("started", True)


def load_results(ctx: RunContext, say: Callable[[str], None] = print) -> list[dict]:
    """Record every stage's metrics and validity in the store, and only those: a stage an
    earlier attempt of the stages step loaded and this one did not run is dropped, so no
    value of a discarded attempt is judged or fed to a baseline. Returns one row per stage."""
    document = json.loads((ctx.run_dir / rundir.STAGE_METRICS).read_text())
    stages = {stage.stage_id: stage for stage in ctx.measured_stages}
    fingerprint = run_fingerprint(ctx)
    broker_kind = ctx.inventory.broker.kind
    cpus = usable_cpus(ctx)
    store = ctx.store()
    dropped = store.keep_stages(ctx.run_id, {r["stage_id"] for r in document["stages"]}
                                | set(ctx.searches()["outcomes"]))
    if dropped:
        say(f"dropped {len(dropped)} stages an earlier attempt loaded and this one did not "
            f"run: {', '.join(dropped)}")
    rows = []
    for result in document["stages"]:
        stage = stages[result["stage_id"]]
        validity, reasons = judge(result["metrics"], qos=stage.qos, series=result.get("series"),
                                  aggregation_status=result["status"], problems=result["problems"])
        if stopped := stop_reason(ctx, stage.stage_id):
            validity = "invalid"
            why, started = stopped
            # refused at the barrier, it ran no window: what the gates say of one (no
            # traffic, no rate to check) would only repeat that
            reasons = [f"stopped early: {why}", *reasons] if started else [f"not started: {why}"]
        failed = drivers_failed(ctx, stage.stage_id)
        if failed:
            validity = "invalid"
            reasons[:0] = failed
        store.record_stage(ctx.run_id, stage.stage_id, scenario=stage.scenario,
                           stage_key=stage_key(broker_kind, stage.stage_id),
                           params=recorded_params(stage, ctx.inventory, cpus),
                           fingerprint_hash=fingerprint)
        store.record_results(ctx.run_id, stage.stage_id, metrics=result["metrics"],
                             series=result.get("series", {}), validity=validity,
                             reason="; ".join(reasons) or None,
                             notes=stage_notes(result["status"], result["problems"]))
        rows.append({"stage_id": stage.stage_id, "validity": validity, "reasons": reasons})
    results = {r["stage_id"]: r for r in document["stages"]}
    judged = {row["stage_id"]: row for row in rows}
    return rows + record_searches(ctx, store, fingerprint, results, judged, cpus,
                                  host_cpus(ctx))


# What a search stage records of its hold, beside max_rate: the broker's cost at capacity
# (and, from `cpu_at_capacity`, the CPU it and its host used of what they have).
AT_CAPACITY = ("broker_cpu_avg", "broker_cpu_s_per_10k", "broker_rss_avg",
               "broker_rss_per_1k_conn")


def search_steal(template_id: str, outcome: dict, results: dict[str, dict]) -> float | None:
    """The host's steal over a search (`HOST_STEAL`, which gates its max_rate and cost:
    `tasks.analysis.host_gates`): the most seen by the probes and holds that could have
    set its answer, as `RateSearch.outcome` lists them (`outcome`): those that fell behind
    (a probe the hypervisor starved at the true capacity sends the search lower, a hold
    it sank steps the answer down) and the hold that confirmed it, whose cost is the
    search's. Steal over a probe that kept up changed no answer: the broker kept up
    anyway; nor over one set aside and run again (`retried`), whose rerun counted. The
    most, not a mean, which would hide one such probe. None where none of them has the
    figure."""
    deciding = [probe_id(template_id, number, hold=hold)
                for hold, listed in ((False, outcome.get("probes", [])),
                                     (True, outcome.get("holds", [])))
                for number, ran in enumerate(listed, 1)
                if not ran["kept_up"] and not ran.get("retried")]
    if held := confirming_hold(template_id, outcome):
        deciding.append(held)
    stolen = [value for stage_id in deciding
              if (value := results.get(stage_id, {}).get("metrics", {}).get(HOST_STEAL))
              is not None]
    return max(stolen, default=None)


def cpu_at_capacity(at_capacity: dict, broker_kind: str, host_cores: int | None,
                    kept_on: str | None = None, may_use: int | None = None) -> dict:
    """The broker's and its host's CPU over a search's confirming hold (`at_capacity`: the
    hold's metrics), each as % of the cores it can use (`tasks.analysis.capacity`; the
    broker's within the CPUs it was `kept_on`, `broker.cpus`, or the `may_use` CPUs it
    started with, else its host's): `broker_cpu_used_pct` and `host_cpu_used_pct`, None
    where not known."""
    cores = broker_cores(ADAPTERS[broker_kind].cores, may_use or host_cores,
                         len(parse(kept_on)) if kept_on else None)
    return {"broker_cpu_used_pct": cpu_used_pct(at_capacity.get("broker_cpu_avg"), cores),
            "host_cpu_used_pct": cpu_used_pct(at_capacity.get("host_cpu_avg"), host_cores)}


def confirming_hold(template_id: str, outcome: dict) -> str | None:
    """The stage id of the hold that confirmed a search's max rate (`outcome`, as
    `RateSearch.outcome` gives it): its first hold that kept up; None without one."""
    return next((probe_id(template_id, number, hold=True)
                 for number, hold in enumerate(outcome.get("holds", []), 1) if hold["kept_up"]),
                None)


def vouching_stage(template_id: str, outcome: dict) -> str | None:
    """The stage whose run vouches for a search's max rate: the hold that confirmed it,
    or, in a search without holds, the probe that found it (the highest that kept up and
    counted); None without one."""
    if outcome.get("hold_s"):
        return confirming_hold(template_id, outcome)
    best = [(p["rate"], number) for number, p in enumerate(outcome.get("probes", []), 1)
            if p["kept_up"] and not p.get("retried")]
    return probe_id(template_id, max(best)[1]) if best else None


def record_searches(ctx: RunContext, store, fingerprint: str, results: dict[str, dict],
                    judged: dict[str, dict], cpus: dict[str, int],
                    cores: dict[str, int]) -> list[dict]:
    """Each max-rate search as a stage of its own whose metrics are `max_rate`, the
    broker's cost during the hold that confirmed it and the CPU it and its host used there
    (`results`: the job's stage results by id; `judged`: each stage's validity and reasons,
    as `load_results` recorded them; `cpus`: host -> the CPUs perfpipe may use there,
    `provision.usable_cpus`; `cores`: host -> its cores, `provision.host_cpus`): valid
    only when the search converged and the stage that vouches for its answer
    (`vouching_stage`: the hold that confirmed it, or without holds the best probe) passed
    the validity gates (a hold keeps up on what it sent and received, on its throughput's stability
    and on its QoS's promise; one aggregated in part, or failing a gate the search does
    not judge, would vouch for a rate and a cost it did not show). Its probes are stages
    too, never compared."""
    templates = {stage.stage_id: stage for stage in ctx.stages if stage.search is not None}
    broker, record = ctx.inventory.broker, ctx.searches()
    host_cores = cores.get(broker.host) if broker.host else None
    # a broker perfpipe started inherited the CPUs perfpipe's processes may use there (a
    # cpuset can leave fewer than the host's cores); one it found running, not known
    may_use = cpus.get(broker.host) if broker.host and broker.managed else None
    rows = []
    for template_id, outcome in sorted(record["outcomes"].items()):
        template = templates[template_id]
        # where the stages step kept the broker through the search (read back); a run
        # folder from before it said so kept it there for every stage, or nowhere
        kept_on = record.get("broker_cpus", {}).get(template_id, ctx.broker().get("cpus"))
        store.record_stage(ctx.run_id, template_id, scenario=template.scenario,
                           stage_key=stage_key(ctx.inventory.broker.kind, template_id),
                           params={**recorded_params(template, ctx.inventory, cpus),
                                   "search_outcome": outcome},
                           fingerprint_hash=fingerprint)
        validity = "valid" if outcome["converged"] else "invalid"
        reason = outcome["reason"]
        held = confirming_hold(template_id, outcome)
        vouching = vouching_stage(template_id, outcome)
        if validity == "valid" and vouching and \
                judged.get(vouching, {}).get("validity") != "valid":
            validity = "invalid"
            why = ("; ".join(judged[vouching]["reasons"]) if vouching in judged
                   else "it has no stage results")
            reason = (f"the {'hold' if held else 'probe'} that confirmed "
                      f"{outcome['max_rate']:.0f} msg/s ({vouching}) is invalid: {why}")
        at_capacity = results.get(held, {}).get("metrics", {}) if held else {}
        metrics = {"max_rate": outcome["max_rate"],
                   **{name: at_capacity.get(name) for name in AT_CAPACITY},
                   **cpu_at_capacity(at_capacity, broker.kind, host_cores, kept_on, may_use),
                   HOST_STEAL: search_steal(template_id, outcome, results)}
        store.record_results(ctx.run_id, template_id, metrics=metrics, series={},
                             validity=validity, reason=reason)
        rows.append({"stage_id": template_id, "validity": validity,
                     "reasons": [reason] if reason else []})
    return rows


def run(ctx: RunContext, call: Call) -> dict:
    rows = load_results(ctx, call.say)
    return {"stages": len(rows), "invalid": [r["stage_id"] for r in rows if r["validity"] != "valid"]}
