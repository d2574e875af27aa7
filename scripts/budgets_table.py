"""Write docs/results.md's `budgets` block from the timing JSONs in docs/results/.

    python scripts/budgets_table.py

Reads every docs/results/bench_fresh_*.json (scripts/bench_fresh_clone.py: `make demo` and CI's
test command from a fresh clone) and bench_study_*.json (scripts/bench_study.py: the studies) and
writes one table: what was timed, its budget, the wall time, the CPU seconds of its processes, the
load averages around it and the machine; and README.md's `costs` block: what the two commands of its
Quick start take from a fresh clone (time, disk) and where that was measured. The machine is shared: a wall time over its budget while
the load was high is shown beside its CPU seconds, which others' work does not inflate. Nothing in
the block is typed by hand.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
from pathlib import Path

from numdev.cli.script_args import ScriptParser, run_script
from numdev.report.docblocks import check_blocks, replace_block
from numdev.runs.provenance import machine_line

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
DOC, BLOCK = REPO / "docs" / "results.md", "budgets"
README, COSTS = REPO / "README.md", "costs"


def _minutes(seconds: float | None) -> str:
    return "–" if seconds is None else f"{int(seconds // 60)} min {round(seconds % 60):d} s"


def _load(values) -> str:
    return "/".join(f"{v:.1f}" for v in values) if values else "–"


def _during(data: dict) -> str:
    """The mean 1-minute load while it ran, where the JSON sampled it."""
    samples = data.get("load_1min_every_30s")
    return f" (mean {sum(samples) / len(samples):.1f} during)" if samples else ""


def rows() -> list[str]:
    lines = ["| what | command | budget | wall time | CPU s (its processes) | load before → after | within budget | machine | JSON |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path in sorted(RESULTS.glob("bench_fresh_*.json")) + sorted(RESULTS.glob("bench_study_*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        repeat = data["repeats"][0] if "repeats" in data else data
        wall = data.get("median_wall_s", data.get("wall_s"))
        tests_budget = f", budget {_minutes(data['tests_budget_s'])}" if data.get("tests_budget_s") else ""
        extra = (f" ({data['pytest']['summary']}; tests alone {_minutes(data['pytest']['tests_s'])}{tests_budget})"
                 if data.get("pytest") else "")
        failed = f"; exit {data['returncode']}" if data.get("returncode") else ""
        what = f"study: {data['which']}" if path.name.startswith("bench_study_") else f"fresh clone: {data['which']}"
        lines.append(
            f"| {what}{extra}{failed} | `{data['command']}` | {_minutes(data.get('budget_s'))} | {_minutes(wall)} | "
            f"{repeat.get('cpu_s') and round(repeat['cpu_s']) or '–'} | "
            f"{_load(repeat.get('load_average_before'))} → {_load(repeat.get('load_average_after'))}{_during(repeat)} | "
            f"{'yes' if data.get('within_budget') else 'no'} | {machine_line(data['provenance'])} | [{path.name}](results/{path.name}) |"
        )
    return lines


def _gb(value) -> str:
    return f"{value / 1e9:.1f} GB" if isinstance(value, int) else "not recorded"


def costs() -> str:
    """README's costs block: `make demo` and `make test` from a fresh clone (bench_fresh_demo.json, bench_fresh_test.json)."""
    lines = []
    for which, what in (("demo", "`make demo`"), ("test", "`make test`")):
        path = RESULTS / f"bench_fresh_{which}.json"
        if not path.is_file():
            lines.append(f"- {what}: not measured yet (`.venv/bin/python scripts/bench_fresh_clone.py --which {which}`)")
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        disk = data.get("disk_bytes") or {}
        tests = f", tests alone {_minutes(data['pytest']['tests_s'])} ({data['pytest']['summary']})" if data.get("pytest") else ""
        left = (f"it leaves {_gb(disk.get('outputs'))} in outputs/ and {_gb(disk.get('.venv'))} in .venv/" if disk
                else "its disk was not recorded (measured before the benchmark recorded it)")
        install = (f"the install and set-up ({_minutes(data['wall_s'] - data['pytest']['tests_s'])}) included" if data.get("pytest")
                   else "the install included")
        lines.append(f"- {what}: {_minutes(data['wall_s'])} from a fresh clone, {install}{tests}; "
                     f"{left} ({machine_line(data['provenance'])}; [{path.name}](docs/results/{path.name}))")
    return "\n".join(["Measured by `.venv/bin/python scripts/bench_fresh_clone.py --which demo` (and `--which test`) on the 2-core machine "
                      "(block written by `.venv/bin/python scripts/budgets_table.py`):", "", *lines])


def main() -> None:
    ScriptParser(description=__doc__.strip().splitlines()[0]).parse_args()  # --help; no arguments
    check_blocks((DOC, BLOCK), (README, COSTS))
    text = "\n".join([
        "Generated by `.venv/bin/python scripts/budgets_table.py` from the JSONs of `.venv/bin/python scripts/bench_fresh_clone.py "
        "--which demo` (and `--which test`) and `.venv/bin/python scripts/bench_study.py --which <study>` (demo, early, lowfloor, full, optimizations, harm; each row names its "
        "machine, threads and the commit it measured; the studies run two jobs at a time with one thread each):",
        "",
        *rows(),
    ])
    replace_block(DOC, BLOCK, text)
    replace_block(README, COSTS, costs())
    print(json.dumps({"doc": str(DOC), "block": BLOCK, "readme": COSTS}))


if __name__ == "__main__":
    run_script(main)
