"""How long numdev's commands take to answer `--help` and common mistakes. Prints JSON.

    python scripts/bench_startup.py                 # every case, 5 repeats each
    python scripts/bench_startup.py --repeats 9

Each case runs the installed console command in a fresh process and times it to its exit (median
over repeats, wall seconds). Beside them, in the same run: a bare Python start and the imports the
commands defer (torch; numdev-train's run module with Lightning) as the floor and the cost avoided:
`--help`, a misspelled key, an unknown option and a missing sibling.reference need none of it; a
bad value (checked by building the optimizer and the attention backend) needs torch and Lightning.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from numdev.cli.script_args import ScriptParser, run_script
from numdev.runs.provenance import provenance
from numdev.runs.scratch import scratch

BIN = Path(sys.executable).parent
CASES = {  # name -> (command line, the exit status it must give)
    "python_start": ([sys.executable, "-c", "pass"], 0),
    "import_torch": ([sys.executable, "-c", "import torch"], 0),
    "import_train_run": ([sys.executable, "-c", "import numdev.train.run"], 0),  # what numdev-train imported before answering
    "train_help": ([str(BIN / "numdev-train"), "--help"], 0),
    "train_misspelled_key": ([str(BIN / "numdev-train"), "trainer.max_step=2"], 2),
    "train_unknown_option": ([str(BIN / "numdev-train"), "attention=nope"], 2),
    "train_missing_reference": ([str(BIN / "numdev-train"), "sibling.reference=/nonexistent/run"], 2),
    "train_bad_value": ([str(BIN / "numdev-train"), "optim.optimizer.lr=-1"], 2),
    "bench_help": ([str(BIN / "numdev-bench"), "--help"], 0),
    "bench_misspelled_key": ([str(BIN / "numdev-bench"), "seed=1"], 2),
    "study_help": ([str(BIN / "numdev-study"), "--help"], 0),
    "report_help": ([str(BIN / "numdev-report"), "--help"], 0),
    "compare_help": ([str(BIN / "numdev-compare"), "--help"], 0),
    "demo_help": ([str(BIN / "numdev-demo"), "--help"], 0),
}


def time_case(argv: list[str], expected: int, cwd: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=300)
    wall = time.perf_counter() - start
    if done.returncode != expected:
        raise SystemExit(f"bench_startup: {' '.join(argv)} exited {done.returncode}, expected {expected}: "
                         f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or ['(no output)']}")
    first = (done.stderr or done.stdout).strip().splitlines()
    return wall, (first[0][:160] if first else "")


def main() -> None:
    parser = ScriptParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each case (default 5)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")
    cases = {}
    with scratch("numdev_bench_startup_") as cwd:  # nothing a case writes lands in the checkout
        for _ in range(args.repeats):  # interleaved: a slow moment of the machine touches every case alike
            for name, (argv, expected) in CASES.items():
                wall, line = time_case(argv, expected, cwd)
                cases.setdefault(name, {"command": " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv)),
                                        "exit_status": expected, "first_line": line, "wall_s": []})["wall_s"].append(wall)
    for case in cases.values():
        case["median_s"] = statistics.median(case["wall_s"])
    deferred = cases["import_train_run"]["median_s"]
    print(json.dumps({
        "repeats": args.repeats,
        "cases": cases,
        "ratio_train_help_to_deferred_imports": cases["train_help"]["median_s"] / deferred,
        "load_average_after": os.getloadavg(),
        "provenance": provenance(threads=int(os.environ.get("OMP_NUM_THREADS", "0")) or None),
    }, indent=1))


if __name__ == "__main__":
    run_script(main)
