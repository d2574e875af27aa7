"""What to run next, printed at the end of a run or sweep by each app's end-of-sweep callback
(numdev.bench.sweep_end, numdev.analysis.sweep_end).

A finished sweep is only useful when the user knows the next command: numdev-gather and the
figure for a bench sweep, TensorBoard and numdev-compare for training runs. Logged as they run
(numdev.cli.commands).
"""

from __future__ import annotations

from pathlib import Path

from numdev.cli.commands import command, tensorboard
from numdev.runs.layout import RESULTS, SUMMARY, TABLE, sweep_run_records


def bench_run(run_dir: Path) -> str:
    """After a single numdev-bench run."""
    return f"next: {command('numdev-gather', run_dir)}   (the records as {run_dir / TABLE})"


def bench_sweep(sweep: Path) -> list[str]:
    """After a numdev-bench sweep (its figure, if any, made already)."""
    jobs = sum(1 for _ in sweep.glob(f"*/{RESULTS}"))
    lines = [f"sweep done: {jobs} job(s) in {sweep}"]
    table = sweep / TABLE
    if table.is_file():  # an experiment's figure callback gathered it already
        lines.append(f"      table:  {table}")
    else:
        lines.append(f"next: {command('numdev-gather', sweep)}   (one table of every job: {table})")
    figures = sorted(sweep.glob("*.png"))
    lines += [f"      figure: {figure}" for figure in figures]
    if figures:
        lines.append(f"      {command('numdev-report', '--bench', sweep)}   (the figure beside the paper's claim, as HTML)")
    return lines


def train_sweep(sweep: Path) -> list[str]:
    """After a numdev-train sweep (a study's analysis, if any, run already)."""
    runs = sorted({record.parent for record in sweep_run_records(sweep)})
    lines = [f"sweep done: {len(runs)} run(s) in {sweep}"]
    if (sweep / SUMMARY).is_file():  # a study: its analysis printed its own next steps
        return lines
    lines.append(f"next: {tensorboard(sweep)}   (the runs side by side)")
    if len(runs) >= 2:
        lines.append(f"      {command('numdev-compare', runs[0], runs[1])}   (weight distance between two runs over training)")
    return lines
