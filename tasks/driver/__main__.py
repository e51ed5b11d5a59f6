"""Run one driver process: ``python -m tasks.driver --spec spec.json --out DIR``.

Connects the spec's clients, writes ``ready.json`` into DIR, waits for ``start.json``
(``{"start_at": <unix seconds>}``, written by the orchestrator once every process on
every host is ready), runs the stage and writes the raw files described in
`tasks.driver.output`. Exit code 0: complete; 1: partial or failed (the files are still
written); 2: the spec was rejected.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .engine import Engine
from .spec import SpecError, load_spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.driver", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True, type=Path, help="stage spec JSON for this process")
    parser.add_argument("--out", required=True, type=Path, help="directory for the raw files")
    args = parser.parse_args(argv)
    try:
        engine = Engine(load_spec(args.spec), args.out)  # its TLS files are read here
    except SpecError as exc:
        print(f"spec rejected: {exc}", file=sys.stderr)
        return 2
    summary = engine.run()
    print(json.dumps({k: summary[k] for k in ("status", "totals", "windows")}))
    return 0 if summary["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
