"""Wall time of the reconciliation sweep (numdev-bench experiment=reconcile) on this machine. Prints JSON.

    python scripts/bench_reconcile.py                       # the default sweep, once
    python scripts/bench_reconcile.py --repeats 3           # median of 3
    python scripts/bench_reconcile.py -- shape.seq_q=2048   # any overrides after --, e.g. the demo size
    python scripts/bench_reconcile.py --keep outputs/reconcile   # keep the sweep's output (one repeat)

Each repeat is a fresh `numdev-bench` process (imports included, as a user runs it) writing into a
temporary directory. The sweep pins torch to the thread count in its config (threads=1); the JSON
records it, the overrides, the machine and the versions (numdev.runs.provenance). Budget: the default
sweep should take <= 5 min on a quiet 2-core machine.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from numdev.cli.script_args import ScriptParser, run_script
from numdev.runs.scratch import scratch


def main() -> None:
    parser = ScriptParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="run the sweep into this new directory and keep it (one repeat)")
    parser.add_argument("overrides", nargs="*", help="numdev-bench overrides (after --)")
    args = parser.parse_args()
    if args.keep is not None and (args.repeats != 1 or args.keep.exists()):
        parser.error(f"--keep {args.keep}: takes one repeat and a directory that does not exist yet")
    seconds, summary = [], {}
    for _ in range(args.repeats):
        with scratch("numdev_bench_reconcile_") as tmp:
            root = args.keep.resolve() if args.keep is not None else Path(tmp)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "numdev.bench.app", "experiment=reconcile", f"output_root={root}", *args.overrides],
                           check=True, stdout=subprocess.DEVNULL)
            seconds.append(time.perf_counter() - start)
            (path,) = Path(root).glob("bench/reconcile/*/reconcile.json")
            summary = json.loads(path.read_text())
            records = (path.parent / "results.jsonl").read_text().count("\n")
    print(json.dumps({
        "experiment": "reconcile",
        "overrides": args.overrides,
        "seq_q": summary.get("seq_q"),
        "seeds": summary.get("provenance", {}).get("seeds"),
        "records": records,
        "repeats": args.repeats,
        "seconds": seconds,
        "median_seconds": statistics.median(seconds),
        "budget_seconds": 300,
        "provenance": summary.get("provenance"),
    }, indent=2))


if __name__ == "__main__":
    run_script(main)
