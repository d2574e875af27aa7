"""Load test: 8 concurrent numdev-bench processes and 2 concurrent trainings, every record counted.

    python scripts/load_test.py [--out load_test.json] [--benches 8] [--trainings 2] [--root DIR]

All processes start at once (the same second, so one-second run-directory stamps would collide):

- benches 0..B/2-1 use the default run directory (outputs/bench/load/<time>_<id>/): each must get
  its own directory and keep its records;
- benches B/2..B-1 all append to ONE shared run directory's results.jsonl (the worst case for
  appends): every record of every process must be there, whole;
- trainings use default run directories too: each must finish in its own directory with all its
  snapshots.

Each bench process measures its own seeds (seeds=[2i,2i+1], kept in its records' "overrides"), so
records are counted per process and none measures what another does (numdev-bench writes a
measurement already in its results.jsonl only once; numdev-gather refuses one measured twice). Tiny shapes; the point is contention, not speed. Prints the result as JSON (and writes
--out); exits 1 if any record is missing or any process failed.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from numdev.cli.script_args import ScriptParser, run_script
from numdev.runs.atomic import write_text

SEEDS = [0, 1]
RECORDS_PER_BENCH = 2 * len(SEEDS) + len(SEEDS)  # flash and baseline vs golden, and the pair, per seed


def _tag(i: int) -> str:
    """Bench process i's seeds override: its own seeds, which also tell its records apart."""
    return f"seeds=[{','.join(str(len(SEEDS) * i + s) for s in SEEDS)}]"
TRAIN_STEPS, SNAPSHOT_EVERY = 4, 2


def _script(name: str) -> list[str]:
    script = Path(sys.executable).with_name(name)
    module = {"numdev-bench": "numdev.bench.app", "numdev-train": "numdev.train.app"}[name]
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


def _records(path: Path) -> tuple[list[dict], int]:
    """The whole records of a results.jsonl, and how many lines were not whole records."""
    good, bad = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            good.append(json.loads(line))
        except json.JSONDecodeError:
            bad += 1
    return good, bad


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--benches", type=int, default=8)
    parser.add_argument("--trainings", type=int, default=2)
    parser.add_argument("--root", help="output root (default: a new temporary directory)")
    parser.add_argument("--out", help="also write the JSON result here")
    args = parser.parse_args(argv)
    root = Path(args.root or tempfile.mkdtemp(prefix="numdev-load-"))
    root.mkdir(parents=True, exist_ok=True)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    shared = root / "bench" / "load" / "shared"
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}

    bench_args = ["name=load", "shape.seq_q=64", "shape.dim=16", f"output_root={root}"]
    processes = []
    for i in range(args.benches):
        where = [f"hydra.run.dir={shared}"] if i >= args.benches // 2 else []
        command = [*_script("numdev-bench"), *bench_args, _tag(i), *where]
        processes.append(("bench", i, bool(where), command))
    for i in range(args.trainings):
        command = [*_script("numdev-train"), "experiment=train_smoke", "name=load", f"output_root={root}", "threads=1",
                   f"trainer.max_steps={TRAIN_STEPS}", f"snapshot.every_n_steps={SNAPSHOT_EVERY}"]
        processes.append(("train", i, False, command))

    start = time.perf_counter()
    running = []
    for kind, i, shared_dir, command in processes:
        log = logs / f"{kind}_{i}.log"  # a file, not a pipe: no process can block on a full pipe
        with open(log, "w", encoding="utf-8") as handle:
            process = subprocess.Popen(command, cwd=root, env=env, stdout=handle, stderr=subprocess.STDOUT)
        running.append((kind, i, shared_dir, process, log))
    exits = []
    for kind, i, shared_dir, process, log in running:
        process.wait(timeout=1800)
        errors = [line for line in log.read_text(encoding="utf-8").splitlines() if ": error: " in line]
        exits.append({"kind": kind, "id": i, "shared_dir": shared_dir, "exit": process.returncode,
                      "error": errors[-1] if errors else None})
    seconds = time.perf_counter() - start

    # Benches with their own directories: one directory each, all records.
    own_dirs = sorted(p.parent for p in (root / "bench" / "load").glob("*/results.jsonl") if p.parent != shared)
    own = {"processes": args.benches // 2, "directories": len(own_dirs), "expected": RECORDS_PER_BENCH * (args.benches // 2)}
    own_records, own_torn = [], 0
    for d in own_dirs:
        records, torn = _records(d / "results.jsonl")
        own_records += records
        own_torn += torn
    own.update(found=len(own_records), torn_lines=own_torn)
    # Benches sharing one results.jsonl: every process's records, whole.
    shared_count = args.benches - args.benches // 2
    records, torn = _records(shared / "results.jsonl") if (shared / "results.jsonl").is_file() else ([], 0)
    per_process = {}
    for r in records:
        tag = next((o for o in r.get("overrides", []) if o.startswith("seeds=")), "?")
        per_process[tag] = per_process.get(tag, 0) + 1
    shared_result = {"processes": shared_count, "expected": RECORDS_PER_BENCH * shared_count, "found": len(records),
                     "torn_lines": torn, "per_process": per_process}
    # Trainings: each in its own directory, finished, with every snapshot.
    runs = sorted(p.parent for p in (root / "train" / "load").glob("*/run.json"))
    expected_steps = list(range(0, TRAIN_STEPS + 1, SNAPSHOT_EVERY))
    trainings = {"processes": args.trainings, "directories": len(runs), "finished": 0, "snapshots_complete": 0}
    for run in runs:
        status = json.loads((run / "run.json").read_text())["status"]
        trainings["finished"] += status == "finished"
        index = json.loads((run / "weights" / "index.json").read_text())
        trainings["snapshots_complete"] += [e["step"] for e in index["snapshots"]] == expected_steps

    ok = (
        all(e["exit"] == 0 for e in exits)
        and own["found"] == own["expected"] and own["directories"] == own["processes"] and own_torn == 0
        and shared_result["found"] == shared_result["expected"] and torn == 0
        and all(per_process.get(_tag(i)) == RECORDS_PER_BENCH for i in range(args.benches // 2, args.benches))
        and trainings["directories"] == trainings["finished"] == trainings["snapshots_complete"] == args.trainings
    )
    result = {
        "ok": ok, "seconds": round(seconds, 1), "root": str(root),
        "bench_own_directories": own, "bench_shared_results": shared_result, "trainings": trainings,
        "exits": exits,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "threads_per_process": 1},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        write_text(args.out, text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    run_script(main)
