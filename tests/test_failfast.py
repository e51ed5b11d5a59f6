"""Fail-fast: a stage whose clients the broker turns away is stopped at the barrier and
reported invalid with the rule, instead of measuring for its whole window."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tasks.analysis.failfast import FailFast, breach, progress_line
from tests.conftest import Broker, unmanaged_run


def test_rules_judge_the_sum_of_every_process():
    ok = [{"clients": 50, "connects_failed": 1, "errors": 0, "published": 10, "received": 0}] * 2
    assert breach(ok) is None
    refused = ok + [{"clients": 50, "connects_failed": 10}]
    assert breach(refused) == "12 of 150 connections failed (fail-fast above 5%)"
    errors = [{"clients": 10, "published": 500, "received": 480, "errors": 11}]
    assert breach(errors) == "11 client errors for 980 messages (fail-fast above 1%)"
    assert breach(errors, FailFast(max_error_ratio=0.02)) is None
    assert breach([{"clients": 10, "published": 50, "errors": 5}]) is None  # too few yet


def test_a_broker_refusing_most_clients_stops_the_stage_at_the_barrier(tmp_path: Path, tiny_suite):
    from tasks import rundir
    from tasks.steps import Call, execute

    (tiny_suite.parent / "scenarios" / "suites.yml").write_text(
        "suites: {tiny0: [{scenario: tiny_fanin, qos: [0]}]}\n")  # one stage is enough
    broker = Broker(tmp_path, extra_conf="max_connections 4\n")  # the stage has 21 clients
    try:
        ctx = unmanaged_run(tmp_path, broker.port, "tiny0")
        said: list[str] = []
        started = time.monotonic()
        results = execute("stages", ctx, Call(say=said.append))
        took = time.monotonic() - started
    finally:
        broker.kill()
    assert len(results) == 1
    for result in results:
        assert "connections failed (fail-fast above 5%)" in result["stopped"], said
        reason = json.loads((ctx.run_dir / "raw" / result["stage_id"] / "failfast.json").read_text())
        assert reason == {"reason": result["stopped"], "started": False}
    assert [line for line in said if line.startswith("    not starting the stage:")] == \
        [f"    not starting the stage: {result['stopped']}"]
    assert took < 30  # far less than the stage's bound

    # stored with that one reason: not the gates' of a window nothing ran in (the Spark
    # job's output for such a stage, as tests/test_aggregate.py's job writes it)
    ctx.write_json(rundir.STAGE_METRICS, {"stages": [
        {"stage_id": result["stage_id"], "status": "no_data", "series": {}, "metrics": {},
         "problems": ["process localhost/0 reported status 'no_start'",
                      "zero traffic in the measure window"]}]})
    execute("load_metrics", ctx, Call(say=lambda line: None))
    (stored,) = ctx.store().stages(ctx.run_id)
    assert (stored["validity"], stored["reason"]) == ("invalid",
                                                      f"not started: {result['stopped']}")


def test_the_progress_line_says_failed_connects_apart_from_errors():
    quiet = [{"published": 500, "received": 500, "errors": 0}]
    assert progress_line(quiet, 5.0) == \
        "    t+   5s sent 500 (100 msg/s sent), received 500, errors 0"
    refused = [{"published": 500, "received": 480, "errors": 0, "connects_failed": 2}] * 2
    assert progress_line(refused, 5.0).endswith("received 960, errors 0, connects failed 4")
