"""Wall time of the study, as `make demo` and the full study run it. Prints JSON.

    python scripts/bench_study.py                       # the demo's study (the early study, 3 replicates)
    python scripts/bench_study.py --which early         # the early-phase study (every role and rung, 10 replicates)
    python scripts/bench_study.py --which full          # the full study (3 replicates, parallel launcher, 2 jobs x 1 thread)
    python scripts/bench_study.py --which smoke --repeats 3
    python scripts/bench_study.py --which optimizations --keep outputs/optimizations   # the optimizations catalogue
    python scripts/bench_study.py --which full --keep outputs/study-full   # keep the study's directory
    python scripts/bench_study.py --which harm --keep outputs/harm         # the harm study (docs/harm.md)
    python scripts/bench_study.py --which harm_confirm --keep outputs/harm_confirm   # its confirmation on fresh replicates

Each repeat runs the real command line (numdev-train ...) into a fresh temporary directory and
times it end to end: process start, every run, the analysis. The JSON gives every repeat, their
median, each run's own time from its run.json, the command and the machine (numdev.runs.provenance).
Budgets (docs/study.md#budgets): demo study <= 6 min, early study <= 15 min, full study ~20 min,
smoke < 3 min, optimizations catalogue <= 20 min, the harm study <= 100 min on 2 cores. Each repeat also
gives every role's median run and step time (`per_role`): the study's cost per role-step.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from numdev.cli.demo import STUDY as DEMO_STUDY
from numdev.cli.script_args import ScriptParser, run_script
from numdev.runs.layout import RunDir, tree_bytes
from numdev.runs.provenance import provenance
from numdev.runs.scratch import scratch

COMMANDS = {
    "demo": list(DEMO_STUDY),
    "early": ["experiment=flash_stability_early"],
    "lowfloor": ["experiment=flash_stability_lowfloor"],
    "full": ["experiment=flash_stability"],
    "smoke": ["experiment=flash_stability_smoke"],
    "optimizations": ["experiment=optimizations"],
    "harm": ["experiment=harm"],
    "harm_confirm": ["experiment=harm_confirm"],
    "harm_smoke": ["experiment=harm_smoke"],
}
BUDGET_S = {"demo": 360, "early": 900, "lowfloor": 900, "full": 1200, "smoke": 180, "optimizations": 1200, "harm": 6000, "harm_confirm": 6000,
            "harm_smoke": 300}


def run_seconds(study_dir: Path) -> dict[str, float]:
    out = {}
    for record in sorted(study_dir.glob("r*/*/run.json")):
        run = RunDir(record.parent).read_record()  # checked: one line naming the file if truncated or forged
        if "started" not in run or "finished" not in run:
            raise ValueError(f"{record}: status {run['status']!r}, no start and finish time: not a finished run "
                             "(finish the study, or time another one)")
        try:
            start = datetime.datetime.strptime(run["started"], "%Y-%m-%dT%H:%M:%S%z")
            end = datetime.datetime.strptime(run["finished"], "%Y-%m-%dT%H:%M:%S%z")
        except ValueError as error:
            raise ValueError(f"{record}: started/finished are not times numdev writes ({error}): the record was edited") from None
        out[f"{record.parent.parent.name}/{record.parent.name}"] = (end - start).total_seconds()
    return out


def role_costs(study_dir: Path) -> dict[str, dict]:
    """Per role over its replicates: the median wall time of a run and of one training step (run.json step_seconds),
    and the steps: the study's cost per role-step, measured in the study itself (the same machine and load)."""
    by_role: dict[str, dict[str, list]] = {}
    for name, seconds in run_seconds(study_dir).items():
        replicate, role = name.split("/")
        run = RunDir(study_dir / replicate / role).read_record()
        entry = by_role.setdefault(role, {"run_s": [], "step_s": [], "steps": []})
        entry["run_s"].append(seconds)
        entry["steps"].append(run.get("final_step"))
        step = (run.get("step_seconds") or {}).get("median")
        if step is not None:
            entry["step_s"].append(step)
    return {role: {"runs": len(e["run_s"]), "median_run_s": statistics.median(e["run_s"]),
                   "median_step_s": statistics.median(e["step_s"]) if e["step_s"] else None, "steps": max(e["steps"])}
            for role, e in sorted(by_role.items())}


def main() -> None:
    parser = ScriptParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--which", choices=sorted(COMMANDS), default="demo")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="run the study into this new directory and keep it (one repeat)")
    parser.add_argument("overrides", nargs="*", help="extra numdev-train overrides")
    args = parser.parse_args()
    if args.keep is not None and (args.repeats != 1 or args.keep.exists()):
        parser.error(f"--keep {args.keep}: takes one repeat and a directory that does not exist yet")
    command = [*COMMANDS[args.which], "trainer.enable_progress_bar=false", *args.overrides]
    repeats = []
    for _ in range(args.repeats):
        with scratch("numdev_bench_study_") as tmp:
            study_dir = args.keep.resolve() if args.keep is not None else Path(tmp) / "study"
            load_before = os.getloadavg()
            cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "numdev.train.app", *command, f"hydra.sweep.dir={study_dir}"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp,
            )
            wall = time.perf_counter() - start
            # The 1/5/15-minute load averages around the repeat: on a shared machine, others' work is in the wall time.
            cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
            repeats.append({"wall_s": wall, "disk_bytes": tree_bytes(study_dir),  # what the study leaves on disk
                            "load_average_before": load_before, "load_average_after": os.getloadavg(),
                            # CPU seconds of the study's processes (user + system): what it costs whatever else runs
                            "cpu_s": (cpu.ru_utime - cpu_before.ru_utime) + (cpu.ru_stime - cpu_before.ru_stime),
                            "runs_s": run_seconds(study_dir), "per_role": role_costs(study_dir)})
    median = statistics.median(r["wall_s"] for r in repeats)
    print(json.dumps({
        "which": args.which,
        "command": "numdev-train " + " ".join(command),
        "threads_per_run": 1,
        "parallel_jobs": 2,
        "repeats": repeats,
        "median_wall_s": median,
        "budget_s": BUDGET_S[args.which],
        "within_budget": median <= BUDGET_S[args.which],
        "provenance": provenance(threads=1),
    }, indent=1))


if __name__ == "__main__":
    run_script(main)
