"""What a run of the shipped `rated` suite (the rated half of the nightly) on the lab must
show (used by tests/test_lab_pipeline.py): the broker on broker1 with a plain and a TLS listener (a CA
generated for the run), the drivers on driver1 and driver2 over SSH. IBM fan-in and
fan-out at QoS 0/1/2, BROADCAST, CONNBURST plain and over TLS; every rated stage delivers
within 2% of its expected rate, and the broker sampler records Mosquitto's $SYS
statistics beside CPU and RSS."""

from __future__ import annotations

import csv
import io
import json

from sql import Store
from tasks.brokers.tls import GENERATED_CA
from tasks.driver.broker_stats import SYS_COLUMNS, SYS_FILE
from tasks.driver.output import SAMPLER_COLUMNS, SAMPLER_FILE, STAGE_FILE, SUMMARY_FILE
from tasks.run_context import RunContext

TOLERANCE = 0.02
SCENARIOS = {"ibm_fanin", "ibm_fanout", "messagesight_broadcast", "messagesight_connburst",
             "messagesight_connburst_tls"}


def doc_rate(run_dir, stage: dict) -> float:
    return json.loads((run_dir / "raw" / stage["stage_id"] / STAGE_FILE)
                      .read_text())["target_publish_rate"]


def read_csv(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def check_rated_suite(settings, run_id: str) -> str:
    """Assert everything above of a finished run; returns its per-stage table."""
    run_dir = settings.run_dir(run_id)
    stages = Store(settings.database_url()).stages(run_id)
    assert {s["scenario"] for s in stages} == SCENARIOS
    assert {(s["scenario"], int(s["stage_id"].split(".q")[1][0])) for s in stages
            if s["scenario"] in ("ibm_fanin", "ibm_fanout")} == {
        (name, qos) for name in ("ibm_fanin", "ibm_fanout") for qos in (0, 1, 2)}

    table = [f"the rated suite on the lab: run {run_id}",
             f"{'stage':42} {'target':>8} {'expected':>9} {'delivered':>10} {'ratio':>7}  validity"]
    problems = []
    for stage in stages:
        m = stage["metrics"]
        doc = json.loads((run_dir / "raw" / stage["stage_id"] / STAGE_FILE).read_text())
        expected = doc["expected_delivery_rate"]
        table.append(f"{stage['stage_id']:42} {m['target_rate']:8.1f} {expected:9.1f} "
                     f"{m['delivered_rate'] or 0:10.1f} {m['achieved_ratio'] or 0:7.4f}  "
                     f"{stage['validity']} {stage['reason'] or ''}")
        if stage["validity"] != "valid":
            problems.append(f"{stage['stage_id']} invalid: {stage['reason']}")
        rated = (m["target_rate"] or 0) > 0 and "connburst" not in stage["scenario"]
        if rated:
            # achieved_ratio is delivered / expected delivery rate (fan-out and broadcast
            # multiply the publish rate by the receivers of each message)
            assert abs(m["achieved_ratio"] - m["delivered_rate"] / expected) < 1e-3
            if abs(m["achieved_ratio"] - 1) > TOLERANCE:
                problems.append(f"{stage['stage_id']}: delivered {m['delivered_rate']:.1f} msg/s "
                                f"of {expected:.1f} expected ({m['achieved_ratio']:.2%})")
    print("\n".join(table))
    assert not problems, "\n".join(problems + table)

    # CONNBURST over TLS: every client connected, to the TLS port, with the connect latency
    ctx = RunContext.load(settings, run_id)
    broker = ctx.broker()
    tls_port = broker["tls"]["port"]
    for stage in (s for s in stages if s["scenario"].startswith("messagesight_connburst")):
        doc = json.loads((run_dir / "raw" / stage["stage_id"] / STAGE_FILE).read_text())
        m = stage["metrics"]
        assert m["connects_ok"] == doc["clients"] and m["connects_failed"] == 0, stage["stage_id"]
        assert 0 < m["connect_latency_p50"] <= m["connect_latency_p99"], stage["stage_id"]
        assert m.get("connect_rate") is None or m["connect_rate"] > 0
        tls = stage["scenario"].endswith("_tls")
        connected = 0
        for proc in doc["processes"]:
            summary = json.loads((run_dir / "raw" / stage["stage_id"] / proc["host"]
                                  / str(proc["proc"]) / SUMMARY_FILE).read_text())
            endpoint = summary["config"]["broker"]
            assert endpoint["tls"] is tls
            assert endpoint["port"] == (tls_port if tls else broker["port"])
            if tls:
                assert endpoint["ca_file"].endswith("/" + GENERATED_CA)
            connected += summary["connect_phase"]["connected"]
        assert connected == doc["clients"]

    # the generated CA reached the drivers; the server key is private on broker1
    local_ca = (run_dir / "broker" / "tls" / "ca.pem").read_text()
    for name in ("driver1", "driver2"):
        (path,) = broker["tls"]["installed_ca_files"]
        assert ctx.host(name).read_text(path) == local_ca
    broker_host = ctx.host("broker1")
    mode = broker_host.run(["stat", "-c", "%a %U", broker["tls"]["key_file"]]).stdout.split()
    assert mode == ["600", "mosquitto"]  # root drops to mosquitto, which must read it
    assert not list((run_dir / "broker").rglob("*.key"))

    # $SYS samples beside CPU and RSS, for the same seconds, sampled on the broker host (as
    # collect brought them over: teardown removed them there)
    for stage in stages:
        sampler_dir = run_dir / "raw" / stage["stage_id"] / "broker1" / "sampler"
        cpu = read_csv((sampler_dir / SAMPLER_FILE).read_text())
        sys_rows = read_csv((sampler_dir / SYS_FILE).read_text())
        assert tuple(cpu[0]) == SAMPLER_COLUMNS and tuple(sys_rows[0]) == SYS_COLUMNS
        assert [r["second"] for r in sys_rows] == [r["second"] for r in cpu]
        window = json.loads((run_dir / "raw" / stage["stage_id"] / STAGE_FILE)
                            .read_text())["windows"]
        inside = [r for r in sys_rows
                  if window["measure_start"] <= int(r["second"]) < window["measure_end"]]
        assert len(inside) >= window["measure_end"] - window["measure_start"] - 1
        assert all(r["clients_connected"] and r["queued_messages"] and r["heap_current"]
                   for r in inside), stage["stage_id"]
        # a rate needs two $SYS updates, and Mosquitto 2.0 sends one every 2 s: the window's
        # first seconds may come before the sampler's second update, no later second
        first = next((k for k, r in enumerate(inside) if r["msgs_received_per_s"]), None)
        assert first is not None and first <= 3, (stage["stage_id"], inside)
        assert all(r["msgs_received_per_s"] for r in inside[first:]), stage["stage_id"]
        # the broker's packet counter moved with the stage's traffic (its PUBLISH counter
        # leaves QoS 2 out in Mosquitto 2.0)
        received = int(inside[-1]["msgs_received"]) - int(inside[0]["msgs_received"])
        assert received >= (len(inside) - 1) * doc_rate(run_dir, stage) * 0.5, stage["stage_id"]
    return "\n".join(table)
