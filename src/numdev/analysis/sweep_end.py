"""numdev-train's one end-of-sweep callback (conf/train/train.yaml, hydra.callbacks.sweep_end), in this order:

1. the study's analysis, when the sweep is a study (`study: true`: conf/train/experiment/flash_stability*.yaml
   and the catalogue set it): summary.json and the figures (numdev.analysis.study);
2. what to run next (numdev.cli.next_steps).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from hydra.experimental.callback import Callback

from numdev.analysis.study import analyse, log_step
from numdev.cli import next_steps
from numdev.cli.commands import tensorboard
from numdev.cli.errors import fail
from numdev.runs.atomic import WriteError
from numdev.runs.layout import SUMMARY, sweep_run_records
from numdev.runs.schemas import RUN, read_json_file

log = logging.getLogger(__name__)


class SweepEnd(Callback):
    def __init__(self, study: bool = False, against_truth: bool = True):
        self.study, self.against_truth = study, against_truth
        self.started = None

    def on_multirun_start(self, config, **kwargs) -> None:
        self.started = time.time()

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep = Path(config.hydra.sweep.dir)
        if self.study:
            analyse_study(sweep, self.against_truth)
        log.info("\n".join(next_steps.train_sweep(sweep)))
        stopped = stopped_runs(sweep, self.started)
        if stopped:  # each job said so as it ended (numdev.train.app); the sweep ran every other job
            fail("numdev-train", f"{len(stopped)} run(s) of the sweep stopped (callbacks.instability.policy=stop), every other "
                 f"job ran: {', '.join(str(r) for r in stopped)} (their run.json say why)", 1)


def stopped_runs(sweep: Path, since: float | None) -> list[Path]:
    """The sweep's runs whose run.json says stopped, written since the sweep started (None: any): an earlier sweep's
    runs in the same directory do not count. A run.json that cannot be read is left to the tools that read it."""
    found = []
    for record in sweep_run_records(sweep):
        try:
            if since is not None and record.stat().st_mtime < since:
                continue
            if read_json_file(record, RUN).get("status") == "stopped":
                found.append(record.parent)
        except (OSError, ValueError):
            continue
    return found


def analyse_study(study_dir: Path, against_truth: bool = True) -> None:
    """The study's analysis; without its summary.json the command exits 1 with one line (Hydra would
    only warn about a callback's exception, and exit 0)."""
    try:
        analyse(study_dir, against_truth=against_truth, log=log_step)
    except (FileNotFoundError, ValueError, WriteError) as error:
        fail("numdev-train", f"the study's analysis did not run: {error}; its runs are in {study_dir} "
             f"(analyse them again with numdev-study {study_dir})", 1)
    except Exception as error:
        fail("numdev-train", f"the study's analysis failed ({type(error).__name__}: {error}); its runs are in "
             f"{study_dir} (numdev-study {study_dir} -v shows where)", 1)
    if not (study_dir / SUMMARY).is_file():
        fail("numdev-train", f"the study's analysis wrote no {study_dir / SUMMARY}: run numdev-study {study_dir}", 1)
    log.info("TensorBoard: %s", tensorboard(study_dir))
