"""The load generators bench_driver.py runs side by side, one process each, all through the
same protocol: `ready()` once every client is connected (and subscribed), `start(windows)`
with the run's Unix-second windows, `result(windows, column)` with what it counted in the
measure window, `kill()`. perfpipe's driver (`python -m tasks.driver`, as the pipeline
starts it), MQTT.js (bench/mqttjs_bench.js), and the floors: bench/floor_sender.py and
bench/floor_reader.py, CPython loops that do nothing per message but send or read.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))
from tasks.driver.histogram import percentile  # noqa: E402


def ensure_mqttjs() -> None:
    if (BENCH / "node_modules" / "mqtt" / "package.json").exists():
        return
    if not shutil.which("npm"):
        sys.exit("npm is needed for the MQTT.js side (apt-get install npm)")
    command = ["npm", "ci"] if (BENCH / "package-lock.json").exists() else ["npm", "install"]
    print(f"installing MQTT.js: {' '.join(command)} in {BENCH}", flush=True)
    subprocess.run(command + ["--no-audit", "--no-fund"], cwd=BENCH, check=True, timeout=300)


class Perfpipe:
    """One `python -m tasks.driver` process, run through its ready/start file protocol, from
    `repo` (this checkout, or another one: bench/ab_driver.py)."""

    name = "perfpipe"

    def __init__(self, workdir: Path, spec: dict, repo: Path = REPO) -> None:
        self.out = workdir / f"pp-{spec['stage_id']}-{time.monotonic_ns()}"
        self.out.mkdir(parents=True)
        (self.out / "spec.json").write_text(json.dumps(spec))
        self.log = open(self.out / "driver.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tasks.driver", "--spec", str(self.out / "spec.json"),
             "--out", str(self.out)], cwd=repo, stdout=self.log, stderr=subprocess.STDOUT)
        self.pid = self.process.pid

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"driver exited early: {(self.out / 'driver.log').read_text()}")
        return (self.out / "ready.json").exists()

    def start(self, windows: dict) -> None:
        (self.out / "start.json").write_text(json.dumps({"start_at": windows["start"]}))

    def result(self, windows: dict, column: str) -> dict:
        """`column` counted in the measure window, errors (failed connects among them, as
        MQTT.js counts its connect errors), send lateness p50/p90/p99 (us),
        the e2e p50 (us), the longest read hold (ms) and the share of kernel-stamped reads
        that may have taken more than one TCP segment (%, an upper bound: their older
        messages got a newer segment's arrival time); None where nothing was measured."""
        self.process.wait(60)
        self.log.close()
        window = range(windows["measure_start"], windows["measure_end"])
        with open(self.out / "counters.csv") as handle:
            rows = list(csv.DictReader(handle))
        count = sum(int(r[column]) for r in rows if int(r["second"]) in window)
        errors = sum(int(r["errors"]) + int(r["connects_failed"]) for r in rows)
        delays: dict[int, int] = {}
        e2e: dict[int, int] = {}
        with open(self.out / "histograms.csv") as handle:
            for r in csv.DictReader(handle):
                kind = {"pub_delay": delays, "e2e": e2e}.get(r["kind"])
                if kind is not None and int(r["second"]) in window:
                    bucket = int(r["bucket"])
                    kind[bucket] = kind.get(bucket, 0) + int(r["count"])
        late = {f"p{q}": percentile(delays, q) for q in (50, 90, 99)} if delays else None
        hold = json.loads((self.out / "summary.json").read_text())["read_hold"]
        reads, segments = hold["stamped_reads"], hold["segments_in"]
        return {"count": count, "errors": errors, "late_us": late,
                "e2e_p50_us": percentile(e2e, 50) if e2e else None,
                "hold_max_ms": hold["max_ms"],
                "multi_segment_pct": (100 * max(0, segments - reads) / reads
                                      if reads and segments is not None else None)}

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


class MqttJs:
    """One Node process running bench/mqttjs_bench.js."""

    name = "mqtt.js"
    command = ["node", str(BENCH / "mqttjs_bench.js")]

    def __init__(self, config: dict) -> None:
        self.process = subprocess.Popen([*self.command, json.dumps(config)], cwd=BENCH, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL)
        self.pid = self.process.pid
        self._ready = False

    def ready(self) -> bool:
        if not self._ready:
            line = self.process.stdout.readline()  # blocks until READY (bounded by caller)
            if not line:
                raise RuntimeError(f"{self.name} exited before it was ready")
            self._ready = line.strip() == "READY"
        return self._ready

    def start(self, windows: dict) -> None:
        self.process.stdin.write(json.dumps(windows) + "\n")
        self.process.stdin.flush()

    def result(self, windows: dict, column: str) -> dict:
        """As `Perfpipe.result`, from the JSON line the process prints."""
        line = self.process.stdout.readline()
        self.process.wait(30)
        doc = json.loads(line)
        return {"count": int(doc["count"]), "errors": int(doc["errors"]),
                "late_us": doc.get("late_us"), "e2e_p50_us": None, "hold_max_ms": None,
                "multi_segment_pct": None}

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


class Floor(MqttJs):
    """bench/floor_sender.py: the least a CPython sender can spend (same protocol)."""

    name = "floor"
    command = [sys.executable, str(BENCH / "floor_sender.py")]


class FloorReader(MqttJs):
    """bench/floor_reader.py: a reader that does nothing per message (same protocol)."""

    name = "floor"
    command = [sys.executable, str(BENCH / "floor_reader.py")]
