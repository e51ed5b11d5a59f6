"""The validity gates (pure): a stage that fails one is invalid with the reason."""

from __future__ import annotations

from spark.stage_files import StageFiles
from spark.stage_metrics import loss_metrics, qos_metrics
from tasks.analysis.validity import (
    backlog_rising,
    deliveries_per_message,
    driver_hosts_idle_pct,
    driver_idle_note,
    drivers_cpus_used_pct,
    judge,
    stage_notes,
)

GOOD = {"achieved_ratio": 1.0, "target_rate": 1000.0, "expected_delivery_rate": 1000.0,
        "delivered_rate": 1000.0, "throughput_cv": 0.02, "errors": 0, "lost": 0, "duplicated": 0}
KEEPING_UP = {"published_per_s": [1000] * 5, "delivered_per_s": [1000, 990, 1010, 1000, 1000]}


def test_a_stage_that_kept_up_is_valid():
    assert judge(GOOD, qos=1, aggregation_status="ok", problems=[], series=KEEPING_UP) == ("valid", [])


def test_each_gate_names_its_reason():
    cases = {
        "delivered 90.0% of the expected delivery rate": {"achieved_ratio": 0.9},
        "throughput unstable over the window (CV 0.40 > 0.25)": {"throughput_cv": 0.4},
        "3 client errors": {"errors": 3},
        # a client still waiting for its CONNACK at the connect deadline counts no error
        "12 of 2000 connections failed (refused, or no CONNACK by the connect deadline): the "
        "stage ran fewer clients than planned": {"connects_failed": 12, "connects_ok": 1988},
        "2 messages lost at QoS 1, which promises delivery": {"lost": 2},
        "a driver process used 97% of a core while publishing (over 90%)": {"driver_cpu_max": 97.0},
        "the driver processes of one host used 99% of the CPUs they may run on while publishing "
        "(over 90%): the load generator may be the bottleneck; add driver hosts":
            {"driver_cpu_max": 50.0, "drivers_cpus_used_pct": 99.0},
    }
    for reason, change in cases.items():
        validity, reasons = judge({**GOOD, **change}, qos=1, aggregation_status="ok", problems=[])
        assert validity == "invalid" and any(r.startswith(reason) for r in reasons), reasons
    _, reasons = judge({**GOOD, "duplicated": 4}, qos=2, aggregation_status="ok", problems=[])
    assert reasons == ["4 duplicates at QoS 2, which promises exactly once"]
    _, reasons = judge(GOOD, qos=0, aggregation_status="incomplete", problems=["driver1/0: no summary"])
    assert reasons == ["aggregation incomplete: driver1/0: no summary"]


def _summary(by_qos: dict[int, int], qos2_pubacks: int = 0,
             granted: dict[int, int] | None = None) -> dict:
    return {"qos2_pubacks": qos2_pubacks,
            "subscriptions_granted": {str(q): n for q, n in (granted or {}).items()},
            "qos_judgement": {"by_qos": {
                str(q): {"unique": by_qos.get(q, 0), "missing": 0, "duplicated": 0,
                         "out_of_order": 0} for q in (0, 1, 2)}}}


def test_a_stage_is_held_to_the_qos_its_broker_granted_and_says_so():
    """RabbitMQ's MQTT plugin grants QoS 1 to a QoS 2 subscription and acknowledges a QoS 2
    publish with a PUBACK (tests/test_rabbitmq.py runs it): its duplicates are QoS 1's to
    allow, and the stage says what it measured."""
    granted = StageFiles("s.q2", doc={"qos": 2},
                         summaries=[_summary({1: 500}, 500), _summary({1: 480}, granted={1: 1})])
    metrics = qos_metrics(granted)
    assert metrics == {"delivery_qos": 1}
    assert granted.problem_list() == [
        "the broker granted 1 of 1 subscriptions less than the QoS 2 they asked for (QoS 1: 1)",
        "subscribers received this QoS 2 stage's messages at QoS 1 at most, so its loss and "
        "duplicates are judged against QoS 1's promise",
        "the broker acknowledged 500 QoS 2 publishes with a PUBACK, as QoS 1, without QoS 2's "
        "exactly-once handshake: their pub_ack latency is to that PUBACK"]
    assert granted.incomplete is False  # notes: the stage stays ok
    assert judge({**GOOD, "duplicated": 3, **metrics}, qos=2, aggregation_status="ok",
                 problems=[]) == ("valid", [])
    _, reasons = judge({**GOOD, "lost": 2, **metrics}, qos=2, aggregation_status="ok", problems=[])
    assert reasons == ["2 messages lost at QoS 1, which promises delivery"]
    # a broker that gives what was asked: nothing said, QoS 2's promise kept to; so where
    # some deliveries kept it and others did not (the promise is relaxed only when none did)
    for by_qos in ({2: 500}, {1: 20, 2: 480}):
        kept = StageFiles("s.q2", doc={"qos": 2}, summaries=[_summary(by_qos, granted={2: 1})])
        assert qos_metrics(kept) == {"delivery_qos": 2} and kept.problem_list() == []
    _, reasons = judge({**GOOD, "duplicated": 3, "delivery_qos": 2}, qos=2,
                       aggregation_status="ok", problems=[])
    assert reasons == ["3 duplicates at QoS 2, which promises exactly once"]
    # nothing delivered (or no summary): unknown, and the stage's own QoS is the promise
    assert qos_metrics(StageFiles("s.q1", doc={"qos": 1}, summaries=[_summary({})])) == \
        {"delivery_qos": None}
    _, reasons = judge({**GOOD, "lost": 2, "delivery_qos": None}, qos=1,
                       aggregation_status="ok", problems=[])
    assert reasons == ["2 messages lost at QoS 1, which promises delivery"]


def test_missing_deliveries_of_unacknowledged_messages_break_no_promise_but_gaps_do():
    """QoS 1 promises what the broker acknowledged. Up to `unacked_by_stream` x receivers
    of the missing deliveries may be of messages it had not acknowledged when the drain
    ended; a gap (a message missing before a later one that arrived) was taken by the
    broker whatever else was in flight, so unacknowledged messages never excuse it."""
    from tasks.analysis.validity import broken_promises, message_loss

    def summary(**kw) -> dict:
        return {"last_seq": {"1": 100, "2": 100}, "unique_received": 190, **kw}

    receivers = {"1": 1, "2": 1}
    backlog = message_loss([summary(unacked_by_stream={"2": 10})], receivers)
    assert (backlog.lost, backlog.unacked) == (10, 10)
    assert broken_promises(1, backlog.lost, 0, backlog.unacked) == []
    holes = message_loss([summary(unacked_by_stream={"2": 10}, missing_at_end=6)], receivers)
    assert (holes.lost, holes.unacked) == (10, 4)
    assert broken_promises(1, holes.lost, 0, holes.unacked) == [
        "6 messages the broker acknowledged lost at QoS 1, which promises delivery"]


def test_loss_at_qos_0_passes_the_gates_and_is_said():
    """QoS 0 may lose, so no gate holds its loss (DESIGN.md's "no discards" is not a gate
    here): a broker dropping QoS 0 messages for a slow subscriber is noted on the stage."""
    def stage(qos: int) -> StageFiles:
        return StageFiles("s", doc={"qos": qos, "receivers": {"0": 2}},
                          summaries=[{"last_seq": {"0": 500}, "unique_received": 990}])

    lossy = stage(0)
    metrics = loss_metrics(lossy)
    assert metrics == {"lost": 10, "loss_ratio": 0.01, "unacked_deliveries": 0}
    assert lossy.problem_list() == [
        "10 of 1,000 messages lost (1.00%): QoS 0 allows it, so no gate fails on it, but a "
        "broker that keeps up loses none (one drops QoS 0 messages past a subscriber's queue)"]
    assert judge({**GOOD, **metrics}, qos=0, aggregation_status="ok", problems=[])[0] == "valid"
    at_qos_1 = stage(1)  # its loss is a gate's reason, not a note
    _, reasons = judge({**GOOD, **loss_metrics(at_qos_1)}, qos=1, aggregation_status="ok",
                       problems=[])
    assert at_qos_1.problem_list() == [] and reasons == [
        "10 messages lost at QoS 1, which promises delivery"]
    # a QoS 1 stage whose broker delivered at QoS 0 is held to QoS 0: its loss is noted
    granted_0 = stage(1)
    assert loss_metrics(granted_0, promised=0)["lost"] == 10
    assert granted_0.problem_list()[0].startswith("10 of 1,000 messages lost (1.00%): QoS 0")
    whole = StageFiles("s", doc={"qos": 0, "receivers": {"0": 2}},
                       summaries=[{"last_seq": {"0": 500}, "unique_received": 1000}])
    assert loss_metrics(whole)["lost"] == 0 and whole.problem_list() == []


def test_what_the_aggregation_said_is_kept_where_the_reason_does_not_say_it():
    problems = ["a", "b", "c", "d"]
    assert stage_notes("ok", problems) == problems  # a stage aggregated ok: notices only
    _, reasons = judge(GOOD, qos=0, aggregation_status="incomplete", problems=problems)
    assert reasons == ["aggregation incomplete: a; b; c"]
    assert stage_notes("incomplete", problems) == ["d"]


def test_the_drivers_cpus_are_read_per_host_and_set_of_cpus():
    def proc(host, pct, cpus):
        return {"host": host, "publish_cpu": {"cpu_s": pct / 100, "wall_s": 1.0}, "cpus": cpus}

    # two processes share CPU 1 and use it up; a third, on CPUs 2-3, does not dilute them
    assert drivers_cpus_used_pct([proc("a", 50, [1]), proc("a", 50, [1]),
                                  proc("a", 5, [2, 3]), proc("b", 80, [0, 1])]) == 100
    # a process without a summary, its CPU or its CPUs is left out: a lower bound
    assert drivers_cpus_used_pct([proc("a", 60, [1]), {}, proc("a", 30, []),
                                  {"host": "a", "cpus": [1]}]) == 60
    assert drivers_cpus_used_pct([{}, {"host": "a", "cpus": [0]}]) is None
    # one process using up the one CPU it has: more processes would not help
    _, reasons = judge({**GOOD, "driver_cpu_max": 99.0, "drivers_cpus_used_pct": 99.0}, qos=0,
                       aggregation_status="ok", problems=[])
    assert reasons == ["the driver processes of one host used 99% of the CPUs they may run on "
                       "while publishing (over 90%): the load generator may be the bottleneck; "
                       "add driver hosts, or CPUs for them (fewer in broker.cpus)"]


def test_drivers_cpus_rarely_idle_are_said_and_never_gate():
    def proc(host, idle, pct=20.0):
        return {"host": host, "cpus": [0],
                "publish_cpu": {"cpu_s": pct / 100, "wall_s": 1.0, "cpus_idle_pct": idle}}

    # the least idle process's CPUs; one that did not record it is left out
    assert driver_hosts_idle_pct([proc("d", 60.0), proc("d", 4.0), {"publish_cpu": {}},
                                  {}]) == 4.0
    assert driver_hosts_idle_pct([{}, proc("d", None)]) is None
    busy = [proc("d1", 60.0), proc("d2", 4.0)]
    assert driver_idle_note(busy, "b") == (
        "the CPUs a driver process may run on were idle 4% of its publish phase (20% by the "
        "drivers themselves): a driver kept waiting for a CPU sends late, so the load "
        "generator may have been short of CPU")
    assert driver_idle_note([proc("d1", 10.0)], "b") is None
    # the drivers' own share on the least idle host, not the busiest host's
    assert "idle 4% of its publish phase (3% by the drivers themselves)" in driver_idle_note(
        [proc("d1", 15.0, pct=85.0), proc("d2", 4.0, pct=3.0)], "b")
    # on the broker's host, a broker at its capacity keeps the CPUs busy: not said
    assert driver_idle_note(busy, "d2") is None
    assert driver_idle_note([], "b") is None
    metrics = {**GOOD, "driver_host_idle_pct": 4.0, "drivers_cpus_used_pct": 20.0}
    assert judge(metrics, qos=0, aggregation_status="ok", problems=[]) == ("valid", [])


def test_a_backlog_rising_through_the_window_invalidates_the_stage():
    falling_behind = {"published_per_s": [1000] * 5, "delivered_per_s": [980, 975, 970, 960, 965]}
    reason = backlog_rising(falling_behind, fan_out=1.0)
    assert reason == ("backlog rose in 5 of 5 seconds, by 150 messages (3.0% of the window's "
                      "deliveries): the broker fell behind")
    # within the rate gate's 5% but rising every second: the backlog gate catches it
    validity, reasons = judge({**GOOD, "achieved_ratio": 0.97, "delivered_rate": 970.0}, qos=0,
                              aggregation_status="ok", problems=[], series=falling_behind)
    assert validity == "invalid" and reasons == [reason]
    # fan-out: each message goes to 10 subscribers, all delivered: no backlog
    fan = {"published_per_s": [100] * 4, "delivered_per_s": [1000] * 4}
    assert backlog_rising(fan, fan_out=10.0) is None
    assert backlog_rising(KEEPING_UP, fan_out=1.0) is None


def test_a_hold_the_search_saw_keep_up_is_not_made_to_fall_behind_by_rounding():
    """A capacity night of the slowdown test (2026-12-03): a 2 s hold at 2077.5 msg/s
    delivered 2077 then 1988 a second. The search saw the backlog rise in 1 second of 2 and
    kept the rate; the gates, reading the fan-out as delivered rate / achieved ratio /
    target rate from the rounded stored metrics (1 + 1e-10), saw the first second owe
    2e-7 messages, called it rising (2 of 2) and made the night invalid. A second rises
    by half a message or more, and the fan-out is the one the search reads."""
    series = {"published_per_s": [2077, 2077], "delivered_per_s": [2077, 1988]}
    stored = {**GOOD, "target_rate": 2077.516784, "expected_delivery_rate": 2077.516784,
              "delivered_rate": 2032.5, "achieved_ratio": 0.9783314462, "throughput_cv": 0.022}
    assert judge(stored, qos=0, aggregation_status="ok", problems=[], series=series) == (
        "valid", [])
    assert backlog_rising(series, fan_out=1.0 + 1e-10) is None
    exact = deliveries_per_message(2077.5167842339424, 2077.5167842339424)
    assert backlog_rising(series, exact) is None
    # the same growth, rising in both seconds, still falls behind
    behind = {"published_per_s": [2077, 2077], "delivered_per_s": [2030, 2035]}
    assert backlog_rising(behind, fan_out=1.0) == (
        "backlog rose in 2 of 2 seconds, by 89 messages (2.1% of the window's deliveries): "
        "the broker fell behind")
