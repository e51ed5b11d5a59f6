"""The results database from an Airflow Connection (`PERFPIPE_DB_CONN_ID`).

Deployments keep the results-DB password where Airflow keeps its other secrets (a
Connection in the metadata DB, an `AIRFLOW_CONN_*` variable or a secrets backend) instead
of in a second variable. Only PostgreSQL Connections are accepted: SQLite needs no secret.
"""

from __future__ import annotations

from sqlalchemy.engine import URL

POSTGRES_TYPES = ("postgres", "postgresql")


def url_from_connection(conn_id: str) -> str:
    """A SQLAlchemy URL (psycopg 3 driver) for the Connection; the password stays inside
    the returned string, which callers only ever show through `Store.url_for_display`."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    if conn.conn_type not in POSTGRES_TYPES:
        raise ValueError(f"PERFPIPE_DB_CONN_ID: Connection {conn_id!r} is of type "
                         f"{conn.conn_type!r}; make it a postgres Connection, or set "
                         "PERFPIPE_DB_URL instead")
    url = URL.create("postgresql+psycopg", username=conn.login, password=conn.password,
                     host=conn.host, port=conn.port, database=conn.schema)
    return url.render_as_string(hide_password=False)
