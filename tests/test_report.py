"""The HTML report, opened in headless Chromium (Debian's chromium) like a person would."""

from __future__ import annotations

import io
import json
import math
import random
import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from html import unescape
from pathlib import Path

import pytest

from sql import Store
from tasks.driver.histogram import bucket_of
from tasks.metrics import BROKER_CPU_SERIES, bucket_series, p99_per_s_series
from tasks.steps.report import render_stored
from tasks.views.charts import Night, history_chart
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
                    "expected_delivery_rate": publishers * 10.0,  # one subscriber
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
    stages[2]["notes"] = "the broker granted QoS <1>\nclocks not trusted"
    hosts = [{"host": "driver<1>", "cpu_model": "x86", "cpus": 2, "hash": "abc",
              "roles": ["broker", "driver"], "clock_offset_s": -6e-06, "clock_trusted": True}]
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
    # every note on a stage, valid or not, a line each under its stage
    assert ('<h2>Notes on the stages</h2><ul id="notes"><li>fanin.q0.c200: the broker granted '
            'QoS &lt;1&gt;</li><li>fanin.q0.c200: clocks not trusted</li></ul>') in html
    assert "<p>Nothing to note.</p>" in render(RUN, [stage(0, 0, 50, 500.0)], [])
    # a p-value of 4e-5 is not a certainty: never rounded up to 100
    sure = stage(5, 0, 50, 500.0)
    sure["comparisons"][0]["confidence"] = 0.99996
    page = render(RUN, [sure], [])
    table = page[page.index('<table id="verdicts">'):]
    assert "<td>&gt;99.9</td>" in table and "100.0" not in table[:table.index("</table>")]
    # the host as a person reads it, not as Python prints it
    row = html[html.index('<table id="hosts">'):]
    row = row[:row.index("</table>")]
    assert ">broker, driver<" in row and ">-0.006 ms<" in row and ">yes<" in row, row
    assert ">clock offset<" in row and "[" not in row and "True" not in row


def test_report_renders_in_chromium_with_charts_and_score_card(report, tmp_path):
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([chromium(), *flags, "--dump-dom", report.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    assert '<svg id="rate-fanin"' in page and page.count("<polyline") >= 2 + 7
    rate_chart = page[page.index('<svg id="rate-fanin"'):]
    assert "expected (every intended delivery)" in rate_chart[:rate_chart.index("</svg>")]
    assert 'id="score-card"' in page and page.count("<tr>") > 7
    assert page.count('class="series"') == 7 and page.count('class="window"') == 7
    assert "net::ERR" not in dom.stderr and "Failed to load" not in dom.stderr
    shot = tmp_path / "report.png"
    done = subprocess.run([chromium(), *flags, f"--screenshot={shot}", "--window-size=1280,2400",
                           report.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.exists()
    assert shot.stat().st_size > 40_000  # a blank page of this size is a few KB


def test_perfpipe_report_rerenders_a_stored_run_from_the_store(perfpipe_env: Path, capsys) -> None:
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


# ---- a stored history with a known regression, judged by the real detector ---------------
STEADY, DROPPED = 1000.0, 880.0  # delivered msg/s: a 12% drop on the last two nights
NIGHTS = 12


def _night_series(rng: random.Random, seconds: list[int], rate: float) -> dict:
    """What the Spark job stores for a stage: per-second rates, p99 and broker CPU, and the
    window's summed e2e buckets."""
    buckets: dict[int, int] = {}
    for _ in range(4000):
        value = int(rng.lognormvariate(math.log(900), 0.4))  # microseconds
        buckets[bucket_of(value)] = buckets.get(bucket_of(value), 0) + 1
    index, counts = bucket_series("e2e")
    window = seconds[2:12]
    return {"stage_seconds": seconds, "stage_delivered_per_s": [rate] * len(seconds),
            "seconds": window, "delivered_per_s": [rate] * len(window),
            p99_per_s_series("e2e"): [2500.0 + 100 * rng.random() for _ in window],
            BROKER_CPU_SERIES: [20 + rng.random() for _ in window],
            index: sorted(buckets), counts: [buckets[b] for b in sorted(buckets)]}


@pytest.fixture
def regressed(perfpipe_env: Path) -> tuple[Store, str]:
    """Twelve nights of one stage in a real SQLite store, each judged by the compare step's
    own code; the delivered rate drops 12% on the last two nights."""
    from tasks.settings import load_settings
    from tasks.steps.compare import compare_stored

    store = Store(load_settings().database_url())
    store.migrate()
    rng, start = random.Random(7), datetime(2026, 11, 1, 2, 0, tzinfo=timezone.utc)
    template = stage(0, 1, 100, STEADY)
    for night in range(NIGHTS):
        run_id = f"nightly-{night:02d}"
        rate = (DROPPED if night >= NIGHTS - 2 else STEADY) * (1 + rng.gauss(0, 0.004))
        store.create_run(run_id, kind="nightly", suite="smoke", broker_kind="mosquitto",
                         artifact_dir="/gone", started_at=start + timedelta(days=night))
        store.record_stage(run_id, template["stage_id"], scenario="fanin", stage_key="fanin-k",
                           params=template["params"], fingerprint_hash="fp")
        metrics = {**template["metrics"], "delivered_rate": rate,
                   "e2e_latency_p50": 900.0 * (1 + rng.gauss(0, 0.01))}
        store.record_results(run_id, template["stage_id"], metrics=metrics,
                             series=_night_series(rng, list(range(1000, 1014)), rate),
                             validity="valid", reason=None)
        compare_stored(store, run_id, {})
        store.finish_run(run_id, "ok")
    return store, run_id


def _boxes_and_screenshot(html: Path, tmp_path: Path, ids: list[str]) -> tuple[dict, bytes]:
    """Open the page in Chromium as a person would: where each element was laid out (read
    back from the DOM by a script added to a copy) and a screenshot of the same layout."""
    probe = tmp_path / "probe.html"
    script = ("<script>document.body.dataset.boxes=JSON.stringify(Object.fromEntries("
              f"{json.dumps(ids)}.map(i=>{{const r=document.getElementById(i)"
              ".getBoundingClientRect();return [i,[r.left,r.top,r.width,r.height]]})))</script>")
    probe.write_text(html.read_text().replace("</body>", script + "</body>"))
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2000",
             "--force-device-scale-factor=1", "--hide-scrollbars"]
    dom = subprocess.run([chromium(), *flags, "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'data-boxes="([^"]*)"', dom.stdout)
    assert found, "the layout probe did not run"
    shot = tmp_path / "shot.png"
    done = subprocess.run([chromium(), *flags, f"--screenshot={shot}", probe.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    return json.loads(unescape(found.group(1))), shot.read_bytes()


def _pixels(png: bytes, box: list[float]) -> list[tuple[int, int, int]]:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    left, top, width, height = (round(v) for v in box)
    return list(image.crop((left, top, left + width, top + height)).get_flattened_data())


def test_each_scenarios_rate_chart_runs_along_what_its_stages_step() -> None:
    """Fan-in steps its publishers, fan-out its subscribers, a partitioned fan-in its rate:
    each chart's x is that, so its stages are not drawn at one x (fan-out's were, all at
    its one publisher)."""
    from tasks.views.report import rate_charts

    def scenario(name: str, pubs: int, subs: int, rate: float) -> dict:
        return {"params": {"scenario": name, "qos": 0,
                           "groups": [{"role": "pub", "count": pubs},
                                      {"role": "sub", "count": subs}]},
                "metrics": {"delivered_rate": rate * subs, "target_rate": rate,
                            "expected_delivery_rate": rate * subs}}

    stages = [scenario("fanin", n, 1, n * 10.0) for n in (50, 100)]
    stages += [scenario("fanout", 1, n, 10.0) for n in (250, 500, 1000)]
    stages += [scenario("partitions", 100, 1, r) for r in (500.0, 1000.0)]
    unknown = scenario("partitions", 100, 1, 750.0)  # its start document lost: no rate
    stages += [{**unknown, "metrics": {**unknown["metrics"], "target_rate": None}},
               scenario("burst", 1000, 0, 0.0)]
    page = rate_charts(stages)

    def chart(name: str) -> str:
        start = page.index(f'<svg id="rate-{name}"')
        return page[start:page.index("</svg>", start)]

    assert ">fanin: delivered rate against publishers<" in chart("fanin")
    assert ">fanout: delivered rate against subscribers<" in chart("fanout")
    line = re.search(r'<polyline[^>]*points="([^"]*)"', chart("fanout")).group(1)
    assert len({point.split(",")[0] for point in line.split()}) == 3  # three x, not one
    assert all(f">{tick}<" in chart("fanout") for tick in ("250", "500", "1k"))
    assert ">partitions: delivered rate against offered msg/s<" in chart("partitions")
    line = re.search(r'<polyline[^>]*points="([^"]*)"', chart("partitions")).group(1)
    assert len(line.split()) == 2  # the stage whose offered rate is not known is no point
    assert ">burst: delivered rate against publishers<" in chart("burst")  # one step


def test_each_qos_has_its_own_expected_line_where_its_rate_is_its_own() -> None:
    """ibm_fanin runs QoS 0, 1 and 2 at 0.3, 0.25 and 0.2 of the rate: each QoS's dashed
    line follows its own intended deliveries (one line drew QoS 2's under all three, so a
    QoS 0 that delivered all of its own read 50% above "expected")."""
    from tasks.views.report import rate_charts

    share = {0: 0.3, 1: 0.25, 2: 0.2}
    page = rate_charts([{"params": {"scenario": "fanin", "qos": qos,
                                    "groups": [{"role": "pub", "count": n},
                                               {"role": "sub", "count": 1}]},
                         "metrics": {"delivered_rate": share[qos] * n * 100,
                                     "target_rate": share[qos] * n * 100,
                                     "expected_delivery_rate": share[qos] * n * 100}}
                        for qos in share for n in (100, 1000)])
    lines = re.findall(r'<polyline[^>]*stroke="([^"]*)"[^>]*?( stroke-dasharray="[^"]*")? '
                       r'points="([^"]*)"', page)
    solid = {color: points for color, dash, points in lines if not dash}
    dashed = {color: points for color, dash, points in lines if dash}
    assert len(solid) == 3 and dashed == solid  # every QoS delivered all its own
    assert len(set(solid.values())) == 3
    assert all(f"QoS {qos} expected (every intended delivery)" in page for qos in share)


def test_a_night_judged_before_its_noise_is_known_has_no_band_in_the_report():
    """The report draws the band the export and the Grafana view give: none for a night
    judged while learning, whose sigma rests on a few nights, even one flagged as beyond
    doubt; one for a night judged past learning (its detail has the night's score)."""
    from tasks.views.history import nights_of

    def comparison(verdict: str, **past) -> dict:
        return {"metric": "delivered_rate", "verdict": verdict, "baseline_value": 100.0,
                "detail": {"noise_pct": 3.0, **past}}

    earlier = [{"run_id": "n1", "metrics": {"delivered_rate": 99.0},
                "verdicts": {"delivered_rate": comparison("learning")}},
               {"run_id": "n2", "metrics": {"delivered_rate": 50.0},
                "verdicts": {"delivered_rate": comparison("regression")}}]
    stage = {"run_id": "n3", "metrics": {"delivered_rate": 101.0},
             "comparisons": [comparison("unchanged", score=0.2)]}
    nights, _ = nights_of("delivered_rate", earlier, stage)
    assert [n.band is None for n in nights] == [True, True, False]
    low, high = nights[2].band
    assert low < 100.0 < high


def test_a_known_regression_is_boxed_at_the_top_and_drawn_in_its_history(regressed, tmp_path):
    store, run_id = regressed
    stage_id = "fanin.q1.c100"
    tonight = {c["metric"]: c for c in store.stages(run_id)[0]["comparisons"]}
    assert tonight["delivered_rate"]["verdict"] == "regression"  # the known regression
    html = tmp_path / "report.html"
    html.write_text(render_stored(store, run_id))
    page = html.read_text()
    # the box at the top names it: baseline -> tonight, change, nights of evidence
    box = page[page.index('id="attention"'):page.index("<h2>History</h2>")]
    assert 'class="regression"' in box and "delivered_rate" in box and "sparkline" in box
    assert f"{tonight['delivered_rate']['change_pct']:.3f}"[:4] in box
    chart_id = f"history-{stage_id}-delivered_rate"
    chart = page[page.index(f'id="{chart_id}"'):]
    chart = chart[:chart.index("</svg>")]
    assert chart.count('class="flag ') == 2  # suspected, then regression
    assert 'class="band"' in chart
    # the change point's line sits between the last steady night and the first flagged one
    steady = [float(x) for x in re.findall(r'class="night" cx="([\d.]+)"', chart)]
    flagged = [float(x) for x in re.findall(r'class="flag [a-z]+" cx="([\d.]+)"', chart)]
    (line,) = re.findall(r'class="change-point" x1="([\d.]+)"', chart)
    assert len(steady) == NIGHTS - 2 and max(steady) < float(line) < min(flagged)
    assert page.index('id="attention"') < page.index(f'id="{chart_id}"') < page.index('id="score-card"')
    assert 'id="latency-fanin.q1.c100"' in page and "status <b class=\"status-ok\">ok</b>" in page

    boxes, png = _boxes_and_screenshot(html, tmp_path, ["attention", chart_id])
    for name, (_left, top, width, height) in boxes.items():
        assert width > 100 and height > 100 and 0 <= top and top + height <= 2000, (name, boxes)
    red, band = (214, 39, 40), (230, 230, 230)
    attention = _pixels(png, boxes["attention"])
    assert attention.count(red) > 2 * boxes["attention"][2]  # its red border, drawn
    drawn = _pixels(png, boxes[chart_id])
    assert drawn.count(band) > 200 and drawn.count(red) > 20  # the noise band, the red nights


def test_a_quiet_night_says_nothing_needs_a_human(regressed, tmp_path):
    store, run_id = regressed
    stages = store.stages(run_id)
    for c in stages[0]["comparisons"]:
        c["verdict"] = "unchanged"
    page = render(store.run(run_id), stages, [])
    box = page[page.index('id="attention"'):page.index("<h2>History</h2>")]
    assert "Nothing tonight" in box and 'id="regressions"' not in box


def test_a_history_whose_nights_differ_by_a_rounding_error_is_drawn():
    # two nights of delivered msg/s, 1000 and the next float up: the run of 2026-11-28
    # that met them failed in its report step (the axis's tick step rounded to nothing)
    nights = [Night(f"night {i}", value) for i, value in
              enumerate((1000.0, math.nextafter(1000.0, 2000.0)))]
    svg = history_chart(nights, title="delivered_rate night by night", y_label="msg/s")
    assert svg.startswith("<svg") and "night 1" in svg
    assert re.search(r">1(\.0+)?k<", svg)  # the value is on the axis


def test_values_read_in_the_unit_the_report_and_slack_show_them() -> None:
    """One rule for the report's cells and Slack's rows: latency in ms however large (no
    exponent), memory in MiB, a ratio in % with a tiny loss still seen (not 0.000%)."""
    from tasks.views.units import show, with_unit

    assert [with_unit("e2e_latency_p99", v) for v in (999.6, 1_234_567.0, 2_500_000.0)] == [
        "1.000 ms", "1,235 ms", "2,500 ms"]
    assert with_unit("broker_rss_per_1k_conn", 3 * 2**20) == "3 MiB"
    assert (with_unit("loss_ratio", 2e-6), with_unit("loss_ratio", 0.0)) == ("0.0002%", "0%")
    assert with_unit("delivered_rate", None) == "n/a" and show(None) == "–"
    assert show(1_234_567.0, "e2e_latency_p99") == "1,235"
