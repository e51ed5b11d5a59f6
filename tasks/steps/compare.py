"""Step compare: judge every stage of a run, record the verdicts, keep alerts in step.

The I/O around `tasks.analysis.detector` (pure): per stage it reads the comparable history
(same stage key, fingerprint and setup, since the last accepted change, flagged values held
out), the previous night's verdicts (which tonight confirms or clears) and, for a release run,
the pinned release baseline; it hands each stage the histories of the run's other stages
on its fingerprint, whose noise the detector pools, and judges the broker's own figures
across those stages too (`tasks.analysis.across`); then records the verdicts and opens,
updates or closes one alert per stage key and metric. Only alerts that are new or changed
are undelivered afterwards, so the alert step never re-posts the same regression.

A run is compared with a pinned release baseline when its trigger chose one (plan.json
options.baseline: "rolling" or a release label; a release run that did not say takes the
baseline pinned most recently when it started). Those verdicts' alerts live under
`<stage key> vs release <label>`, apart from the nightly lifecycle. Release runs never feed
a rolling history.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sql import Store
from sql.alerts import alert_key
from sql.histories import History

from .. import rundir
from ..analysis.across import judge_stages
from ..analysis.detector import Verdict, compare_stage
from ..analysis.noise import pooled_noise
from ..analysis.policy import Policy
from ..catalog.stages import is_probe
from ..fingerprint import setup_changes
from ..metrics import against_release
from ..run_context import RunContext
from . import Call


def release_stages(store: Store, run: dict, plan: dict) -> tuple[str, str | None, dict[str, dict]] | None:
    """(label, run id or None when not pinned, stage key -> stage) of the release baseline
    this run is compared with, or None for the rolling history. The trigger chooses: the
    plan's options.baseline ("rolling" or a release label); a release run whose plan does
    not say takes the baseline pinned most recently when it started."""
    choice = (plan.get("options") or {}).get("baseline")
    if choice == "rolling" or (choice is None and run["kind"] != "release"):
        return None
    chosen = (choice, store.release_baseline(choice, run["broker_kind"])) if choice \
        else store.release_baseline_for(run["run_id"])
    if chosen is None:
        return None
    label, base_run = chosen
    return label, base_run, {s["stage_key"]: s for s in store.stages(base_run)} if base_run else {}


def setup_history(store: Store, run_id: str, stage: dict, nights: int
                  ) -> tuple[list[dict], list[str]]:
    """A stage's comparable earlier nights, newest first: the same stage key and
    fingerprint, since the last accepted change, that measured tonight's setup
    (`tasks.fingerprint.measured_alike`: clients, rates, payloads, topics, QoS, windows,
    connection and search settings, driver processes), up to `nights` of them; nights of
    another setup are a history of their own beside it. When there is none, what differs
    from the newest night of another setup ([] when there is none either)."""
    key, fp, params = stage["stage_key"], stage["fingerprint_hash"], stage.get("params") or {}
    history = store.history(key, fp, before_run=run_id, limit=nights, setup=params)
    if history:
        return history, []
    newest = store.history(key, fp, before_run=run_id, limit=1)
    return [], setup_changes(newest[0]["params"] or {}, params) if newest else []


def stage_inputs(store: Store, run_id: str, stage: dict, policy: Policy,
                 release: tuple[str, str | None, dict[str, dict]] | None) -> dict[str, Any]:
    """What the detector needs of one stage besides its own metrics: its comparable
    history, the previous verdicts, the pinned release stage and why a history is empty."""
    key, fp, params = stage["stage_key"], stage["fingerprint_hash"], stage.get("params") or {}
    history, changes = setup_history(store, run_id, stage, policy.history_nights)
    new_history = None
    if not history and changes:
        new_history = f"setup changed ({'; '.join(changes)}): a new history starts here"
    elif not history:
        last = store.last_fingerprint(key, before_run=run_id)
        if last is not None and last != fp:
            new_history = (f"fingerprint changed ({last} -> {fp}): its hosts, tuning, broker "
                           f"kind, the broker's CPUs or perfpipe's measurement version "
                           f"differ; a new history starts here")
    pinned = release_problem = None
    if release is not None:
        label, base_run, stages = release
        base = stages.get(key)
        differs = base and setup_changes(base.get("params") or {}, params)
        if base is not None and base["validity"] != "valid":
            release_problem = (f"invalid in release {label}'s run {base_run} "
                               f"({base.get('reason') or base['validity']}): no reference")
        elif differs:
            release_problem = f"setup differs from release {label}'s ({'; '.join(differs)})"
        elif base is not None:
            pinned = {"label": label, "run_id": base_run, "metrics": base["metrics"],
                      "fingerprint_matches": base["fingerprint_hash"] == fp}
    baseline = against_release(release[0]) if release else "rolling"
    # a verdict of another setup's history is not tonight's to confirm
    previous = store.previous_verdicts(key, fp, before_run=run_id, baseline=baseline,
                                       setup=params)
    noise_history = history
    if release is not None and pinned is None:
        history, new_history = [], release_problem or (
            f"stage not in the release baseline run {release[1]}" if release[1]
            else f"release {release[0]} is not pinned")
    return {"history": history, "previous": previous, "release": pinned,
            "new_history": new_history, "noise_history": noise_history,
            # a release run judged against the rolling history feeds none: its alerts are
            # apart from the nightlies' (`sql.histories`)
            "judged_on": History(key, fp, params, release_runs=None if release else
                                 store.run(run_id)["kind"] == "release")}


def judge_run(stages: list[dict], inputs: dict[str, dict[str, Any]], policy: Policy,
              run_id: str) -> list[Verdict]:
    """Every stage's verdicts, each stage's noise pooled with the other stages of the run
    on its fingerprint, and the broker's own figures judged across those stages too
    (`tasks.analysis.across`)."""
    def judge(i: int, own: Policy) -> list[Verdict]:
        stage = stages[i]
        given = inputs[stage["stage_id"]]
        others = [inputs[s["stage_id"]]["noise_history"] for s in stages
                  if s["stage_id"] != stage["stage_id"]
                  and s["fingerprint_hash"] == stage["fingerprint_hash"]]
        return compare_stage(stage["stage_id"], stage["metrics"], stage["validity"],
                             given["history"], own, previous=given["previous"],
                             release=given["release"], run_id=run_id,
                             new_history=given["new_history"],
                             peers=pooled_noise(others, policy))

    judged = judge_stages(judge, [s["fingerprint_hash"] for s in stages],
                          [inputs[s["stage_id"]]["previous"] for s in stages], policy, run_id)
    return [v for verdicts in judged for v in verdicts]


def record_verdicts(store: Store, run_id: str, rows: list[dict[str, Any]],
                    stage_keys: dict[str, str], inputs: dict[str, dict[str, Any]] | None = None
                    ) -> list[int]:
    """Record a run's verdicts and keep the alert of each stage key and metric in this
    history in step with them (an alert of another setup's or host fingerprint's history is
    left for its own nights or a person; a change tonight opens one of its own);
    returns the ids of the alerts that are new or changed (undelivered again)."""
    store.record_comparisons(run_id, rows)
    changed = []
    for v in rows:
        key, given = stage_keys[v["stage_id"]], (inputs or {}).get(v["stage_id"])
        followed = store.follow_verdict(stage_key=alert_key(key, v["detail"]),
                                        metric=v["metric"], run_id=run_id, verdict=v["verdict"],
                                        change_pct=v["change_pct"],
                                        # none given: every open alert is tonight's
                                        judged_on=given and given["judged_on"])
        if followed is not None and followed[1]:
            changed.append(followed[0])
    return changed


def compare_stored(store: Store, run_id: str, plan: dict,
                   policy: Policy = Policy()) -> dict[str, Any]:
    """Judge a stored run's stages and record the verdicts and alerts: {"verdicts": rows,
    "changed_alerts": alert ids, "release_baseline": (label, run id) or None}."""
    release = release_stages(store, store.run(run_id), plan)
    # a search probe's rate depends on the night: its search is compared, not the probes
    stages = [s for s in store.stages(run_id) if not is_probe(s)]
    keys = {s["stage_id"]: s["stage_key"] for s in stages}
    inputs = {s["stage_id"]: stage_inputs(store, run_id, s, policy, release) for s in stages}
    rows = [v.to_dict() for v in judge_run(stages, inputs, policy, run_id)]
    changed = record_verdicts(store, run_id, rows, keys, inputs)
    return {"verdicts": rows, "changed_alerts": changed,
            "release_baseline": release[:2] if release else None}


def run(ctx: RunContext, call: Call, policy: Policy = Policy()) -> dict[str, Any]:
    judged = compare_stored(ctx.store(), ctx.run_id, ctx.plan, policy)
    ctx.write_json(rundir.VERDICTS, judged)
    return {**Counter(v["verdict"] for v in judged["verdicts"]),
            "changed_alerts": len(judged["changed_alerts"])}
