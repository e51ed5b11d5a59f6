"""perfpipe's driver from two checkouts on one bench_driver row, alternated: what a change
to the driver buys, where its own figure moves less than the machine does.

    .state/venv/bin/python bench/ab_driver.py B [--a A] [--row pub-q0-c1000-r50k] [--reps 6]

A and B are checkouts of this repository (directories) or git revisions of it (each gets
a temporary worktree, removed at the end); A is this checkout by default. Each repetition
runs both once, A then B, then B then A, and so on, as `bench_driver.run_once` runs
perfpipe on the row (its tick, its spec; ``--tool perfpipe@tick_us=0`` for another
setting) against one Mosquitto. It prints every run (msgs per CPU-second; the driver's CPU,
its system time and the broker's CPU in microseconds a message; how often a message found
the broker asleep; send lateness p99) and the medians, with the median of the paired
B / A ratios of msgs per CPU-second; a pair with a run disturbed three times (nothing
counted, or errors) is left out. On a subscribe row the feeding publishers are this
checkout's driver for both.

Only the pairs compare, and even they move: on this 2-vCPU VM an A/A run (B = HEAD) of
the 1000-client fixed-rate row gave paired ratios from 0.91 to 1.03, the same driver
spending 4.5 to 5.6 us of user time a message from run to run (bench/README.md), more
than most changes to it are worth. bench_scheduler.py measures the scheduler's Python
alone, without the kernel's share.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_driver as bd  # noqa: E402
from broker_side import Broker, SysCounter, raise_nofile  # noqa: E402
from load_tools import REPO  # noqa: E402


def checkout(stack: ExitStack, where: str, name: str) -> Path:
    """`where` (the argument `name`) as a directory to run the driver from: a checkout as
    given, or a temporary worktree of the git revision it names."""
    path = Path(where)
    if path.is_dir():
        if not (path / "tasks" / "driver").is_dir():
            raise SystemExit(f"{name} {where}: not a perfpipe checkout (no tasks/driver in "
                             "it); give a checkout of this repository or a git revision")
        return path.resolve()
    parent = Path(tempfile.mkdtemp(prefix="ab-driver-"))
    stack.callback(shutil.rmtree, parent, ignore_errors=True)
    worktree = parent / "tree"
    made = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q",
                           str(worktree), where], capture_output=True, text=True)
    if made.returncode:
        raise SystemExit(f"{name} {where}: neither a directory nor a git revision of {REPO} "
                         f"({made.stderr.strip()})")
    stack.callback(subprocess.run, ["git", "-C", str(REPO), "worktree", "remove",
                                    "--force", str(worktree)], check=False)
    return worktree


def line(tag: str, figure: dict) -> str:
    if bd.disturbed(figure):
        return f"  {tag}  disturbed three times (rate {figure['rate']:.0f}, errors " \
               f"{figure['errors']}): its pair is left out"
    tool_us, sys_us, broker_us = bd.us_per_message(figure)
    late = (figure["late_us"] or {}).get("p99")
    return (f"  {tag}  {figure['per_cpu_s'] / 1e3:6.1f}K msgs/CPU-s  driver {tool_us:5.2f} us/msg "
            f"(sys {sys_us:5.2f})  broker {broker_us:5.2f} us/msg, woke "
            f"{figure['broker_wakes_per_msg']:.3f}/msg  send p99 "
            + (f"{late / 1000:.2f} ms" if late is not None else "-")
            + f"  errors {figure['errors']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("b", help="the changed driver: a checkout or a git revision")
    parser.add_argument("--a", default=str(REPO),
                        help="the driver to compare with (default: this checkout)")
    parser.add_argument("--row", default="pub-q0-c1000-r50k",
                        help=f"a bench_driver row: {', '.join(bd.SCENARIOS)}")
    parser.add_argument("--tool", default="perfpipe",
                        help="perfpipe, or perfpipe@SETTING=N (as bench_driver names them)")
    parser.add_argument("--reps", type=int, default=6, help="pairs (at least 1)")
    parser.add_argument("--quick", action="store_true", help="1 s warm-up, 4 s window")
    args = parser.parse_args(argv)
    if args.row not in bd.SCENARIOS:
        parser.error(f"--row {args.row}: not a bench_driver row; one of "
                     f"{', '.join(bd.SCENARIOS)}")
    try:
        tool, _ = bd.tool_variant(args.tool)
    except ValueError:
        parser.error(f"--tool {args.tool}: perfpipe@SETTING=N, N a whole number")
    if tool != "perfpipe":
        parser.error(f"--tool {args.tool}: only perfpipe's driver comes from a checkout")
    if args.reps < 1:
        parser.error(f"--reps {args.reps}: at least 1 pair")
    timing = ({"warmup_s": 1, "measure_s": 4, "drain_s": 1} if args.quick
              else {"warmup_s": 3, "measure_s": 12, "drain_s": 1})
    raise_nofile()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # still stop the broker, worktrees
    figures: dict[str, list[dict]] = {"A": [], "B": []}
    with ExitStack() as stack:
        trees = {"A": checkout(stack, args.a, "--a"), "B": checkout(stack, args.b, "B")}
        print(f"A {trees['A']}\nB {trees['B']}\n{args.tool} on {args.row}, "
              f"{args.reps} alternated pairs", flush=True)
        workdir = Path(tempfile.mkdtemp(prefix="perfpipe-ab-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        broker = Broker(workdir)
        stack.callback(broker.stop)
        counter = SysCounter(broker.port)
        for rep in range(args.reps):
            for tag in ("A", "B") if rep % 2 == 0 else ("B", "A"):
                figure = bd.run_undisturbed(args.tool, args.row, broker, counter, workdir,
                                            timing, f"rep {rep + 1} {tag}", trees[tag])
                figures[tag].append(figure)
                print(line(tag, figure), flush=True)
    print()
    pairs = [(a, b) for a, b in zip(figures["A"], figures["B"])
             if not (bd.disturbed(a) or bd.disturbed(b))]
    if not pairs:
        print("no pair ran undisturbed: nothing to compare")
        return 1
    for tag, rows in (("A", [a for a, _ in pairs]), ("B", [b for _, b in pairs])):
        per_message = [bd.us_per_message(f) for f in rows]
        print(f"{tag} (median of {len(rows)}): "
              f"{statistics.median(f['per_cpu_s'] for f in rows) / 1e3:.1f}K msgs/CPU-s, driver "
              f"{statistics.median(p[0] for p in per_message):.2f} us/msg (user "
              f"{statistics.median(p[0] - p[1] for p in per_message):.2f}, sys "
              f"{statistics.median(p[1] for p in per_message):.2f}), broker "
              f"{statistics.median(p[2] for p in per_message):.2f} us/msg")
    ratios = [b["per_cpu_s"] / a["per_cpu_s"] for a, b in pairs]
    print(f"B / A msgs per CPU-second, paired: median {statistics.median(ratios):.3f} "
          f"({' / '.join(f'{r:.2f}' for r in ratios)})"
          + (f"; {len(figures['A']) - len(pairs)} disturbed pairs left out"
             if len(pairs) < len(figures["A"]) else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
