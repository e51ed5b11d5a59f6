"""The HTML report, opened in headless Chromium (Debian's chromium) like a person would."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tasks.views.report import render

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
RUN = {"run_id": "nightly-demo", "kind": "nightly", "suite": "smoke", "broker_kind": "mosquitto",
       "broker_version": "2.0.11", "status": "ok", "release_label": None}


def stage(index: int, qos: int, publishers: int, delivered: float, validity: str = "valid",
          reason: str | None = None) -> dict:
    seconds = list(range(1000, 1014))
    per_second = [delivered * (0.2 if s < 1002 else 1.0) for s in seconds]
    return {
        "stage_id": f"fanin.q{qos}.c{publishers}", "validity": validity, "reason": reason,
        "params": {"index": index, "scenario": "fanin", "qos": qos, "warmup_s": 2, "measure_s": 10,
                   "groups": [{"role": "pub", "count": publishers}, {"role": "sub", "count": 1}]},
        "metrics": {"delivered_rate": delivered, "target_rate": publishers * 10.0,
                    "e2e_latency_p50": 800.0 + qos * 100, "e2e_latency_p99": 3000.0,
                    "e2e_latency_avg": 900.0, "e2e_latency_stddev": 400.0, "errors": 0.0,
                    "broker_cpu_avg": 7.5, "broker_rss_max": 9.0e6},
        "series": {"stage_seconds": seconds, "stage_delivered_per_s": per_second,
                   "delivered_per_s": per_second[2:12]},
        "comparisons": [{"metric": "delivered_rate", "verdict": "regression" if index == 5 else "unchanged",
                         "baseline_value": delivered * 1.1, "value": delivered,
                         "change_pct": -9.1, "confidence": 0.99}],
    }


@pytest.fixture
def report(tmp_path: Path) -> Path:
    stages = [stage(i, qos, n, n * 10.0 * (0.97 if qos else 1.0))
              for i, (qos, n) in enumerate((q, n) for q in (0, 1) for n in (50, 100, 200))]
    stages.append(stage(6, 2, 200, 1200.0, "invalid", "delivered 60% of the target <rate>"))
    hosts = [{"host": "driver<1>", "cpu_model": "x86", "cpus": 2, "hash": "abc"}]
    tuning = [{"host": "driver<1>", "entries": [{"kind": "sysctl", "key": "net.core.somaxconn",
                                                "wanted": "4096", "before": "128",
                                                "after": "4096", "ok": True, "action": "applied"}]}]
    path = tmp_path / "report.html"
    path.write_text(render(RUN, stages, hosts, tuning))
    return path


def chromium() -> str:
    found = shutil.which("chromium")
    if not found:
        pytest.fail("chromium is not installed: run `make test`, which installs it")
    return found


def test_report_is_self_contained_and_escaped(report):
    html = report.read_text()
    assert "src=" not in html and "http" not in html and "url(" not in html
    assert "<rate>" not in html and "&lt;rate&gt;" in html and "driver&lt;1&gt;" in html


def test_report_renders_in_chromium_with_charts_and_score_card(report, tmp_path):
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([chromium(), *flags, "--dump-dom", report.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    assert '<svg id="rate-fanin"' in page and page.count("<polyline") >= 2 + 7
    assert 'id="score-card"' in page and page.count("<tr>") > 7
    assert page.count('class="series"') == 7 and page.count('class="window"') == 7
    assert "net::ERR" not in dom.stderr and "Failed to load" not in dom.stderr
    shot = tmp_path / "report.png"
    done = subprocess.run([chromium(), *flags, f"--screenshot={shot}", "--window-size=1280,2400",
                           report.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.exists()
    assert shot.stat().st_size > 40_000  # a blank page of this size is a few KB


def test_perfpipe_report_rerenders_a_stored_run_from_the_store(perfpipe_env: Path, capsys) -> None:
    from sql import Store
    from tasks.cli import main
    from tasks.settings import load_settings

    store = Store(load_settings().database_url())
    store.migrate()
    store.create_run("r-stored", kind="nightly", suite="smoke", broker_kind="mosquitto",
                     artifact_dir="/gone")
    demo = stage(0, 1, 100, 990.0)
    store.record_stage("r-stored", demo["stage_id"], scenario="fanin", stage_key="k",
                       params=demo["params"], fingerprint_hash="fp")
    store.record_results("r-stored", demo["stage_id"], metrics=demo["metrics"],
                         series=demo["series"], validity="valid", reason=None)
    store.record_fingerprint("r-stored", "driver1", {"cpu_model": "EPYC<x>", "cpus": 2})
    store.record_tuning("r-stored", "driver1", "lab", [{"kind": "sysctl", "key": "net.core.somaxconn",
                                                        "wanted": "4096", "before": "128", "after": "4096",
                                                        "ok": True, "action": "applied"}])
    store.finish_run("r-stored", "ok")
    out = perfpipe_env / "again.html"
    assert main(["report", "r-stored", "--out", str(out)]) == 0  # no run folder: all from SQL
    html = out.read_text()
    assert "fanin.q1.c100" in html and "EPYC&lt;x&gt;" in html and "net.core.somaxconn" in html
    assert capsys.readouterr().out.strip() == str(out)
    assert main(["report", "nope"]) == 2
    assert "unknown run 'nope'" in capsys.readouterr().err
