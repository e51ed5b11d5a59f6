"""Step 8, compare: judge every stage of a run against its history and record verdicts."""

from __future__ import annotations

from collections import Counter

from .compare import Policy, compare_stage
from .run_context import RunContext

VERDICTS_FILE = "verdicts.json"


def compare_run(ctx: RunContext, policy: Policy = Policy()) -> dict:
    store = ctx.store()
    verdicts = []
    for stage in store.stages(ctx.run_id):
        history = store.history(stage["stage_key"], stage["fingerprint_hash"],
                                before_run=ctx.run_id)
        verdicts += compare_stage(stage["stage_id"], stage["metrics"], stage["series"],
                                  stage["validity"], history, policy)
    rows = [v.to_dict() for v in verdicts]
    store.record_comparisons(ctx.run_id, rows)
    ctx.write_json(VERDICTS_FILE, {"verdicts": rows})
    return dict(Counter(v.verdict for v in verdicts))
