"""Fail-fast rules for a running stage: pure, progress snapshots in, a reason out.

Every driver process writes ``progress.json`` once a second (cumulative counters, see
`tasks.driver.output`). The orchestrator reads them while the stage runs; when too many
connections failed or too many operations errored, it stops the stage early rather than
spend the whole window measuring a broker that is refusing or dropping clients. The
stage is then reported invalid with the rule that stopped it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FailFast:
    max_connect_failure_ratio: float = 0.05  # of the stage's clients
    max_error_ratio: float = 0.01  # client errors per message sent or received
    min_messages: int = 200  # judge the error ratio only once this many went through


def breach(progress: list[dict], rule: FailFast = FailFast()) -> str | None:
    """The first rule the stage breaks, judged over every process's latest snapshot."""
    if not progress:
        return None
    total = {k: sum(p.get(k, 0) for p in progress)
             for k in ("clients", "connects_failed", "errors", "published", "received")}
    if total["clients"] and \
            total["connects_failed"] > rule.max_connect_failure_ratio * total["clients"]:
        return (f"{total['connects_failed']} of {total['clients']} connections failed "
                f"(fail-fast above {rule.max_connect_failure_ratio:.0%})")
    messages = total["published"] + total["received"]
    if messages >= rule.min_messages and total["errors"] > rule.max_error_ratio * messages:
        return (f"{total['errors']} client errors for {messages} messages "
                f"(fail-fast above {rule.max_error_ratio:.0%})")
    return None


def progress_line(progress: list[dict], elapsed_s: float) -> str:
    """One line of live progress for the CLI and the task log."""
    sent = sum(p.get("published", 0) for p in progress)
    received = sum(p.get("received", 0) for p in progress)
    errors = sum(p.get("errors", 0) for p in progress)
    failed = sum(p.get("connects_failed", 0) for p in progress)
    rate = f" ({sent / elapsed_s:,.0f} msg/s sent)" if elapsed_s > 0 else ""
    return (f"    t+{elapsed_s:4.0f}s sent {sent:,}{rate}, received {received:,}, errors {errors}"
            + (f", connects failed {failed:,}" if failed else ""))
