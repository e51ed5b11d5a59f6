"""Slack as perfpipe uses it: post a message (top level or in a thread) and update one.

`SlackNotifier` is handed its slack-sdk `WebClient`; `notifier_for` picks that client:
under Airflow, the Slack provider's `SlackHook` on the `slack_conn_id` Connection (token
in the password, an optional `base_url` in the extra); otherwise, or when that Connection
does not exist, `PERFPIPE_SLACK_TOKEN`. With neither there is no client, and callers write
the message to a file instead. The token stays inside the client: it is never logged,
written or returned, and errors carry only Slack's error code.

Rate limits (429 with Retry-After) and server errors are retried by slack-sdk's own retry
handlers, a rate limit only when Slack asks to wait at most `RETRY_AFTER_CAP_S` (a longer
wait would hold the run; its alerts are kept for the next one instead), and every HTTP
request gives up after `CALL_TIMEOUT_S` (so one call, its retries included, may take up
to about 3.5 minutes at worst: 8 requests and 3 waits); what still fails raises `SlackError`.
"""

from __future__ import annotations

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry import HttpRequest, HttpResponse, RetryHandler, RetryState
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)

from ..settings import Settings


# What Slack answers about a message itself (its blocks, its length): the same message is
# refused every time, whoever sends it and whenever
MESSAGE_REFUSED = frozenset({"invalid_blocks", "invalid_blocks_format", "msg_too_long",
                             "no_text", "invalid_attachments", "too_many_attachments"})


class SlackError(RuntimeError):
    """Slack could not be reached or refused the call; names the Slack error, never the token.
    `refused`: Slack answered and turned this call down (a bad message, a missing channel),
    not a rate limit or a server or transport failure that the next call may not meet."""

    def __init__(self, message: str, *, refused: bool = False, code: str | None = None
                 ) -> None:
        super().__init__(message)
        self.refused = refused
        self.code = code  # Slack's error code, when it answered


RETRY_AFTER_CAP_S = 30  # a rate limit asking for a longer wait is not waited out
CALL_TIMEOUT_S = 15  # one HTTP call to Slack


class CappedRateLimitRetry(RateLimitErrorRetryHandler):
    """slack-sdk's rate-limit retry, but only for a Retry-After of at most `cap_s`."""

    def __init__(self, max_retry_count: int = 3, cap_s: float = RETRY_AFTER_CAP_S) -> None:
        super().__init__(max_retry_count=max_retry_count)
        self.cap_s = cap_s

    def _can_retry(self, *, state: RetryState, request: HttpRequest,
                   response: HttpResponse | None = None, error: Exception | None = None) -> bool:
        if not super()._can_retry(state=state, request=request, response=response, error=error):
            return False
        asked = next((values[0] for name, values in response.headers.items()
                      if name.lower() == "retry-after"), "1")
        try:
            return float(asked) <= self.cap_s
        except ValueError:
            return False


def retry_handlers() -> list[RetryHandler]:
    return [CappedRateLimitRetry(max_retry_count=3), ServerErrorRetryHandler(max_retry_count=2),
            ConnectionErrorRetryHandler(max_retry_count=2)]


class SlackNotifier:
    def __init__(self, client: WebClient | None, channel: str) -> None:
        self.client = client
        self.channel = channel

    @property
    def enabled(self) -> bool:
        return self.client is not None

    def post(self, message: dict, *, thread_ts: str | None = None) -> str:
        """Post `message` ({"text", "blocks"}); returns its ts (the thread's key)."""
        response = self._call("chat_postMessage", channel=self.channel, text=message["text"],
                              blocks=message.get("blocks"), thread_ts=thread_ts)
        return response["ts"]

    def update(self, ts: str, message: dict) -> str:
        """Replace the message posted at `ts` (a retried step re-sends, never re-posts)."""
        response = self._call("chat_update", channel=self.channel, ts=ts, text=message["text"],
                              blocks=message.get("blocks"))
        return response["ts"]

    def _call(self, method: str, **kwargs):
        if self.client is None:
            raise SlackError("no Slack client: set PERFPIPE_SLACK_TOKEN or the Airflow Connection")
        try:
            return getattr(self.client, method)(**kwargs)
        except SlackApiError as exc:
            status = exc.response.status_code
            raise SlackError(f"Slack refused {method}: {exc.response.get('error')} "
                             f"(HTTP {status})", refused=status != 429 and status < 500,
                             code=exc.response.get("error")) from None
        except (SlackClientError, OSError) as exc:
            raise SlackError(f"Slack unreachable for {method}: {type(exc).__name__}") from None


def token_client(token: str, base_url: str | None = None) -> WebClient:
    return WebClient(token=token, base_url=base_url or WebClient.BASE_URL,
                     timeout=CALL_TIMEOUT_S, retry_handlers=retry_handlers())


def notifier_for(settings: Settings, *, airflow: bool = False) -> SlackNotifier:
    """The notifier for this process: the Airflow Connection first when running under
    Airflow, then the token from the environment, else none (messages go to files)."""
    client = None
    if airflow:
        from ..airflow_glue.slack import connection_client

        client = connection_client(settings.slack_conn_id, retry_handlers(), CALL_TIMEOUT_S)
    if client is None and settings.slack_token is not None:
        client = token_client(settings.slack_token.get_secret_value(), settings.slack_base_url)
    return SlackNotifier(client, settings.slack_channel)
