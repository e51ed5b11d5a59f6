"""A local HTTP server that speaks the Slack Web API methods perfpipe uses.

It records every request (method, headers, parsed body) and answers like Slack:
`chat.postMessage` returns a new `ts` (and the thread's), `chat.update` echoes the `ts`.
`fail_next(status, retry_after)` makes the next call answer 429 (with Retry-After) or a
5xx, to exercise slack-sdk's retry handlers; `refused` set to an error code (e.g.
"invalid_auth") makes every call answer it, as Slack does (HTTP 200, ok false); a
message past Block Kit's limits (50 blocks, a header of 150 characters, a section text of
3000) is refused `invalid_blocks`, as Slack refuses it;
`on_call(method)`, when set, runs before each
answer (to inject a fault at that moment). Bound to 127.0.0.1 on a free port.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs


@dataclass
class Call:
    method: str
    headers: dict
    body: dict


@dataclass
class FakeSlack:
    calls: list[Call] = field(default_factory=list)
    failures: list[tuple[int, int | None]] = field(default_factory=list)
    next_ts: int = 1000
    server: ThreadingHTTPServer | None = None
    on_call: Callable[[str], None] | None = None
    refused: str | None = None

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address
        return f"http://{host}:{port}/api/"

    def fail_next(self, status: int, retry_after: int | None = None) -> None:
        self.failures.append((status, retry_after))

    def posts(self) -> list[Call]:
        return [c for c in self.calls if c.method == "chat.postMessage"]

    def answer(self, method: str, body: dict) -> dict:
        if self.refused:
            return {"ok": False, "error": self.refused}
        if method in ("chat.postMessage", "chat.update") and not within_limits(body):
            return {"ok": False, "error": "invalid_blocks"}
        if method == "chat.postMessage":
            self.next_ts += 1
            return {"ok": True, "channel": body.get("channel", "C1"),
                    "ts": f"{self.next_ts}.000100", "message": {"text": body.get("text", "")}}
        if method == "chat.update":
            return {"ok": True, "channel": body.get("channel"), "ts": body.get("ts")}
        if method == "auth.test":
            return {"ok": True, "user_id": "U1", "team": "perfpipe"}
        return {"ok": False, "error": "unknown_method"}


def within_limits(body: dict) -> bool:
    """Whether a message's blocks are within Block Kit's limits, as Slack checks them."""
    blocks = body.get("blocks") or []
    if isinstance(blocks, str):
        blocks = json.loads(blocks)
    longest = {"header": 150, "section": 3000}
    return len(blocks) <= 50 and all(
        len((b.get("text") or {}).get("text", "")) <= longest.get(b["type"], 3000)
        for b in blocks)


def _handler(slack: FakeSlack):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            method = self.path.rsplit("/", 1)[-1]
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            if "json" in self.headers.get("Content-Type", ""):
                body = json.loads(raw or "{}")
            else:
                body = {k: v[0] for k, v in parse_qs(raw).items()}
            slack.calls.append(Call(method, dict(self.headers), body))
            if slack.on_call is not None:
                slack.on_call(method)
            if slack.failures:
                status, retry_after = slack.failures.pop(0)
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", str(retry_after))
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                error = "ratelimited" if status == 429 else "internal_error"
                self.wfile.write(json.dumps({"ok": False, "error": error}).encode())
                return
            payload = json.dumps(slack.answer(method, body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

    return Handler


def start() -> FakeSlack:
    slack = FakeSlack()
    slack.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(slack))
    threading.Thread(target=slack.server.serve_forever, daemon=True).start()
    return slack


def stop(slack: FakeSlack) -> None:
    slack.server.shutdown()
    slack.server.server_close()
