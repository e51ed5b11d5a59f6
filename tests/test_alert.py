import json

from tasks.alert import SlackNotifier, build_message

RUN = {"run_id": "r1", "kind": "nightly", "suite": "smoke", "broker_kind": "mosquitto",
       "broker_version": "2.0.11", "status": "ok"}


def test_message_lists_regressions_and_caps_them():
    verdicts = [{"stage_id": f"s{i}", "metric": "delivered_rate", "verdict": "regression",
                 "baseline_value": 1000.0, "value": 900.0, "change_pct": -10.0, "confidence": 0.99}
                for i in range(15)]
    message = build_message(RUN, verdicts, "/tmp/report.html")
    assert message["needs_attention"]
    text = json.dumps(message["blocks"])
    assert "s0" in text and "-10.0%" in text and "5 more" in text and "s14" not in text


def test_without_a_token_the_message_is_written_not_posted(tmp_path):
    message = build_message(RUN, [], "/tmp/report.html")
    outcome = SlackNotifier.from_token(None, "#perf").send(message, tmp_path)
    assert not outcome.posted
    assert json.loads((tmp_path / "slack_message.json").read_text())["text"].endswith("no regressions")
