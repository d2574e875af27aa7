"""Compare this run's weights with a sibling (reference) run's at every snapshot step, live.

The sibling is another run directory: a path, or in a study an interpolation into the same
multirun (`${run_dir}/../reference`). At each step this run snapshots (step 0, every
`every_n_steps`, the final step), the callback loads the sibling's snapshot of the same step
(verified against its sha256), computes max |Δ| and Wasserstein-1 per parameter tensor and for
the whole model (numdev.analysis.distances), and logs them to TensorBoard:

    sibling/<label>/max_abs, sibling/<label>/wasserstein                 whole model
    sibling_tensors/<label>/<tensor>/max_abs, .../wasserstein            per parameter tensor
    sibling_diff/<label>/model (histogram of all differences), sibling_diff/<label>/<tensor>

and keeps the rows in <run_dir>/sibling/<label>.csv (the same columns as numdev-compare's CSV).

A sibling training in parallel (a parallel launcher, SLURM) may not have reached the step yet:
the callback polls for the snapshot up to `timeout_s` seconds. It stops waiting with a clear
error when the sibling has finished or failed without that step (a different step grid or
length), when its parameters differ in names or shapes (a different architecture), or when the
snapshot fails its checksum (numdev.train.snapshots names the file).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

from numdev.analysis.compare import MODEL, read_csv, rows_to_csv
from numdev.analysis.distances import check_same_architecture, weight_distances
from numdev.atomic import write_text
from numdev.train.snapshots import INDEX, WEIGHTS_DIR, SnapshotError, list_snapshots, load_snapshot, parameter_state

RUN_RECORD = "run.json"


class SiblingError(ValueError):
    """The sibling run is missing, not a run, or does not match this one: the message says which and how."""


class SiblingDistance(pl.Callback):
    def __init__(
        self,
        run_dir: str,
        reference: str | None,
        every_n_steps: int,
        label: str | None = None,
        timeout_s: float = 3600.0,
        poll_s: float = 1.0,
        histograms: str = "model",  # "model", "all" (also per tensor) or "none"
    ):
        self.run_dir = Path(run_dir)
        self.reference = Path(reference) if reference is not None else None
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps <= 0:
            raise ValueError(f"sibling every_n_steps={every_n_steps!r} must be a positive integer")
        if histograms not in ("model", "all", "none"):
            raise ValueError(f"sibling.histograms={histograms!r}: choose model, all or none")
        if timeout_s < 0:
            raise ValueError(f"sibling.timeout_s={timeout_s} must be >= 0")
        self.every_n_steps, self.timeout_s, self.poll_s, self.histograms = every_n_steps, timeout_s, poll_s, histograms
        self.label = label or (self.reference.name if self.reference is not None else "")
        self.rows: list[dict] = []
        self.last_step: int | None = None
        self.names: list[str] = []

    @property
    def active(self) -> bool:
        return self.reference is not None

    @property
    def csv_path(self) -> Path:
        return self.run_dir / "sibling" / f"{self.label}.csv"

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not self.active:
            return
        if self.reference.resolve() == self.run_dir.resolve():
            raise SiblingError(f"sibling.reference={self.reference} is this run itself: name another run directory")
        if not self.reference.exists() and not self.reference.parent.exists():
            raise SiblingError(
                f"sibling.reference={self.reference} does not exist (nor does its parent directory): "
                "give the directory of a numdev-train run"
            )
        self.names = [name for name, _ in pl_module.model.named_parameters()]
        if self.csv_path.exists():  # a resumed run keeps its rows before the checkpoint (on_train_start)
            self.rows = read_csv(self.csv_path)

    def on_train_start(self, trainer, pl_module) -> None:
        # Rows at or after the resumed step are recomputed (a resumed run retraces them).
        self.rows = [r for r in self.rows if r["step"] < trainer.global_step]
        if trainer.global_step == 0:
            self.compare(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self.compare(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self.compare(trainer, pl_module)

    def compare(self, trainer, pl_module) -> dict | None:
        step = trainer.global_step
        if not self.active or step == self.last_step:
            return None
        self.last_step = step
        full = trainer.strategy.lightning_module_state_dict()  # every rank takes part (FSDP)
        if not trainer.is_global_zero:
            return None
        mine = parameter_state((name, full[f"model.{name}"]) for name in self.names)
        theirs = self.wait_for(step)
        check_same_architecture(mine, theirs, where=f"sibling {self.reference} at step {step}")
        distances = weight_distances(mine, theirs)
        self.rows = [r for r in self.rows if r["step"] != step]
        self.rows.append({"step": step, "tensor": MODEL, **distances["model"]})
        self.rows.extend({"step": step, "tensor": name, **m} for name, m in distances["per_tensor"].items())
        write_text(self.csv_path, rows_to_csv(self.rows))
        self.log_distances(trainer, step, distances, mine, theirs)
        return distances

    def log_distances(self, trainer, step: int, distances: dict, mine: dict, theirs: dict) -> None:
        if not trainer.logger:
            return
        label = self.label
        metrics = {f"sibling/{label}/{k}": v for k, v in distances["model"].items()}
        for name, values in distances["per_tensor"].items():
            metrics.update({f"sibling_tensors/{label}/{name}/{k}": v for k, v in values.items()})
        trainer.logger.log_metrics(metrics, step=step)
        experiment = getattr(trainer.logger, "experiment", None)
        if self.histograms == "none" or not hasattr(experiment, "add_histogram"):
            return
        names = sorted(mine)
        diff = torch.cat([(mine[n] - theirs[n]).flatten() for n in names])
        experiment.add_histogram(f"sibling_diff/{label}/model", diff, global_step=step)
        if self.histograms == "all":
            for name in names:
                experiment.add_histogram(f"sibling_diff/{label}/{name}", mine[name] - theirs[name], global_step=step)

    def wait_for(self, step: int) -> dict[str, torch.Tensor]:
        """The sibling's snapshot at `step`, waiting up to timeout_s for it to be written."""
        start = time.monotonic()
        announced = 0.0
        while True:
            state = self._try_load(step)
            if state is not None:
                return state
            waited = time.monotonic() - start
            if waited >= self.timeout_s:
                raise SiblingError(
                    f"sibling {self.reference}: no snapshot at step {step} after waiting {self.timeout_s:g} s "
                    f"({self._describe()}); is the sibling running? raise sibling.timeout_s or compare offline "
                    "with numdev-compare when both runs are done"
                )
            if waited - announced >= 30:
                announced = waited
                print(f"[sibling] waiting for {self.reference} step {step} ({waited:.0f} of {self.timeout_s:g} s)", flush=True)
            time.sleep(self.poll_s)

    def _try_load(self, step: int) -> dict[str, torch.Tensor] | None:
        index = self.reference / WEIGHTS_DIR / INDEX
        if not index.is_file():
            # A sibling still starting up has a run.json before its first snapshot: wait for it.
            if self._status() in ("finished", "failed", "stopped"):
                raise SiblingError(f"sibling {self.reference} is a run without snapshots ({WEIGHTS_DIR}/{INDEX} missing)")
            return None
        steps = list_snapshots(self.reference)
        if step in steps:
            return load_snapshot(self.reference, step)
        status = self._status()
        if status in ("finished", "failed", "stopped") or (steps and max(steps) > step):
            raise SiblingError(
                f"sibling {self.reference} ({status or 'running'}) has no snapshot at step {step}; it has steps "
                f"{_steps_text(steps)}: the runs must share trainer.max_steps and snapshot.every_n_steps"
            )
        return None

    def _status(self) -> str | None:
        path = self.reference / RUN_RECORD
        try:
            return json.loads(path.read_text(encoding="utf-8")).get("status")
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return None

    def _describe(self) -> str:
        if not self.reference.exists():
            return "the directory does not exist yet"
        try:
            steps = list_snapshots(self.reference)
        except SnapshotError:
            return "it has no snapshot index yet"
        return f"its latest snapshot is step {max(steps)}" if steps else "it has no snapshots yet"


def _steps_text(steps: list[int]) -> str:
    if len(steps) <= 6:
        return str(steps)
    return f"[{steps[0]}, {steps[1]}, ..., {steps[-1]}] ({len(steps)})"
