"""The environment perfpipe hands the processes it starts on this machine (the broker under
test, driver processes, the broker sampler, spark-submit): its own, less the secrets none
of them needs: the Slack token, the results DB's URL (it may hold a password), Airflow's
connections, keys and variables, and anything named like a password, token or secret.

A driver that reads its MQTT password from an environment variable (a scenario's
``connection.password_env``) is handed that variable by name (`keep`).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Mapping

SECRET_NAMES = ("PERFPIPE_SLACK_TOKEN", "PERFPIPE_DB_URL")
SECRET_PATTERNS = ("AIRFLOW_CONN_*", "AIRFLOW_VAR_*", "AIRFLOW__*SQL_ALCHEMY_CONN*",
                   "AIRFLOW__*FERNET_KEY*", "AIRFLOW__*SECRET_KEY*", "AIRFLOW__*JWT_SECRET*",
                   "*PASSWORD*", "*PASSWD*", "*TOKEN*", "*SECRET*", "*API_KEY*")


def is_secret(name: str) -> bool:
    upper = name.upper()
    return upper in SECRET_NAMES or any(fnmatch.fnmatchcase(upper, p) for p in SECRET_PATTERNS)


def child_env(keep: Iterable[str] = (), environ: Mapping[str, str] | None = None,
              **extra: str) -> dict[str, str]:
    """`environ` (default: this process's) without its secrets, except the names in `keep`,
    plus `extra`."""
    environ = os.environ if environ is None else environ
    kept = set(keep)
    return {**{k: v for k, v in environ.items() if k in kept or not is_secret(k)}, **extra}
