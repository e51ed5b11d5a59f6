"""Print (or write) the configuration of a configuration-only broker.

    python -m tasks.brokers.render ibmmq --qmgr PERF0 --port 1883 [--out DIR]
    python -m tasks.brokers.render emqx --port 1883
    python -m tasks.brokers.render tbmq --port 1883

perfpipe cannot start these brokers; this is what a human (or an existing installation's
automation) applies before pointing an inventory at the broker with ``managed: false``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .emqx import Emqx
from .ibmmq import IbmMq
from .tbmq import Tbmq


def render(kind: str, args: argparse.Namespace) -> dict[str, str]:
    if kind == "ibmmq":
        return IbmMq().render(qmgr=args.qmgr, channel=args.channel, port=args.port,
                              mcauser=args.mcauser, xms=args.heap, xmx=args.heap)
    if kind == "emqx":
        return Emqx().render(port=args.port)
    return Tbmq().render(port=args.port, heap=args.heap)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.brokers.render", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=["ibmmq", "emqx", "tbmq"])
    parser.add_argument("--port", type=int, default=1883, help="MQTT port (default 1883)")
    parser.add_argument("--qmgr", default="PERF0", help="ibmmq: queue manager name")
    parser.add_argument("--channel", default="PERFPIPE.MQTT", help="ibmmq: MQTT channel name")
    parser.add_argument("--mcauser", default=None, help="ibmmq: MCAUSER of the MQTT channel")
    parser.add_argument("--heap", default=None, help="ibmmq: MQXR heap (4096M); tbmq: JVM heap (2048M)")
    parser.add_argument("--out", type=Path, default=None, help="write the files into this folder")
    args = parser.parse_args(argv)
    args.heap = args.heap or ("4096M" if args.kind == "ibmmq" else "2048M")
    try:
        files = render(args.kind, args)
    except ValueError as exc:
        print(f"{args.kind}: {exc}", file=sys.stderr)
        return 2
    for name, text in files.items():
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / name).write_text(text)
            print(args.out / name)
        else:
            print(f"===== {name}\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
