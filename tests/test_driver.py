"""The load driver against a real Mosquitto, run as `python -m tasks.driver` like on a host."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.driver.output import COUNTERS_FILE, EVENTS_FILE, READY_FILE, START_FILE, SUMMARY_FILE

REPO = Path(__file__).resolve().parent.parent


def spec(port: int, *, qos: int = 0, publishers: int = 20, rate: float = 50.0,
         warmup: int = 1, measure: int = 4, drain: int = 2) -> dict:
    return {
        "run_id": "test", "stage_id": f"q{qos}", "host": "localhost", "proc": 0,
        "broker": {"host": "127.0.0.1", "port": port},
        "publishers": [{"client_id": f"p{i}", "topic": "bench/t", "publisher_index": i + 1,
                        "qos": qos, "rate": rate} for i in range(publishers)],
        "subscribers": [{"client_id": "s0", "topics": ["bench/#"], "qos": qos}],
        "warmup_s": warmup, "measure_s": measure, "drain_s": drain,
    }


def start_driver(document: dict, out: Path) -> subprocess.Popen:
    (out.parent / "spec.json").write_text(json.dumps(document))
    return subprocess.Popen([sys.executable, "-m", "tasks.driver", "--spec",
                             str(out.parent / "spec.json"), "--out", str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def release(out: Path, process: subprocess.Popen) -> int:
    deadline = time.monotonic() + 20
    while not (out / READY_FILE).exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "driver never got ready"
        time.sleep(0.05)
    start_at = int(time.time()) + 1
    (out / START_FILE).write_text(json.dumps({"start_at": start_at}))
    return start_at


def counters(out: Path) -> list[dict]:
    with open(out / COUNTERS_FILE) as handle:
        return [{k: int(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def test_rated_publish_delivers_within_two_percent_of_target(broker, tmp_path):
    out = tmp_path / "out"
    process = start_driver(spec(broker.port), out)
    start_at = release(out, process)
    assert process.wait(30) == 0, process.stderr.read()
    window = range(start_at + 1, start_at + 5)  # after the 1 s warm-up, 4 s
    received = sum(r["received"] for r in counters(out) if r["second"] in window)
    assert received / 4 == pytest.approx(20 * 50, rel=0.02)


@pytest.mark.parametrize("qos", [1, 2])
def test_qos_1_and_2_lose_nothing_and_qos_2_never_duplicates(broker, tmp_path, qos):
    out = tmp_path / "out"
    process = start_driver(spec(broker.port, qos=qos, publishers=10, rate=100), out)
    release(out, process)
    assert process.wait(30) == 0, process.stderr.read()
    summary = json.loads((out / SUMMARY_FILE).read_text())
    sent = sum(summary["last_seq"].values())
    assert sent > 0
    assert summary["unique_received"] == sent
    assert summary["totals"]["acked"] == sent
    if qos == 2:
        assert summary["totals"]["duplicated"] == 0


def test_broker_killed_mid_stage_gives_a_clean_partial_result(broker, tmp_path):
    out = tmp_path / "out"
    process = start_driver(spec(broker.port, measure=4), out)
    release(out, process)
    time.sleep(2.0)
    broker.kill()
    code = process.wait(30)  # bounded: the stage ends on time even without a broker
    assert code == 1
    assert "Traceback" not in process.stderr.read()
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["status"] == "partial"
    assert summary["totals"]["errors"] >= 21  # every client's connection was lost
    events = [json.loads(line) for line in (out / EVENTS_FILE).read_text().splitlines()]
    assert sum(e["event"] == "connection_lost" for e in events) == 21


@pytest.mark.parametrize("field, value, message", [
    ("qos", 3, "publishers[0].qos: must be 0, 1 or 2"),
    ("rate", 0, "publishers[0].rate: must be > 0"),
    ("payload_bytes", 8, "publishers[0].payload_bytes: must be >= 32"),
])
def test_bad_specs_are_rejected_naming_the_field(tmp_path, field, value, message):
    document = spec(1883)
    document["publishers"][0][field] = value
    process = start_driver(document, tmp_path / "out")
    assert process.wait(10) == 2
    assert message in process.stderr.read()
