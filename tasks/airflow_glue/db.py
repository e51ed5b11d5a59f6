"""The results database from an Airflow Connection (`PERFPIPE_DB_CONN_ID`).

Deployments keep the results-DB password where Airflow keeps its other secrets (a
Connection in the metadata DB, an `AIRFLOW_CONN_*` variable or a secrets backend) instead
of in a second variable. Only PostgreSQL Connections are accepted: SQLite needs no secret.
"""

from __future__ import annotations

from sqlalchemy.engine import URL

POSTGRES_TYPES = ("postgres", "postgresql")
# the Connection's extras libpq takes as connection parameters (TLS above all: a results
# database that asks for sslmode=verify-full must not quietly get libpq's `prefer`)
LIBPQ_EXTRAS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "sslpassword",
                "channel_binding", "gssencmode", "options", "application_name",
                "connect_timeout", "target_session_attrs", "keepalives", "keepalives_idle",
                "keepalives_interval", "keepalives_count")


def url_from_connection(conn_id: str) -> str:
    """A SQLAlchemy URL (psycopg 3 driver) for the Connection, with its libpq extras; the
    password stays inside the returned string, which callers only ever show through
    `Store.url_for_display` (which shows no query either)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ValueError(f"PERFPIPE_DB_CONN_ID={conn_id!r}: no such Airflow Connection; "
                         "add it (airflow connections add, or AIRFLOW_CONN_"
                         f"{conn_id.upper()}), or set PERFPIPE_DB_URL instead") from None
    if conn.conn_type not in POSTGRES_TYPES:
        raise ValueError(f"PERFPIPE_DB_CONN_ID: Connection {conn_id!r} is of type "
                         f"{conn.conn_type!r}; make it a postgres Connection, or set "
                         "PERFPIPE_DB_URL instead")
    extras = conn.extra_dejson
    url = URL.create("postgresql+psycopg", username=conn.login, password=conn.password,
                     host=conn.host, port=conn.port, database=conn.schema,
                     query={k: str(extras[k]) for k in LIBPQ_EXTRAS if extras.get(k) is not None})
    return url.render_as_string(hide_password=False)
