"""`perfpipe baseline ...` and `perfpipe alerts ...` against the SQLite store of the state dir."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from sql import Store
from tasks.cli import main
from tasks.settings import load_settings

T0 = datetime.now(timezone.utc) - timedelta(days=10)


@pytest.fixture
def store(perfpipe_env: Path) -> Store:
    s = Store(load_settings().database_url())
    s.migrate()
    for day, status in ((1, "ok"), (2, "failed"), (3, "ok")):
        s.create_run(f"r{day}", kind="nightly", suite="smoke", broker_kind="mosquitto",
                     artifact_dir="/x", started_at=T0 + timedelta(days=day))
        s.finish_run(f"r{day}", status)
    return s


def test_promote_pins_an_ok_run_and_refuses_a_failed_one(store: Store, capsys) -> None:
    assert main(["baseline", "promote", "r1", "--label", "9.4.5"]) == 0
    assert store.release_baseline("9.4.5", "mosquitto") == "r1"
    assert main(["baseline", "promote", "r2", "--label", "9.4.6"]) == 2
    assert "is failed" in capsys.readouterr().err
    assert main(["baseline", "promote", "nope", "--label", "9.4.6"]) == 2
    assert "unknown run 'nope'" in capsys.readouterr().err
    assert main(["baseline", "list"]) == 0
    out = capsys.readouterr().out
    assert "9.4.5" in out and "r1" in out and "9.4.6" not in out
    # "rolling" names the earlier nights' baseline: a release so named could never be chosen
    for label in ("rolling", "9.4 final", "9.4.5\n"):
        assert main(["baseline", "promote", "r3", "--label", label]) == 2
        assert f"label {label!r}: a release label" in capsys.readouterr().err
    # pinned again: the label moves, and says from which run
    assert main(["baseline", "promote", "r3", "--label", "9.4.5"]) == 0
    assert "release baseline 9.4.5: run r3 (was run r1: verdicts and alerts against 9.4.5 " \
        "so far were judged on that run)" in capsys.readouterr().out
    assert store.release_baseline("9.4.5", "mosquitto") == "r3"


def test_alerts_list_ack_false_positive_and_fixed(store: Store, capsys) -> None:
    key = dict(stage_key="mosquitto|fanin.q1", metric="delivered_rate")
    a1, _ = store.follow_verdict(**key, run_id="r1", verdict="suspected", change_pct=-6.0)
    store.follow_verdict(**key, run_id="r3", verdict="regression", change_pct=-6.2)
    a2, _ = store.follow_verdict(stage_key="k2", metric="e2e_latency_p99", run_id="r3",
                                 verdict="suspected", change_pct=12.0)
    assert main(["alerts", "list"]) == 0
    out = capsys.readouterr().out
    assert "confirmed" in out and "mosquitto|fanin.q1" in out and "suspected" in out
    assert main(["alerts", "ack", str(a1)]) == 0
    assert "acknowledged" in capsys.readouterr().out
    # acked: the same regression the next night stays acked and is not news
    assert store.follow_verdict(**key, run_id="r3", verdict="regression", change_pct=-6.1) \
        == (a1, False)
    assert main(["alerts", "false-positive", str(a2)]) == 0
    assert main(["alerts", "fixed", str(a1)]) == 0
    capsys.readouterr()
    assert main(["alerts", "list"]) == 0
    assert capsys.readouterr().out.strip() == "no open alerts"
    assert main(["alerts", "list", "--all"]) == 0
    out = capsys.readouterr().out
    assert "false_positive" in out and "fixed" in out
    assert main(["alerts", "accept", "999"]) == 2
    assert "unknown alert 999" in capsys.readouterr().err
    assert main(["alerts", "ack", str(a1)]) == 2  # closed: not opened again by hand
    assert f"alert {a1} is closed (fixed)" in capsys.readouterr().err


def test_accepting_an_alert_against_a_release_says_the_release_stays_the_baseline(
        store: Store, capsys) -> None:
    a, _ = store.follow_verdict(stage_key="mosquitto|fanin.q1 vs release 9.4.5",
                                metric="delivered_rate", run_id="r3", verdict="suspected",
                                change_pct=-6.0)
    assert main(["alerts", "accept", str(a)]) == 0
    out = capsys.readouterr().out
    assert "release runs are still compared with release 9.4.5's run" in out
    assert "restarts" not in out


def test_accepting_an_alert_a_release_run_opened_says_no_history_restarts(
        store: Store, capsys) -> None:
    """A release run judged against the rolling history (no release pinned yet) feeds none:
    accepting its alert restarts no history, and says so."""
    store.create_run("rel", kind="release", suite="smoke", broker_kind="mosquitto",
                     artifact_dir="/x", started_at=T0 + timedelta(days=4))
    store.finish_run("rel", "ok")
    a, _ = store.follow_verdict(stage_key="mosquitto|fanin.q1", metric="delivered_rate",
                                run_id="rel", verdict="suspected", change_pct=-6.0)
    n, _ = store.follow_verdict(stage_key="mosquitto|fanin.q2", metric="delivered_rate",
                                run_id="r3", verdict="suspected", change_pct=-6.0)
    assert main(["alerts", "accept", str(a)]) == 0
    out = capsys.readouterr().out
    assert "opened by release run rel, which feeds no rolling history: none restarts" in out
    assert main(["alerts", "accept", str(n)]) == 0
    assert "delivered_rate's rolling history of mosquitto|fanin.q2 restarts at run r3" in \
        capsys.readouterr().out


def test_a_release_trigger_naming_a_baseline_not_pinned_for_its_broker_is_refused_at_plan(
        store: Store) -> None:
    """Before any load: every stage would otherwise be compared with nothing, hours later."""
    from tasks.catalog.scenarios import ConfigError
    from tasks.steps.plan import plan_run

    assert main(["baseline", "promote", "r1", "--label", "9.4.5"]) == 0
    store.create_run("e1", kind="release", suite="smoke", broker_kind="emqx",
                     artifact_dir="/x", started_at=T0)
    store.finish_run("e1", "ok")
    assert main(["baseline", "promote", "e1", "--label", "emqx-5.8"]) == 0
    runs = load_settings().runs_dir
    before = sorted(runs.iterdir()) if runs.exists() else []
    for label in ("9.4.55", "emqx-5.8"):  # a typo; another broker's release
        with pytest.raises(ConfigError) as err:
            plan_run(kind="release", options={"baseline": label})
        assert str(err.value) == (
            f"baseline (--baseline of perfpipe run): no release '{label}' is pinned for "
            f"mosquitto (pinned: '9.4.5'); give "
            f"'rolling' or one of those, or pin a run first: perfpipe baseline promote "
            f"RUN_ID --label {label}")
    assert (sorted(runs.iterdir()) if runs.exists() else []) == before
    assert {r["run_id"] for r in store.latest_runs()} == {"r1", "r2", "r3", "e1"}
    for choice in ("9.4.5", "rolling", None):
        assert store.run(plan_run(kind="release", options={"baseline": choice}))


@pytest.mark.alone
@pytest.mark.slow  # about 40 s: four runs of one stage
def test_a_release_run_from_the_command_line_pins_itself_and_a_later_run_is_compared_with_it(
        tmp_path: Path, tiny_suite: Path, broker, spark_connect, capsys) -> None:
    """`perfpipe run --kind release --release-label L --promote` does what the release DAG's
    trigger does: the run is stored under its label and pinned once it ends ok (a run that
    failed is not, and says so); a later run given `--baseline L` or `rolling` is judged
    against that. A choice only a release run takes, on another run, or one that cannot
    apply, is refused before anything runs, naming the option and the fix."""
    (tiny_suite.parent / "scenarios" / "suites.yml").write_text(
        "suites: {tiny0: [{scenario: tiny_fanin, qos: [0]}]}\n")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("hosts: [{name: localhost, transport: local, roles: [driver]}]\n"
                         "broker: {kind: mosquitto, host: localhost, managed: false, address: "
                         f"127.0.0.1, port: {broker.port}}}\n")
    given = ["run", "--suite", "tiny0", "--inventory", str(inventory)]
    release = ["--kind", "release"]
    refused = {("--promote",): "--promote: only a release run takes it; add --kind release",
               ("--baseline", "9.4.5"): "--baseline: only a release run takes it",
               ("--release-label", "9.4.5"): "--release-label: only a release run takes it",
               (*release, "--promote"): "--kind release: a release run is named by the "
               "release it measures; add --release-label LABEL",
               tuple(release): "add --release-label LABEL",
               (*release, "--release-label", "rolling"): "--release-label 'rolling': give a "
               "release such as 9.4.5"}
    for options, said in refused.items():
        assert main(given + list(options)) == 2, options
        assert said in capsys.readouterr().err, options
    store = Store(load_settings().database_url())
    store.migrate()
    assert store.latest_runs(5) == []  # nothing planned
    assert main(given + [*release, "--release-label", "9.4.5", "--promote"]) == 0
    assert "release baseline 9.4.5: run release-" in capsys.readouterr().out
    (pinned,) = store.latest_runs(5)
    assert (pinned["kind"], pinned["release_label"], pinned["status"]) == \
        ("release", "9.4.5", "ok")
    assert store.release_baseline("9.4.5", "mosquitto") == pinned["run_id"]
    # a run that fails (the broker is not the version asked for) is not pinned, and says so
    assert main(given + [*release, "--release-label", "9.4.6", "--promote",
                         "--broker-version", "0.0.0"]) == 1
    said = capsys.readouterr().out
    assert "not promoted: run release-" in said
    # the error names the option that asked, as the release DAG's Param and the CLI spell it
    assert ("but the run asked for 0.0.0 (fix the host's broker, or broker_version "
            "(--broker-version of perfpipe run))") in said
    assert store.release_baseline("9.4.6", "mosquitto") is None
    # the trigger's baseline: a pinned label, 'rolling' (which a release run has none of)
    for baseline, judged in (("9.4.5", "release:9.4.5"), ("rolling", "rolling")):
        assert main(given + [*release, "--release-label", "9.4.7", "--baseline", baseline]) == 0
        (stage,) = store.stages(store.latest_runs(1)[0]["run_id"])
        assert {c["detail"]["baseline"] for c in stage["comparisons"]} == {judged}, baseline
    # a baseline never pinned: refused at plan
    assert main(given + [*release, "--release-label", "9.4.8", "--baseline", "9.9.9"]) == 2
    assert "--baseline of perfpipe run): no release '9.9.9' is pinned" in capsys.readouterr().err
