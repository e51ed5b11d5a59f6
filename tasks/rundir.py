"""Every path inside a run folder, in one place: the README's run-folder table as code.

Paths are relative to the run folder (`Settings.run_dir(run_id)` here, `<work_root>/<run
id>` on an SSH host). The files one driver process writes inside its folder are the
driver's own contract (`tasks.driver.output`, shipped to hosts without this package).
Pure: names only, no I/O.
"""

from __future__ import annotations

from .driver.output import FAILFAST_FILE, STAGE_FILE

PLAN = "plan.json"  # suite, inventory and expanded stages (the plan step)
BROKER = "broker.json"  # the broker as the broker step found or started it
BROKER_GONE = "broker_gone.json"  # the broker died mid-run: when, in which stage, what was skipped
# broker.cpus_for: capacity: the CPUs of each broker thread before a search moved it (the
# stages step gives them back after it, or at its next attempt's start)
BROKER_MOVED = "broker_moved.json"
BROKER_DIR = "broker"  # a managed broker's config, log and data
TLS_DIR = "broker/tls"  # the run's throwaway CA and server certificate
SEARCH = "search.json"  # max-rate searches: probe stages and outcomes
HOSTS_DIR = "hosts"  # hosts/<host>.json: fingerprint (the provision step)
TUNING_DIR = "tuning"  # tuning/<host>.json: values read back (the tune step)
PROCESSES_DIR = "processes"  # processes/<stage>.json: launched process groups, for teardown
STEPS_DIR = "steps"  # steps/<step>[@<host>].done: the steps that finished
RAW_DIR = "raw"  # raw/<stage>/...: driver and sampler output
MANIFEST = "raw/MANIFEST.json"  # every raw file's size and SHA-256 (the collect step)
METRICS_DIR = "metrics"  # the Spark job's output: these two files
STAGE_METRICS_JSON = "stage_metrics.json"
STAGE_METRICS_PARQUET = "stage_metrics.parquet"
STAGE_METRICS = f"{METRICS_DIR}/{STAGE_METRICS_JSON}"
VERDICTS = "verdicts.json"  # the compare step's verdicts
REPORT = "report.html"
SLACK_MESSAGE = "slack_message.json"  # what the alert step sent, or would have
ERROR_LOG = "error.log"  # the trace of a failed run (perfpipe run)
FAILURES_DIR = "failures"  # failure alerts of Airflow tasks
DISCARDED_DIR = "discarded"  # discarded/<n>/: what an earlier attempt of the stages step left
SAMPLER = "sampler"  # raw/<stage>/<broker host>/sampler/: the broker sampler's folder


def host_file(host: str) -> str:
    return f"{HOSTS_DIR}/{host}.json"


def tuning_file(host: str) -> str:
    return f"{TUNING_DIR}/{host}.json"


def processes_file(stage_id: str) -> str:
    return f"{PROCESSES_DIR}/{stage_id}.json"


def step_mark(step: str, host: str | None = None) -> str:
    return f"{STEPS_DIR}/{step}{'@' + host if host else ''}.done"


def stage_dir(stage_id: str) -> str:
    return f"{RAW_DIR}/{stage_id}"


def stage_file(stage_id: str) -> str:
    """What the orchestrator intended for the stage (windows, processes, expected rates)."""
    return f"{stage_dir(stage_id)}/{STAGE_FILE}"


def failfast_file(stage_id: str) -> str:
    """Why the stage was stopped early or never started, when it was."""
    return f"{stage_dir(stage_id)}/{FAILFAST_FILE}"


def drivers_failed_file(stage_id: str) -> str:
    """The stage's driver processes that died or exited with an error of their own."""
    return f"{stage_dir(stage_id)}/drivers_failed.json"


def process_dir(stage_id: str, host: str, proc: int | str) -> str:
    """One driver process's output folder (`tasks.driver.output` names its files)."""
    return f"{stage_dir(stage_id)}/{host}/{proc}"


def sampler_dir(stage_id: str, host: str) -> str:
    return f"{stage_dir(stage_id)}/{host}/{SAMPLER}"
