"""Wall time of `make demo` and of CI's test command from a fresh clone, as a new user runs them. Prints JSON.

    python scripts/bench_fresh_clone.py --which demo     # git clone HEAD, then `make demo` (install included)
    python scripts/bench_fresh_clone.py --which test     # git clone HEAD, then `CI=true bash .ci/run` (install included)
    python scripts/bench_fresh_clone.py --which demo --keep-outputs /tmp/demo-outputs   # keep what the demo made

The clone is of the committed HEAD (uncommitted changes are not measured: the JSON says so), into a
temporary directory removed afterwards. The JSON gives the wall time end to end, the CPU seconds of
the command's processes, the 1/5/15-minute load averages before and after and the 1-minute load
every 30 s in between (on a shared machine, others' work is in the wall time), the exit code,
pytest's summary line, its slowest tests and its machine line (workers, threads per test process)
(test) and the machine (numdev.runs.provenance). Budgets (docs/results.md#budgets): demo <= 12 min;
the test run <= 15 min with the install, its tests alone (pytest's own time) <= 8 min, on 2 cores.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from numdev.cli.script_args import ScriptParser, run_script
from numdev.runs.layout import tree_bytes
from numdev.runs.provenance import git_state, provenance
from numdev.runs.scratch import scratch

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {"demo": ["make", "demo"], "test": ["bash", ".ci/run"]}
BUDGET_S = {"demo": 720, "test": 900}
TESTS_BUDGET_S = {"test": 480}  # pytest's own time for the default suite (the install aside)
PYTEST_SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed).*?) in ([\d.]+)s", re.M)
PYTEST_DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)$", re.M)  # `make test`'s --durations lines
PYTEST_MACHINE = re.compile(r"^torch .* thread\(s\) per test process.*$", re.M)  # tests/conftest.py's machine section
LOAD_EVERY_S = 30


def main() -> None:
    parser = ScriptParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--which", choices=sorted(COMMANDS), required=True)
    parser.add_argument("--keep-outputs", type=Path, help="move the clone's outputs/ here afterwards (a directory that does not exist yet)")
    args = parser.parse_args()
    if args.keep_outputs is not None and args.keep_outputs.exists():
        parser.error(f"--keep-outputs {args.keep_outputs}: already exists; give a new directory")
    state = git_state()
    with scratch("numdev_bench_fresh_clone_") as tmp:
        clone = Path(tmp) / "numdev"
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        env["CI"] = "true"
        load_before = os.getloadavg()
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done, load_samples = _run_sampling_load(COMMANDS[args.which], clone, env)
        wall = time.perf_counter() - start
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        disk = {name: tree_bytes(clone / name) for name in ("outputs", ".venv")}  # what the command left on disk
        if args.keep_outputs is not None and (clone / "outputs").is_dir():
            shutil.move(clone / "outputs", args.keep_outputs)
    summary = PYTEST_SUMMARY.findall(done.stdout)
    tests_s = float(summary[-1][1]) if summary else None
    tests_within = tests_s is not None and tests_s <= TESTS_BUDGET_S[args.which] if args.which in TESTS_BUDGET_S else True
    print(json.dumps({
        "which": args.which,
        "command": " ".join(COMMANDS[args.which]) + " (from a fresh clone, CI=true)",
        "commit": state.get("commit"),
        "uncommitted_changes_not_measured": bool(state.get("dirty")),
        "returncode": done.returncode,
        "wall_s": wall,
        "disk_bytes": disk,
        "cpu_s": (cpu.ru_utime - cpu_before.ru_utime) + (cpu.ru_stime - cpu_before.ru_stime),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "load_1min_every_30s": load_samples,
        "pytest": {"summary": summary[-1][0], "tests_s": tests_s, "machine": next(iter(PYTEST_MACHINE.findall(done.stdout)), None),
                   "slowest": [{"s": float(s), "phase": phase, "test": test} for s, phase, test in PYTEST_DURATION.findall(done.stdout)]}
        if summary else None,
        "output_tail": (done.stdout + done.stderr)[-2000:] if done.returncode else "",
        "budget_s": BUDGET_S[args.which],
        **({"tests_budget_s": TESTS_BUDGET_S[args.which], "tests_within_budget": tests_within} if args.which in TESTS_BUDGET_S else {}),
        "within_budget": done.returncode == 0 and wall <= BUDGET_S[args.which] and tests_within,
        "provenance": provenance(),
    }, indent=1))
    sys.exit(done.returncode)


def _run_sampling_load(command: list[str], cwd: Path, env: dict) -> tuple[subprocess.CompletedProcess, list[float]]:
    """Run `command` to its end, its output captured; the 1-minute load average every LOAD_EVERY_S seconds meanwhile."""
    samples = []
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
        while True:
            try:
                process.wait(timeout=LOAD_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                samples.append(round(os.getloadavg()[0], 2))
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, out.read(), err.read()), samples


if __name__ == "__main__":
    run_script(main)
