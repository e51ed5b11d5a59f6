"""A Slack client from an Airflow Slack Connection, through the Slack provider's hook."""

from __future__ import annotations

from slack_sdk import WebClient
from slack_sdk.http_retry import RetryHandler


def connection_client(conn_id: str, retry_handlers: list[RetryHandler],
                      timeout: int) -> WebClient | None:
    """The WebClient of an Airflow Slack Connection, or None when it is not defined or has
    no token (a deployment may define it with an empty token to mean "files only")."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.providers.slack.hooks.slack import SlackHook
    from airflow.sdk import BaseHook

    try:
        if not BaseHook.get_connection(conn_id).password:
            return None
    except AirflowNotFoundException:
        return None
    return SlackHook(slack_conn_id=conn_id, retry_handlers=retry_handlers,
                     timeout=timeout).client
