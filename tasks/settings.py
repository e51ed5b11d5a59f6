"""Where perfpipe keeps its state and which services it talks to, from PERFPIPE_* variables.

Read when a step runs, never at import time (an Airflow DAG file imports this package);
the DAG files read them once at parse time for the `suite` Param's choices
(`dags/perfpipe_graph.py`).
"""

from __future__ import annotations

import difflib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from .config_files import ConfigError

if TYPE_CHECKING:
    from sql import Store

REPO_ROOT = Path(__file__).resolve().parent.parent
PREFIX = "PERFPIPE_"
log = logging.getLogger(__name__)


class Settings(BaseSettings):
    """PERFPIPE_STATE_DIR, PERFPIPE_DB_URL, PERFPIPE_SLACK_TOKEN, ... (see README). A
    variable set to the empty string is not set (`PERFPIPE_SLACK_TOKEN=` posts nothing)."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", env_ignore_empty=True)

    state_dir: Path = REPO_ROOT / ".state"
    db_url: SecretStr | None = None  # default: SQLite under state_dir
    db_conn_id: str | None = None  # or an Airflow postgres Connection (tasks/airflow_glue/db.py)
    inventory: Path = REPO_ROOT / "infra" / "inventories" / "local.yml"
    scenarios_dir: Path = REPO_ROOT / "scenarios"
    tuning_dir: Path = REPO_ROOT / "infra" / "tuning"
    suite: str = "smoke"
    spark_master: str = "local[*]"
    slack_token: SecretStr | None = None
    slack_channel: str = "#perf-alerts"
    slack_base_url: str | None = None  # a Slack-compatible API root, e.g. for tests
    slack_conn_id: str = "perfpipe_slack"  # under Airflow: the Slack Connection, if defined
    airflow_base_url: str | None = None  # for links from alerts to the Airflow run
    report_base_url: str | None = None  # where run folders are served: <url>/<run id>/report.html
    # the watchdog's alarm: no nightly started for this long (at most ten years)
    nightly_max_age_h: float = Field(26.0, gt=0, le=87_600, allow_inf_nan=False)
    # how long a step waits for another run's step on the lab (nan would wait for ever)
    lab_wait_s: float = Field(4 * 3600.0, ge=0, allow_inf_nan=False)
    # how long a database down or locked is waited for, in seconds (not negative, nan or
    # inf; default: the store's own, sql.store.DB_RETRY_S)
    db_retry_s: float | None = Field(None, ge=0, allow_inf_nan=False)

    @property
    def runs_dir(self) -> Path:
        return self.state_dir / "runs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def store(self) -> Store:
        """The results store, waiting for a database that is down or locked up to
        `db_retry_s`."""
        from sql import Store

        retry = {} if self.db_retry_s is None else {"retry_s": self.db_retry_s}
        return Store(self.database_url(), **retry)

    def database_url(self) -> str:
        if self.db_url is not None:
            return self.db_url.get_secret_value()
        if self.db_conn_id:
            from .airflow_glue.db import url_from_connection

            return url_from_connection(self.db_conn_id)
        return f"sqlite:///{self.state_dir / 'results.db'}"


def misspelt(names: list[str]) -> dict[str, str]:
    """Each of `names` (environment variables) that is no setting but close to one ->
    that setting's variable: `PERFPIPE_DB_URI` -> `PERFPIPE_DB_URL`. Other PERFPIPE_
    names are left alone: an inventory may name any variable for a password."""
    known = [PREFIX + name.upper() for name in Settings.model_fields]
    return {name: close[0] for name in names
            if name.startswith(PREFIX) and name not in known
            and (close := difflib.get_close_matches(name, known, n=1, cutoff=0.85))}


_warned: set[str] = set()


def load_settings() -> Settings:
    """The settings from the environment, or a ConfigError naming each PERFPIPE_ variable
    that cannot be used, what it holds (never a secret's value) and what it needs. A
    variable that looks like a misspelt setting is warned of once per process: unread, it
    would leave the setting at its default (results in the local SQLite, say)."""
    for name, meant in misspelt(sorted(os.environ)).items():
        if name not in _warned:
            _warned.add(name)
            log.warning("%s is no perfpipe setting and is ignored: did you mean %s?",
                        name, meant)
    try:
        return Settings()
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            name = "_".join(str(part) for part in error["loc"])
            field = Settings.model_fields.get(name)
            secret = field is None or "SecretStr" in str(field.annotation)
            value = "" if secret else f"={error['input']!r}"
            problems.append(f"PERFPIPE_{name.upper()}{value}: "
                            f"{error['msg'].removeprefix('Value error, ')}")
        raise ConfigError("\n".join(problems)) from None
