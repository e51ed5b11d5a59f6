"""Slack delivery against a local server that speaks the Slack Web API (tests/slack_server.py):
the exact requests for a known set of verdicts, threading, quiet nights, 429 retries, kept
alerts, release summaries, mostly-invalid runs, the nightly watchdog, the Airflow
Connection, and a token that never reaches a log or a file."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from sql import Store, StoreUnavailable
from tasks.notify.slack import SlackError, SlackNotifier, notifier_for, token_client
from tasks.notify.watchdog import check_nightly
from tasks.settings import load_settings
from tasks.steps.alert import deliver, links_for
from tasks.steps.compare import record_verdicts
from tests import slack_server
from tests.sqlite_lock import start_holding

TOKEN = "xoxb-perfpipe-test-0123456789-SECRET"
T0 = datetime.now(timezone.utc) - timedelta(days=20)
FANIN = {"qos": 1, "groups": [{"group": "pub", "role": "pub", "count": 100, "rate_per_client": 10},
                              {"group": "sub", "role": "sub", "count": 1, "rate_per_client": 0}]}


class Nights:
    """Runs with known verdicts in a real SQLite store, and the alert step after each."""

    def __init__(self, state: Path, slack: slack_server.FakeSlack) -> None:
        self.settings = load_settings()
        self.store = Store(self.settings.database_url())
        self.store.migrate()
        self.slack = slack
        self.day = 0

    def notifier(self) -> SlackNotifier:
        return SlackNotifier(token_client(TOKEN, self.slack.base_url), "#perf")

    def run(self, verdicts: dict[str, list[tuple]], *, kind: str = "nightly",
            invalid: dict[str, str] | None = None, label: str | None = None,
            metrics: dict[str, dict] | None = None, params: dict[str, dict] | None = None
            ) -> str:
        """verdicts: stage id -> [(metric, verdict, baseline, value, nights[, detail])];
        metrics: stage id -> the metrics stored for it (none by default); params: stage id
        -> its recorded params (FANIN by default)."""
        self.day += 1
        run_id = f"{kind}-{self.day:02d}"
        self.store.create_run(run_id, kind=kind, suite="smoke", broker_kind="mosquitto",
                              broker_version="2.0.11", artifact_dir="/x", release_label=label,
                              started_at=T0 + timedelta(days=self.day))
        rows, keys = [], {}
        for stage_id in sorted({*verdicts, *(invalid or {})}):
            keys[stage_id] = f"mosquitto|{stage_id}"
            self.store.record_stage(run_id, stage_id, scenario="ibm_fanin", stage_key=keys[stage_id],
                                    params=(params or {}).get(stage_id, FANIN),
                                    fingerprint_hash="fp0123")
            reason = (invalid or {}).get(stage_id)
            self.store.record_results(run_id, stage_id, series={},
                                      metrics=(metrics or {}).get(stage_id, {}),
                                      validity="invalid" if reason else "valid", reason=reason)
            for metric, verdict, base, value, nights, *more in verdicts.get(stage_id, []):
                rows.append({"stage_id": stage_id, "metric": metric, "verdict": verdict,
                             "baseline_value": base, "value": value,
                             "change_pct": round(100 * (value / base - 1), 3),
                             "confidence": 0.999, "detail": {"nights": nights, **(more or [{}])[0]}})
        record_verdicts(self.store, run_id, rows, keys)
        self.store.finish_run(run_id, "ok")
        return run_id

    def alert(self, run_id: str, notifier: SlackNotifier | None = None) -> dict:
        run_dir = self.settings.run_dir(run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        links = links_for(self.settings, self.store.run(run_id), str(run_dir / "report.html"))
        return deliver(self.store, run_id, notifier or self.notifier(), links, run_dir)


@pytest.fixture
def nights(perfpipe_env: Path, slack, monkeypatch) -> Nights:
    monkeypatch.setenv("PERFPIPE_REPORT_BASE_URL", "https://perf.example/runs")
    return Nights(perfpipe_env, slack)


RATE_DROP = ("delivered_rate", "regression", 2000.0, 1600.0, 1)


def blocks_text(call) -> str:
    return json.dumps(json.loads(call.body["blocks"]) if isinstance(call.body["blocks"], str)
                      else call.body["blocks"], ensure_ascii=False)


def test_a_confirmed_regression_is_posted_with_its_evidence(nights: Nights) -> None:
    run_id = nights.run({"fanin.q1.c100": [RATE_DROP,
                                           ("e2e_latency_p99", "suspected", 1200.0, 1500.0, 1)],
                         "fanin.q1.c200": [("delivered_rate", "unchanged", 2000.0, 1998.0, 1)]})
    outcome = nights.alert(run_id)
    assert (outcome["posted"], outcome["alerts_told"], outcome["kept"]) == (True, 1, 0)
    (post,) = nights.slack.calls
    assert post.method == "chat.postMessage" and post.body["channel"] == "#perf"
    assert "thread_ts" not in post.body
    assert post.headers["Authorization"] == f"Bearer {TOKEN}"
    blocks = json.loads(blocks_text(post))
    assert blocks[0]["text"]["text"] == (f"perfpipe nightly run {run_id}: 1 regression(s) "
                                         "(mosquitto 2.0.11, suite smoke)")
    assert blocks[1]["text"]["text"] == "verdicts: 1 regression, 1 suspected, 1 unchanged"
    assert blocks[2]["text"]["text"] == (
        "*ibm_fanin*\nfanin.q1.c100 (100 pubs, 1 subs, QoS 1, 1,000 msg/s)\n"
        "• `delivered_rate` 2,000 msg/s → *1,600 msg/s* (-20.0%) · confidence 99.9% · "
        "1 night · confirmed")
    context = [e["text"] for e in blocks[3]["elements"]]
    assert context == [f"<https://perf.example/runs/{run_id}/report.html|report>",
                       "fingerprint fp0123"]
    # the suspicion is not posted, and not re-posted later either
    assert {a["status"]: a["delivered"] for a in nights.store.alerts()} == \
        {"confirmed": True, "suspected": True}


def test_a_cost_judged_at_tonights_driver_cpu_says_so_beside_its_nights_as_measured(
        nights: Nights) -> None:
    """The baseline of a cost judged at its covariate is the nights moved to tonight's
    driver CPU, not their level: the row says so, and that the earlier nights are shown
    as they were measured (on a slow night the baseline sits above them)."""
    cost = "broker_cpu_s_per_10k"
    for value in (0.250, 0.260, 0.240):
        nights.run({"fanin.q1.c100": [(cost, "unchanged", 0.25, value, 1)]},
                   metrics={"fanin.q1.c100": {cost: value}})
    adjusted = {"adjusted": {"by": "driver_cpu_s_per_10k", "slope": 0.8}}
    run_id = nights.run({"fanin.q1.c100": [(cost, "regression", 0.30, 0.33, 1, adjusted)]},
                        metrics={"fanin.q1.c100": {cost: 0.33}})
    assert nights.alert(run_id)["posted"]
    row = json.loads(blocks_text(nights.slack.calls[-1]))[2]["text"]["text"].split("\n")[-1]
    assert row == ("• `broker_cpu_s_per_10k` 0.300 CPU-s (at tonight's driver_cpu_s_per_10k) → "
                   "*0.330 CPU-s* (+10.0%) · confidence 99.9% · 1 night · confirmed · "
                   "before, as measured: 0.250 CPU-s, 0.260 CPU-s, 0.240 CPU-s")
    # its recovery, told in the thread, names the same baseline
    back = nights.run({"fanin.q1.c100": [(cost, "unchanged", 0.32, 0.321, 1, adjusted)]},
                      metrics={"fanin.q1.c100": {cost: 0.321}})
    nights.alert(back)
    assert ("`broker_cpu_s_per_10k` recovered: 0.321 CPU-s against the baseline 0.320 CPU-s "
            "(at tonight's driver_cpu_s_per_10k)") in nights.slack.calls[-1].body["text"]
    # judged as measured, the same nights are just "before"
    run_id = nights.run({"fanin.q1.c200": [(cost, "regression", 0.25, 0.33, 1)]},
                        metrics={"fanin.q1.c200": {cost: 0.33}})
    nights.alert(run_id)
    assert "· before:" not in blocks_text(nights.slack.calls[-1])  # a new stage: no nights
    assert "at tonight's" not in blocks_text(nights.slack.calls[-1])


def test_a_capacity_held_with_cpu_to_spare_says_so_in_its_row(nights: Nights) -> None:
    """A capacity whose broker and host had CPU left at the rate that held was stopped by
    something else: its row says so, with both figures."""
    spare = {"cpu_to_spare": {"broker_pct": 78.4, "host_pct": 88.0}}
    drop = ("max_rate", "regression", 130_000.0, 91_600.0, 1, spare)
    run_id = nights.run({"cap.q0.search": [drop]})
    assert nights.alert(run_id)["posted"]
    row = json.loads(blocks_text(nights.slack.calls[-1]))[2]["text"]["text"].split("\n")[-1]
    assert row == ("• `max_rate` 130,000 msg/s → *91,600 msg/s* (-29.5%) · confidence 99.9% · "
                   "1 night · confirmed · CPU to spare: broker 78%, host 88%")


def test_later_nights_thread_quiet_when_unchanged_and_recovery_said(nights: Nights) -> None:
    first = nights.run({"fanin.q1.c100": [RATE_DROP]})
    nights.alert(first)
    parent_ts = nights.store.alerts()[0]["slack_ts"]
    assert parent_ts  # the ts Slack gave the first post

    same = nights.run({"fanin.q1.c100": [("delivered_rate", "regression", 2000.0, 1610.0, 2)]})
    assert nights.alert(same)["alerts_told"] == 0
    assert len(nights.slack.calls) == 1  # an unchanged alert: no message at all

    worse = nights.run({"fanin.q1.c100": [("delivered_rate", "regression", 2000.0, 1300.0, 3)]})
    outcome = nights.alert(worse)
    reply = nights.slack.calls[-1]
    assert (len(nights.slack.calls), outcome["replies"]) == (2, 1)
    assert reply.body["thread_ts"] == parent_ts
    assert "fanin.q1.c100 `delivered_rate` 2,000 msg/s → *1,300 msg/s* (-35.0%)" in reply.body["text"]

    back = nights.run({"fanin.q1.c100": [("delivered_rate", "unchanged", 2000.0, 1995.0, 1)]})
    nights.alert(back)
    recovered = nights.slack.calls[-1]
    assert len(nights.slack.calls) == 3 and recovered.body["thread_ts"] == parent_ts
    assert "fanin.q1.c100 `delivered_rate` recovered: 1,995 msg/s against the baseline " \
           "2,000 msg/s" in recovered.body["text"]
    assert [a["status"] for a in nights.store.alerts()] == ["recovered"]


def test_a_429_is_retried_after_its_retry_after(nights: Nights) -> None:
    run_id = nights.run({"fanin.q1.c100": [RATE_DROP]})
    nights.slack.fail_next(429, retry_after=1)
    outcome = nights.alert(run_id)
    posts = nights.slack.posts()
    assert len(posts) == 2 and outcome["posted"] and outcome["alerts_told"] == 1
    assert posts[0].body == posts[1].body
    assert nights.store.alerts()[0]["delivered"] is True


def test_a_retry_after_beyond_the_cap_is_not_waited_out_and_the_alert_is_kept(
        nights: Nights) -> None:
    import time

    from tasks.notify.slack import RETRY_AFTER_CAP_S

    run_id = nights.run({"fanin.q1.c100": [RATE_DROP]})
    nights.slack.fail_next(429, retry_after=3600)
    began = time.monotonic()
    outcome = nights.alert(run_id)
    assert time.monotonic() - began < RETRY_AFTER_CAP_S  # not the hour Slack asked for
    assert (outcome["posted"], outcome["kept"]) == (False, 1)
    written = json.loads((nights.settings.run_dir(run_id) / "slack_message.json").read_text())
    assert "ratelimited" in written["error"] and "HTTP 429" in written["error"]
    assert len(nights.slack.calls) == 1 and nights.store.alerts()[0]["delivered"] is False


def test_an_alert_slack_refused_is_kept_and_sent_with_the_next_run(nights: Nights) -> None:
    first = nights.run({"fanin.q1.c100": [RATE_DROP]})
    for _ in range(3):  # the first try and both server-error retries
        nights.slack.fail_next(503)
    outcome = nights.alert(first)
    assert (outcome["posted"], outcome["kept"], outcome["alerts_told"]) == (False, 1, 0)
    written = json.loads((nights.settings.run_dir(first) / "slack_message.json").read_text())
    assert "HTTP 503" in written["error"] and written["kept"] == 1
    assert nights.store.alerts()[0]["delivered"] is False

    # the next night cannot judge that stage (invalid): the kept alert still goes out
    second = nights.run({}, invalid={"fanin.q1.c100": "rate 60% of target"})
    outcome = nights.alert(second)
    assert outcome["alerts_told"] == 1 and outcome["kept"] == 0
    run_post, invalid_post = nights.slack.posts()[-2:]
    assert invalid_post.body["text"].startswith(":warning:")
    text = blocks_text(run_post)
    assert f"from run {first}, not told then" in text and "-20.0%" in text
    assert nights.store.alerts()[0]["delivered"] is True


def test_a_kept_message_cut_short_is_said_and_fails_no_later_alert_step(
        nights: Nights, capsys) -> None:
    """Fault: a run's slack_message.json cut short (a full disk under an older perfpipe,
    which wrote it in place). Every later run's alert step reads the earlier runs' files to
    send what Slack did not take: it says which one it cannot read and tells its own; the
    cut run's own step, retried, sends its summary anew and keeps it whole."""
    first = nights.run({"fanin.q1.c100": [RATE_DROP]}, kind="release", label="cut")
    for _ in range(3):  # the first try and both server-error retries
        nights.slack.fail_next(503)
    assert nights.alert(first)["error"]
    kept = nights.settings.run_dir(first) / "slack_message.json"
    kept.write_text(kept.read_text()[:40])
    before = len(nights.slack.posts())

    second = nights.run({}, kind="release", label="after")
    outcome = nights.alert(second)
    assert outcome["posted"] and outcome["error"] is None
    assert f"{kept} unreadable" in capsys.readouterr().out
    assert nights.alert(first)["error"] is None
    assert [p.body["text"].split(" run ")[0] for p in nights.slack.posts()[before:]] == [
        "perfpipe release after", "perfpipe release cut"]
    assert json.loads(kept.read_text())["run"]["ts"]  # written whole


def test_release_runs_always_post_a_summary_and_a_retried_step_updates_it(nights: Nights) -> None:
    run_id = nights.run({"fanin.q1.c100": [("delivered_rate", "unchanged", 2000.0, 2001.0, 1)]},
                        kind="release", label="2.0.12")
    first = nights.alert(run_id)
    (post,) = nights.slack.calls
    assert first["posted"] and post.body["text"] == (
        f"perfpipe release 2.0.12 run {run_id}: no regressions (mosquitto 2.0.11, suite smoke)")
    again = nights.alert(run_id)  # the Airflow task retried: the summary is updated, not reposted
    update = nights.slack.calls[-1]
    assert again["posted"] and update.method == "chat.update" and len(nights.slack.posts()) == 1
    written = json.loads((nights.settings.run_dir(run_id) / "slack_message.json").read_text())
    assert update.body["ts"] == written["ts"] and written["ts"]


def test_an_alert_step_retried_after_the_database_failed_under_it_never_posts_twice(
        nights: Nights) -> None:
    """Fault: the results file is locked by another writer while Slack answers the post,
    so the alert cannot be marked delivered and the step fails; retried once the lock is
    gone, it updates the message and the thread reply it posted instead of posting them
    again."""
    first = nights.run({"fanin.q1.c100": [RATE_DROP]})
    nights.alert(first)
    run_id = nights.run({"fanin.q1.c100": [("delivered_rate", "regression", 2000.0, 1300.0, 2)],
                         "fanin.q1.c200": [RATE_DROP]})  # a reply, and a new alert's post
    store = Store(nights.settings.database_url(), retry_s=1)
    database = make_url(nights.settings.database_url()).database
    holders: list = []

    def lock_when_slack_answers(method: str) -> None:
        if not holders:
            holders.append(start_holding(database, 30))
    nights.slack.on_call = lock_when_slack_answers
    run_dir = nights.settings.run_dir(run_id)
    run_dir.mkdir(parents=True)
    links = links_for(nights.settings, nights.store.run(run_id), "report.html")
    try:
        with pytest.raises(StoreUnavailable, match="database is locked"):
            deliver(store, run_id, nights.notifier(), links, run_dir)
    finally:
        nights.slack.on_call = None
        for holder in holders:
            holder.kill()
            holder.wait()
    told = [(c.method, c.body.get("thread_ts")) for c in nights.slack.calls[1:]]
    assert told and told[0][0] == "chat.postMessage", told

    again = deliver(store, run_id, nights.notifier(), links, run_dir)
    retried = [(c.method, c.body.get("thread_ts")) for c in nights.slack.calls[1 + len(told):]]
    assert again["posted"] and again["kept"] == 0
    assert [m for m, _ in retried] == ["chat.update"] * len(retried), retried
    assert len(nights.slack.posts()) == 3  # the first night's, tonight's and its reply
    assert all(a["delivered"] for a in nights.store.alerts())


def test_a_release_summary_says_what_each_metric_can_see_and_what_is_too_noisy(
        nights: Nights) -> None:
    noisy = "too noisy to guard: night-to-night noise 25.8% over 20 nights, so ..."
    run_id = nights.run({"fanin.q1.c100": [
        ("delivered_rate", "regression", 2000.0, 1600.0, 2, {"mde_pct": 3.2}),
        ("e2e_latency_p99_no_stall", "unchanged", 5000.0, 5100.0, 0,
         {"mde_pct": 266.0, "too_noisy": noisy})]},
        kind="release", label="2.0.12")
    nights.alert(run_id)
    (post,) = nights.slack.calls
    text = blocks_text(post)
    assert "sees steps from 3.2%" in text
    assert f"too noisy to guard (1):\\nfanin.q1.c100 `e2e_latency_p99_no_stall`: {noisy}" in text


def test_a_mostly_invalid_run_gets_its_own_short_message(nights: Nights) -> None:
    run_id = nights.run({"fanin.q1.c100": [("delivered_rate", "unchanged", 2000.0, 2001.0, 1)]},
                        invalid={"fanin.q1.c200": "errors 12", "fanin.q0.c200": "rate 70% of target"})
    nights.alert(run_id)
    (post,) = nights.slack.calls
    assert post.body["text"] == (f":warning: perfpipe nightly run {run_id}: 2 of 3 stages invalid, "
                                 "so they were not compared")
    assert "fanin.q0.c200: rate 70% of target" in blocks_text(post)


def test_a_searchs_probes_that_fell_behind_do_not_make_a_run_mostly_invalid(
        nights: Nights) -> None:
    """A max-rate search's probes fall behind wherever it passes the broker's limit (most
    of them on the night a capacity drops below where a warm start begins): the search's
    own stage speaks for it, so the run is not told as mostly invalid."""
    behind = "delivered 82.6% of the expected delivery rate (allowed 95%..105%)"
    probes = {f"cap.search.{p}": behind for p in ("p1", "p2", "p4", "h1")}
    capacity = [("max_rate", "suspected", 2000.0, 1500.0, 1)]
    probed = {p: {**FANIN, "probe_of": "cap.search"} for p in probes}
    run_id = nights.run({"cap.search": capacity, "fanin.q1.c100": []}, invalid=probes,
                        params=probed)
    nights.alert(run_id)
    assert nights.slack.calls == []  # a suspicion waits for the next night; nothing invalid
    # more than half of the other stages invalid: told, of those stages, the probes apart
    told = nights.run({"cap.search": capacity}, params=probed,
                      invalid={**probes, "fanin.q1.c100": "errors 12", "fanin.q0.c100": "errors 3"})
    nights.alert(told)
    (post,) = nights.slack.calls
    assert post.body["text"] == (f":warning: perfpipe nightly run {told}: 2 of 3 stages "
                                 "invalid, so they were not compared")
    assert "cap.search.p1" not in blocks_text(post)


def test_a_search_that_measured_no_capacity_is_told(nights: Nights) -> None:
    """A max-rate search that converged on nothing (its broker fell far below the capacity
    its warm start began from) is one invalid stage of many: told all the same, since its
    night's capacity, the figure the suite exists for, was not measured."""
    lost = "not converged after 14 probes: between 29587 and 30526 msg/s"
    search = {**FANIN, "search": {"growth": 2.0, "max_probes": 14, "hold_s": 10}}
    run_id = nights.run({"fanin.q1.c100": [("delivered_rate", "unchanged", 2000.0, 2001.0, 1)],
                         "fanin.q0.c100": [("delivered_rate", "unchanged", 2000.0, 2001.0, 1)]},
                        invalid={"cap.search": lost}, params={"cap.search": search})
    nights.alert(run_id)
    (post,) = nights.slack.calls
    assert post.body["text"] == (f":warning: perfpipe nightly run {run_id}: 1 of 3 stages "
                                 "invalid, so they were not compared")
    assert f"cap.search: {lost}" in blocks_text(post)


def test_a_release_summary_and_an_invalid_run_message_slack_refused_are_sent_by_the_next_run(
        nights: Nights) -> None:
    """Fault: Slack answers invalid_auth to a release run (its summary) and to a mostly
    invalid nightly; the next run's alert step, with Slack back, sends both, marked late,
    before its own message; the run after that sends neither again."""
    unchanged = [("delivered_rate", "unchanged", 2000.0, 2001.0, 1)]
    nights.slack.refused = "invalid_auth"
    release = nights.run({"fanin.q1.c100": unchanged}, kind="release", label="2.0.12")
    broken = nights.run({"fanin.q1.c100": unchanged},
                        invalid={"fanin.q1.c200": "errors 12", "fanin.q0.c200": "errors 3"})
    for run_id in (release, broken):
        assert nights.alert(run_id)["posted"] is False
    refused = len(nights.slack.calls)
    nights.slack.refused = None

    later = nights.run({"fanin.q1.c100": [RATE_DROP]})
    nights.alert(later)
    told = [c.body["text"] for c in nights.slack.calls[refused:]]
    assert told == [
        (f"perfpipe release 2.0.12 run {release}: no regressions (mosquitto 2.0.11, suite "
         f"smoke) (sent late: Slack did not take it when run {release} ended)"),
        (f":warning: perfpipe nightly run {broken}: 2 of 3 stages invalid, so they were not "
         f"compared (sent late: Slack did not take it when run {broken} ended)"),
        f"perfpipe nightly run {later}: 1 regression(s) (mosquitto 2.0.11, suite smoke)"], told
    kept = json.loads((nights.settings.run_dir(release) / "slack_message.json").read_text())
    assert kept["run"]["ts"] and kept["run"]["sent_late_by"] == later

    nights.alert(nights.run({"fanin.q1.c100": unchanged}))  # (the drop's recovery is told)
    again = [c.body["text"] for c in nights.slack.calls[refused + 3:]]
    assert again and not any("sent late" in text for text in again), again  # never twice


def test_a_release_summary_sent_late_tells_its_regression_once(nights: Nights) -> None:
    """Fault: Slack refuses a release run whose summary tells a confirmed regression. The
    next nightly, with Slack back, sends that summary late, and the regression is delivered
    in its thread: the nightly's own message does not tell it a second time."""
    nights.slack.refused = "invalid_auth"
    release = nights.run({"fanin.q1.c100": [RATE_DROP]}, kind="release", label="2.0.12")
    assert nights.alert(release)["posted"] is False
    refused = len(nights.slack.calls)
    nights.slack.refused = None

    later = nights.run({"fanin.q1.c200": [("delivered_rate", "unchanged", 2000.0, 2001.0, 1)]})
    told = nights.alert(later)
    (late,) = [c.body for c in nights.slack.calls[refused:]]  # the nightly has nothing new
    assert late["text"] == (f"perfpipe release 2.0.12 run {release}: 1 regression(s) (mosquitto "
                            f"2.0.11, suite smoke) (sent late: Slack did not take it when run "
                            f"{release} ended)")
    assert (told["posted"], told["alerts_told"], told["kept"]) == (False, 0, 0)
    kept = json.loads((nights.settings.run_dir(release) / "slack_message.json").read_text())
    (alert,) = nights.store.alerts()
    assert alert["delivered"] and alert["slack_ts"] == kept["run"]["ts"]


def test_an_old_message_slack_refuses_does_not_hold_back_tonights(nights: Nights) -> None:
    """Fault: an earlier release summary that Slack did not take is one Slack refuses for
    itself (a section past Block Kit's 3000 characters). Tonight's message is still sent,
    and the old one is kept in its file with the refusal, and not tried again."""
    nights.slack.refused = "invalid_auth"
    release = nights.run({"fanin.q1.c100": [("delivered_rate", "unchanged", 2000.0, 2001.0, 1)]},
                         kind="release", label="2.0.12")
    nights.alert(release)
    nights.slack.refused = None
    path = nights.settings.run_dir(release) / "slack_message.json"
    kept = json.loads(path.read_text())
    kept["run"]["blocks"].append({"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}})
    path.write_text(json.dumps(kept))
    refused = len(nights.slack.calls)

    later = nights.run({"fanin.q1.c100": [RATE_DROP]})
    told = nights.alert(later)
    assert (told["posted"], told["alerts_told"], told["error"]) == (True, 1, None)
    texts = [c.body["text"] for c in nights.slack.calls[refused:]]
    assert texts[-1] == f"perfpipe nightly run {later}: 1 regression(s) (mosquitto 2.0.11, suite smoke)"
    assert len(texts) == 2 and "sent late" in texts[0]  # tried once, refused
    kept = json.loads(path.read_text())["run"]
    assert kept["ts"] is None and "invalid_blocks" in kept["refused"]  # kept, not retried
    tried = len(nights.slack.calls)
    nights.alert(nights.run({"fanin.q1.c100": [("delivered_rate", "unchanged", 2000.0,
                                                  2001.0, 1)]}))
    assert not any("sent late" in c.body["text"] for c in nights.slack.calls[tried:])


def test_a_long_message_keeps_every_row_within_slacks_limits(nights: Nights) -> None:
    """Ten regressions of one scenario whose rows carry their nights, MDE and what the
    stages showed together are longer than one section may be: every row is told whole,
    in as many sections as they need, and Slack (which refuses a section over 3000
    characters) takes the message."""
    detail = {"mde_pct": 7.6, "across": {"stages": 10, "flagged": True, "change_pct": 6.9,
                                         "sd_pct": 1.1, "mde_pct": 4.2},
              "adjusted": {"by": "driver_cpu_s_per_10k", "slope": 0.8}}
    cost = "broker_cpu_s_per_10k"
    stages = [f"ibm_fanin_smoke.q1.c{100 + i}.r100" for i in range(10)]
    for value in (0.300, 0.310, 0.320, 0.310, 0.300):
        nights.run({s: [(cost, "unchanged", 0.31, value, 1)] for s in stages},
                   metrics={s: {cost: value} for s in stages})
    run_id = nights.run({s: [(cost, "regression", 0.31, 0.35, 2, detail)] for s in stages},
                        metrics={s: {cost: 0.35} for s in stages})
    told = nights.alert(run_id)
    assert (told["posted"], told["alerts_told"]) == (True, 10)
    blocks = json.loads(blocks_text(nights.slack.posts()[-1]))
    sections = [b["text"]["text"] for b in blocks if b["type"] == "section"]
    rows = [line for text in sections for line in text.split("\n") if line.startswith("• ")]
    assert len(rows) == 10 and len(sections) >= 4  # verdicts, together, and two or more
    assert all(row.endswith("before, as measured: 0.300 CPU-s, 0.310 CPU-s, 0.320 CPU-s, "
                            "0.310 CPU-s, 0.300 CPU-s") for row in rows), rows
    assert all(len(text) <= 3000 for text in sections)


def test_a_failure_alert_slack_refused_is_sent_by_the_next_run(nights: Nights) -> None:
    """Fault: Slack refuses a task's failure alert (the on_failure_callback's post): the file
    says so, and the next run's alert step sends it, marked late, before its own message,
    once."""
    from tasks.notify.failure import post_kept, write_message
    from tasks.notify.messages import failure_message
    from tasks.rundir import FAILURES_DIR

    unchanged = [("delivered_rate", "unchanged", 2000.0, 2001.0, 1)]
    broken = nights.run({"fanin.q1.c100": unchanged})
    message = failure_message(dag_id="mqtt_perf_nightly", task_id="run_stages", item=None,
                              error="driver exited 1", log_url=None, run_id=broken)
    path = write_message(nights.settings.run_dir(broken) / FAILURES_DIR, "run_stages", message)
    nights.slack.refused = "invalid_auth"
    with pytest.raises(SlackError, match="invalid_auth"):
        post_kept(nights.notifier(), path, message)
    assert "invalid_auth" in json.loads(path.read_text())["error"]
    nights.slack.refused, refused = None, len(nights.slack.calls)

    later = nights.run({"fanin.q1.c100": [RATE_DROP]})
    nights.alert(later)
    assert [c.body["text"] for c in nights.slack.calls[refused:]] == [
        (f"perfpipe mqtt_perf_nightly: run_stages failed: driver exited 1 (sent late: Slack "
         f"did not take it during run {broken})"),
        f"perfpipe nightly run {later}: 1 regression(s) (mosquitto 2.0.11, suite smoke)"]
    assert json.loads(path.read_text())["sent_late_by"] == later
    told = len(nights.slack.calls)
    nights.alert(nights.run({"fanin.q1.c100": unchanged}))
    assert not any("sent late" in c.body["text"] for c in nights.slack.calls[told:])


def test_the_token_never_reaches_logs_or_files(nights: Nights, caplog, capsys) -> None:
    caplog.set_level(logging.DEBUG)
    run_id = nights.run({"fanin.q1.c100": [RATE_DROP]})
    nights.slack.fail_next(429, retry_after=0)
    nights.alert(run_id)
    for _ in range(3):
        nights.slack.fail_next(500)
    nights.alert(nights.run({"fanin.q1.c100": [("delivered_rate", "regression", 2000.0, 1000.0, 2)]}))
    assert any("chat.postMessage" in r.getMessage() for r in caplog.records)  # debug logs were on
    logged = "\n".join(r.getMessage() for r in caplog.records) + "".join(capsys.readouterr())
    assert TOKEN not in logged
    for path in nights.settings.state_dir.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


def test_the_watchdog_alerts_when_no_nightly_ran(nights: Nights, monkeypatch,
                                                 capsys) -> None:
    monkeypatch.setenv("PERFPIPE_SLACK_TOKEN", TOKEN)
    monkeypatch.setenv("PERFPIPE_SLACK_BASE_URL", nights.slack.base_url)
    settings = load_settings()
    assert check_nightly(settings)["missing"] is True  # none ever
    assert nights.slack.posts()[-1].body["text"] == \
        ":warning: perfpipe: no nightly run has ever been recorded"
    run_id = nights.run({})
    now = T0 + timedelta(days=nights.day, hours=30)
    verdict = check_nightly(settings, now=now)
    assert verdict["missing"] and f"the last one, {run_id}" in verdict["text"]
    assert check_nightly(settings, now=now - timedelta(hours=8))["missing"] is False
    assert len(nights.slack.posts()) == 2
    # from the CLI, with Slack refusing: said in one line, not a traceback, and still exit 1
    from tasks.cli import main

    nights.slack.refused = "invalid_auth"
    capsys.readouterr()
    assert main(["check-nightly"]) == 1  # the one run is 19 days old
    out, err = capsys.readouterr()  # (err beside Alembic's log lines, which tests may see)
    assert f"the last one, {run_id}" in out  # what is missing, still said
    (said,) = [line for line in err.splitlines() if line.startswith("perfpipe: ")]
    assert said.startswith("perfpipe: Slack not told: ") and "invalid_auth" in said
    assert "SlackError" not in err


@pytest.mark.xdist_group("airflow-db")
def test_under_airflow_the_slack_connection_is_used(nights: Nights, monkeypatch) -> None:
    conn = {"conn_type": "slack", "password": TOKEN,
            "extra": {"base_url": nights.slack.base_url}}
    monkeypatch.setenv("AIRFLOW_CONN_PERFPIPE_SLACK", json.dumps(conn))
    notifier = notifier_for(load_settings(), airflow=True)
    assert notifier.enabled
    run_id = nights.run({"fanin.q1.c100": [RATE_DROP]})
    assert nights.alert(run_id, notifier)["posted"]
    assert nights.slack.posts()[0].headers["Authorization"] == f"Bearer {TOKEN}"
    monkeypatch.delenv("AIRFLOW_CONN_PERFPIPE_SLACK")
    assert not notifier_for(load_settings(), airflow=True).enabled  # no Connection, no token


@pytest.mark.xdist_group("airflow-db")
def test_under_airflow_a_summary_slack_refused_fails_the_alert_task_and_is_sent_later(
        tiny_suite: Path, slack, monkeypatch) -> None:
    """Fault: Slack answers invalid_auth to a release run's summary under Airflow. The alert
    task fails after keeping the summary (so the DAG run is not green, as `perfpipe run`
    exits 5), teardown closes the run with the warning, and the next run, with Slack back,
    sends the kept summary before its own."""
    from tasks.steps import Call, run_step
    from tasks.steps.plan import plan_run

    monkeypatch.setenv("AIRFLOW_CONN_PERFPIPE_SLACK", json.dumps(
        {"conn_type": "slack", "password": TOKEN, "extra": {"base_url": slack.base_url}}))
    run_id = plan_run(suite="tiny", kind="release", release_label="rc-refused")
    slack.refused = "invalid_auth"
    with pytest.raises(SlackError, match=r"Slack not told: .*invalid_auth.*results are stored"):
        run_step("alert", run_id, Call(airflow=True))
    kept_file = load_settings().run_dir(run_id) / "slack_message.json"
    kept = json.loads(kept_file.read_text())
    assert kept["run"]["text"].startswith(f"perfpipe release rc-refused run {run_id}")
    assert "invalid_auth" in kept["error"] and not kept["run"].get("ts")
    from tasks.run_context import RunContext
    from tasks.steps.teardown import unfinished_steps

    # Slack's failure is no reason to call the run failed: the step counts as finished
    assert "alert" not in unfinished_steps(RunContext.load(load_settings(), run_id))
    closed = run_step("teardown", run_id, Call(airflow=True))
    assert "invalid_auth" in closed["warning"]
    assert "invalid_auth" in Store(load_settings().database_url()).run(run_id)["warning"]

    slack.refused, refused = None, len(slack.calls)
    run_id = plan_run(suite="tiny", kind="release", release_label="rc-back")
    assert run_step("alert", run_id, Call(airflow=True))["posted"]
    told = [c.body["text"] for c in slack.calls[refused:]]
    assert [t.split(" run ")[0] for t in told] == [
        "perfpipe release rc-refused", "perfpipe release rc-back"], told
    assert "sent late" in told[0]


def test_two_hosts_failing_in_one_second_each_keep_their_failure_message(tmp_path):
    """Two instances of a mapped task (provision on two hosts) failing in the same second:
    each message is its own file (one overwrote the other, and that alert was never sent)."""
    from tasks.notify.failure import write_message

    paths = [write_message(tmp_path, "provision", {"text": f"provision failed on {host}"})
             for host in ("driver1", "driver2")]
    assert paths[0] != paths[1]
    assert sorted(json.loads(p.read_text())["text"] for p in tmp_path.glob("*-provision.json")) \
        == ["provision failed on driver1", "provision failed on driver2"]
