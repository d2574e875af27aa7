"""Hydra callback of both apps: at the end of a run or sweep, print what to run next.

A finished sweep is only useful when the user knows the next command: numdev-gather and the
figure for a bench sweep, TensorBoard and numdev-compare for training runs. Logged as they run
(numdev.cli.commands).
"""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from numdev.cli.commands import command, tensorboard
from numdev.runs.layout import RUN_RECORD, SUMMARY, TABLE

log = logging.getLogger(__name__)


class NextSteps(Callback):
    def on_run_end(self, config: DictConfig, **kwargs) -> None:
        run_dir = Path(config.hydra.run.dir)
        if config.get("app") == "bench":
            log.info(f"next: {command('numdev-gather', run_dir)}   (the records as {run_dir / 'table.csv'})")

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep = Path(config.hydra.sweep.dir)
        lines = _bench(sweep) if config.get("app") == "bench" else _train(sweep)
        log.info("\n".join(lines))


def _bench(sweep: Path) -> list[str]:
    jobs = sum(1 for _ in sweep.glob("*/results.jsonl"))
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


def _train(sweep: Path) -> list[str]:
    # A plain sweep's runs are <sweep>/<job>/; a study's are <sweep>/r<replicate>/<role>/.
    runs = sorted({p.parent for pattern in (f"*/{RUN_RECORD}", f"*/*/{RUN_RECORD}") for p in sweep.glob(pattern)})
    lines = [f"sweep done: {len(runs)} run(s) in {sweep}"]
    if (sweep / SUMMARY).is_file():  # a study: its analysis printed its own next steps
        return lines
    lines.append(f"next: {tensorboard(sweep)}   (the runs side by side)")
    if len(runs) >= 2:
        lines.append(f"      {command('numdev-compare', runs[0], runs[1])}   (weight distance between two runs over training)")
    return lines
