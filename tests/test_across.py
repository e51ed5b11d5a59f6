"""The broker's cost judged across the run's stages too (`tasks.analysis.across`): a broker a
few percent costlier on every stage, too little for any stage's own nights, is flagged by
the stages together, confirmed on the second night and told in Slack, through the compare
and alert steps on a real SQLite store; what is not combined stays as it was judged."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest

from tasks.analysis.across import combine, judge_stages
from tasks.analysis.detector import Verdict, compare_stage
from tasks.analysis.policy import Policy
from tasks.analysis.thresholds import confidence
from tasks.cli import main
from tasks.metrics import DRIVER_CPU
from tasks.notify.messages import Row, across_changes
from tasks.views.history import attention
from tasks.views.tables import across_note, mde_text, verdict_note
from tests.judged_nights import JudgedNights

COST = "broker_cpu_s_per_10k"
STAGES = ("fanin.q0", "fanin.q1", "fanout.q0", "fanout.q1")


def cost_night(host: float, own: float, step: float = 0.0) -> dict:
    """A stage's cost on a host `host` (log) off its usual pace, `own` (log) of its own
    noise, times 1 + `step`: the cost follows the driver's CPU at a slope of 0.7."""
    return {DRIVER_CPU: 0.8 * math.exp(host),
            COST: 0.3 * math.exp(0.7 * host + own) * (1 + step)}


class Suite(JudgedNights):
    """Nights of four stages on one fingerprint through compare and alert, as the pipeline
    runs them."""

    def __init__(self, state: Path) -> None:
        super().__init__(state, seed=7)

    def night(self, step: float = 0.0, *, quiet: bool = False) -> str:
        """One run; `quiet`: tonight's figures exactly on the stages' line (no noise of
        their own), so what is judged is the step alone."""
        run_id = self.open_run()
        host = self.rng.gauss(0, 0.04)  # the shared host's pace, the same for every stage
        for stage in STAGES:
            self.store.record_stage(run_id, stage, scenario=stage.split(".")[0],
                                    stage_key=f"mosquitto|{stage}", params={},
                                    fingerprint_hash="fp1")
            own = 0.0 if quiet else self.rng.gauss(0, 0.01)
            self.store.record_results(run_id, stage, metrics=cost_night(host, own, step),
                                      series={}, validity="valid", reason=None)
        self.judge(run_id)
        return run_id

    def costs(self, run_id: str) -> dict[str, dict]:
        return {s["stage_id"]: next(c for c in s["comparisons"] if c["metric"] == COST)
                for s in self.store.stages(run_id)}

    def report(self, run_id: str) -> str:
        """The run's HTML report, written again from the store (`perfpipe report`)."""
        out = self.settings.run_dir(run_id) / "again.html"
        assert main(["report", run_id, "--out", str(out)]) == 0
        return out.read_text()


@pytest.fixture
def suite(perfpipe_env: Path) -> Suite:
    return Suite(perfpipe_env)


def test_a_broker_3pct_costlier_on_every_stage_is_flagged_by_the_stages_together(suite):
    for _ in range(20):
        suite.night()
    first_run = suite.night(0.03, quiet=True)
    first = suite.costs(first_run)
    for stage, c in first.items():
        across, own = c["detail"]["across"], c["detail"]["score"]
        assert 0 < own < 1, stage  # no stage's own nights call +3% a bad night ...
        assert c["verdict"] == "suspected" and across["flagged"], stage  # ... the 4 together do
        assert across["stages"] == 4 and across["change_pct"] == pytest.approx(3.0, abs=0.6)
        assert across["mde_pct"] < 0.7 * c["detail"]["mde_pct"]
        assert c["detail"]["hold"]  # held out of later baselines like any flagged night
        assert verdict_note(c, short=True).startswith("flagged with its 4 stages: together +3.")
        assert c["detail"]["change_point"]["run_id"] == first_run  # it began tonight
        assert c["detail"]["change_point"]["nights_ago"] == 0
    second_run = suite.night(0.03, quiet=True)
    second = suite.costs(second_run)
    assert {c["verdict"] for c in second.values()} == {"regression"}
    assert all(c["detail"]["nights"] == 2 for c in second.values())
    # the shift began on the first night they flagged
    assert all(c["detail"]["change_point"]["run_id"] == first_run
               and c["detail"]["change_point"]["nights_ago"] == 1 for c in second.values())
    alerts = [a for a in suite.store.alerts(open_only=True) if a["metric"] == COST]
    assert len(alerts) == 4 and {a["status"] for a in alerts} == {"confirmed"}
    text = json.dumps(suite.message(second_run)["blocks"], ensure_ascii=False)
    assert text.count("flagged with its 4 stages: together +3.") == 5  # each stage's row ...
    # ... and one line for the change the stages showed together, before the stages' rows
    assert ("*one change across stages:* `broker_cpu_s_per_10k`, told here on fanin.q0, "
            "fanin.q1, fanout.q0, fanout.q1 · flagged with its 4 stages: together +3.") in text
    assert "on all 4 stages at once" in text  # the MDE a step on every stage has
    # the report's "Needs a human" says it too, above the stages' rows
    attention = suite.report(second_run).split('id="attention"')[1].split("</table>")[0]
    assert ("One change across stages: <b>broker_cpu_s_per_10k</b> flagged on fanin.q0, "
            "fanin.q1, fanout.q0, fanout.q1 (its 4 stages together +3.") in attention
    # a third such night: the shift still began on the first
    third = suite.costs(suite.night(0.03, quiet=True))
    assert {c["verdict"] for c in third.values()} == {"regression"}
    assert all(c["detail"]["change_point"]["run_id"] == first_run
               and c["detail"]["change_point"]["nights_ago"] == 2 for c in third.values())
    # and a night back on the line clears it, as it clears any regression
    back = suite.costs(suite.night(quiet=True))
    assert {c["verdict"] for c in back.values()} == {"unchanged"}


def test_one_change_on_every_stage_is_called_a_false_positive_once(suite, capsys):
    for _ in range(20):
        suite.night()
    suite.night(0.03, quiet=True)
    suite.night(0.03, quiet=True)
    ids = sorted(a["id"] for a in suite.store.alerts(open_only=True) if a["metric"] == COST)
    assert len(ids) == 4
    # one alert marked alone: the others the same test flagged are named, not changed
    assert main(["alerts", "false-positive", str(ids[0])]) == 0
    said = capsys.readouterr().out
    assert f"alerts {', '.join(map(str, ids[1:]))} were flagged with it" in said
    assert "--together" in said
    assert len([a for a in suite.store.alerts(open_only=True) if a["metric"] == COST]) == 3
    # --together marks them all, and their nights feed the baselines again
    assert main(["alerts", "false-positive", str(ids[1]), "--together"]) == 0
    assert [a for a in suite.store.alerts(open_only=True) if a["metric"] == COST] == []
    assert {suite.store.alert(i)["status"] for i in ids} == {"false_positive"}
    after = suite.costs(suite.night(quiet=True))
    assert {c["detail"]["history"] for c in after.values()} == {22}


def four_stages(tonight_step: list[float], fps: tuple[str | None, ...] = ("fp1",) * 4,
                policy: Policy = Policy(), nights: int = 20,
                previous: dict | None = None, bare: tuple[int, ...] = ()) -> list[dict]:
    """The cost's verdict of four stages judged as the compare step judges them, then
    across the stages of each fingerprint; `previous`: every stage's last verdict of the
    cost; `bare`: the stages whose driver's CPU tonight is unknown (not judged at it)."""
    rng = random.Random(3)
    history = [[] for _ in fps]
    for k in range(nights):
        host = rng.gauss(0, 0.04)
        for i in range(len(fps)):
            history[i].insert(0, {"run_id": f"n{k}", "held_out": [],
                                  "metrics": cost_night(host, rng.gauss(0, 0.01))})
    before = {COST: previous} if previous else {}

    def judge(i: int, own: Policy) -> list[Verdict]:
        tonight = cost_night(0.0, 0.0, tonight_step[i])
        if i in bare:
            del tonight[DRIVER_CPU]
        return compare_stage(f"s{i}", tonight, "valid", history[i], own, run_id="tonight",
                             previous=before)

    judged = judge_stages(judge, list(fps), [before for _ in fps], policy)
    return [next(v for v in stage if v.metric == COST).to_dict() for stage in judged]


def test_what_is_not_combined_stays_as_judged():
    # +2.5% on all four is flagged (the first test's step, on other nights, here smaller) ...
    together = four_stages([0.025] * 4)
    assert {c["verdict"] for c in together} == {"suspected"}
    assert all(c["detail"]["across"]["flagged"] for c in together)
    # ... but not a stage whose own change is under the effect floor (1.5%), nor one that
    # moved the other way
    low = four_stages([0.04, 0.04, 0.04, 0.01])
    assert [c["detail"]["across"]["flagged"] for c in low] == [True, True, True, False]
    assert low[3]["verdict"] == "unchanged" and not low[3]["detail"]["across"]["bad"]
    other_way = four_stages([0.05, 0.05, 0.05, -0.01])
    assert other_way[3]["verdict"] == "unchanged"
    assert any(c["detail"]["across"]["flagged"] for c in other_way[:3])
    # one stage's own regression is not spread over its siblings: without it they did not rise
    one = four_stages([0.15, 0.0, 0.0, 0.0])
    assert one[0]["verdict"] == "suspected" and not one[0]["detail"]["across"]["flagged"]
    assert [c["verdict"] for c in one[1:]] == ["unchanged"] * 3
    assert one[1]["detail"]["across"]["score"] >= 1 and not one[1]["detail"]["across"]["broad"]
    # on two fingerprints they are two pairs, and two stages are not enough for it
    split = four_stages([0.025] * 4, fps=("fp1", "fp1", "fp2", "fp2"))
    assert {c["detail"]["across"]["stages"] for c in split} == {2}
    assert {c["verdict"] for c in split} == {"unchanged"}
    # without the test (across_level 0) the own test spends the whole budget: a lower MDE
    full = four_stages([0.025] * 4, policy=Policy(across_level=0.0))
    assert {c["verdict"] for c in full} == {"unchanged"}
    assert all(f["detail"]["mde_pct"] < t["detail"]["mde_pct"] for f, t in zip(full, together))
    # a stage alone on its fingerprint, or on none known, has no one to be judged with, and
    # its own test keeps that whole budget, as without the test
    for fps in (("fp1", "fp2", "fp3", "fp4"), (None,) * 4):
        alone = four_stages([0.025] * 4, fps=fps)
        assert all("across" not in c["detail"] for c in alone)
        assert [c["detail"]["mde_pct"] for c in alone] == [c["detail"]["mde_pct"] for c in full]
    # a pair on its fingerprint is judged together, its own test at its share ...
    mixed = four_stages([0.025] * 4, fps=("fp1", "fp2", "fp3", "fp3"))
    assert mixed[0]["detail"]["mde_pct"] == full[0]["detail"]["mde_pct"]
    assert mixed[2]["detail"]["mde_pct"] == together[2]["detail"]["mde_pct"]
    # ... and a stage whose partners tonight were not judged at their covariate (so are not
    # combined) keeps the whole budget too: no level is set aside for a test that cannot run
    partnerless = four_stages([0.025] * 4, bare=(1, 2, 3))
    assert all("evidence" not in c["detail"] for c in partnerless[1:])
    assert "across" not in partnerless[0]["detail"]
    assert partnerless[0]["detail"]["mde_pct"] == full[0]["detail"]["mde_pct"]
    # learning stages (fewer than 8 nights) give no evidence to combine
    learning = four_stages([0.2] * 4, nights=5)
    assert all("across" not in c["detail"] for c in learning)
    with pytest.raises(ValueError, match="Policy.across_level"):
        Policy(across_level=3e-4)


def test_a_flagged_verdict_says_what_the_stages_together_showed():
    together = four_stages([0.025] * 4)
    alone = four_stages([0.025] * 4, policy=Policy(across_level=0.0))
    combined = combine(COST, [c["detail"]["evidence"] for c in together], Policy())
    # its confidence is that of the test that flagged it, above the stage's own
    for flagged, own in zip(together, alone):
        assert flagged["confidence"] == confidence(combined.change, combined.sd, combined.dof,
                                                   Policy())
        assert flagged["confidence"] > own["confidence"]
    # a metric too noisy for a stage alone says what the stages together still see ...
    strict = Policy(too_noisy=1.0)  # too noisy above a 5% MDE: a stage's own is 6-8% here
    warned = four_stages([0.0] * 4, policy=strict)
    assert all(c["detail"]["mde_pct"] > 5 >= c["detail"]["across"]["mde_pct"] for c in warned)
    for c in warned:
        seen = re.search(r"; a step on all 4 stages at once is caught from (\d+\.\d)%$",
                         c["detail"]["too_noisy"])
        assert seen and float(seen[1]) == pytest.approx(c["detail"]["across"]["mde_pct"],
                                                        abs=0.06)
    # ... and only where they see it: above their MDE too, the warning is the stage's own
    blind = four_stages([0.0] * 4, policy=Policy(too_noisy=0.5))
    assert all(c["detail"]["across"]["mde_pct"] > 2.5 for c in blind)  # 0.5 x 5%: beyond
    assert all("all 4 stages" not in c["detail"]["too_noisy"] for c in blind)
    # nothing is judged across stages in the better direction: an improvement's night is
    # scored at the whole level, as without the test; the worse direction at its share
    down = four_stages([-0.05] * 4)
    down_alone = four_stages([-0.05] * 4, policy=Policy(across_level=0.0))
    assert [c["detail"]["score"] for c in down] == [c["detail"]["score"] for c in down_alone]
    assert all(c["detail"]["score"] < 0 for c in down)
    assert all(t["detail"]["score"] < a["detail"]["score"] for t, a in zip(together, alone))


def test_two_bad_nights_of_one_test_make_a_regression_not_one_of_each():
    after_own = {"verdict": "suspected", "detail": {"nights": 1, "score": 1.2}}
    after_across = {"verdict": "suspected", "detail": {
        "nights": 1, "score": 0.6, "across": {"bad": True, "flagged": True}}}
    # a night bad across the stages after one bad by the stage's own test: suspected again
    assert {c["verdict"] for c in four_stages([0.025] * 4, previous=after_own)} == {"suspected"}
    # after one bad across the stages too: a regression, its two nights counted
    confirmed = four_stages([0.025] * 4, previous=after_across)
    assert {c["verdict"] for c in confirmed} == {"regression"}
    assert {c["detail"]["nights"] for c in confirmed} == {2}
    # and the stage's own test does not count a night the stages flagged: +6% on one stage,
    # bad by its own test, after a night only they called bad, is suspected, not confirmed
    own_only = four_stages([0.06, 0.0, 0.0, 0.0], previous=after_across)[0]
    assert own_only["verdict"] == "suspected" and own_only["detail"]["score"] >= 1


def test_slack_tells_a_change_of_every_stage_once_as_its_rows_show_it():
    def row(stage: str, run: str = "r2", note: str = "flagged with its 4 stages: together +3.1%"
            ) -> Row:
        return Row(alert_id=0, status="confirmed", verdict="regression", scenario="s",
                   stage_id=stage, params={}, metric=COST, baseline_value=1.0, value=1.03,
                   change_pct=3.0, confidence=0.99, nights=2, fingerprint="fp1", run_id=run,
                   across_note=note)
    # two of the four stages told tonight (the others' alerts acked, say): named as told
    assert across_changes([row("a"), row("b"), row("c", note="")], "r2") == [
        "*one change across stages:* `broker_cpu_s_per_10k`, told here on a, b · flagged "
        "with its 4 stages: together +3.1%"]
    # rows kept from an earlier run say which; one row alone needs no line of its own
    assert across_changes([row("a", "r1"), row("b", "r1"), row("c")], "r2") == [
        "*one change across stages:* `broker_cpu_s_per_10k`, told here on a, b · flagged "
        "with its 4 stages: together +3.1% (run r1, not told then)"]


def test_the_report_names_each_change_across_stages_even_on_one_stage():
    def stage(stage_id: str, fp: str, flagged: bool, change: float = 3.1) -> dict:
        across = {"stages": 4, "change_pct": change, "flagged": flagged, "bad": flagged}
        return {"stage_id": stage_id, "run_id": "r2", "fingerprint_hash": fp,
                "metrics": {COST: 1.03}, "comparisons": [{
                    "metric": COST, "verdict": "suspected", "baseline_value": 1.0,
                    "value": 1.03, "change_pct": 3.0, "confidence": 0.99,
                    "detail": {"nights": 1, "across": across}}]}
    # one stage flagged by the stages' test (the others by their own, say) still gets its
    # line: the row below it carries no note
    one = attention([stage("a<b", "fp1", True), stage("c", "fp1", False)], {}, "ok")
    assert one.count("One change across stages") == 1
    assert ("<b>broker_cpu_s_per_10k</b> flagged on a&lt;b (its 4 stages together +3.1%)."
            in one)  # escaped
    # two fingerprints' changes are two lines, each naming its fingerprint
    two = attention([stage("a", "fp1", True), stage("b", "fp1", True),
                     stage("c", "fp2", True, 5.0), stage("d", "fp2", True, 5.0)], {}, "ok")
    assert "flagged on a, b (its 4 stages together +3.1%, fingerprint fp1)" in two
    assert "flagged on c, d (its 4 stages together +5.0%, fingerprint fp2)" in two


def test_the_combination_is_inverse_variance_weighted():
    got = combine(COST, [{"change": 0.04, "sd": 0.01, "dof": 30},
                         {"change": 0.0, "sd": 0.02, "dof": 12}], Policy())
    assert got.change == pytest.approx(0.04 * 0.8)  # weights 1/0.01^2 and 1/0.02^2
    assert got.sd == pytest.approx(1 / math.sqrt(1e4 + 2.5e3)) and got.dof == 12
    assert combine(COST, [{"change": 0.04, "sd": 0.01, "dof": 30}], Policy()) is None
    detail = {"mde_pct": 7.6, "across": {"stages": 4, "change_pct": 0.3, "sd_pct": 0.8,
                                         "mde_pct": 4.2, "score": 0.1, "bad": False}}
    assert mde_text(detail) == "7.6% (4.2% on all 4 stages at once)"
    assert across_note(detail, short=True) == "across 4 stages +0.3%"
    assert "a step on every stage is caught from 4.2%" in across_note(detail)
