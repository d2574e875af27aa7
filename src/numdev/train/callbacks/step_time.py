"""The wall time of every training step, from the run itself: run.json's `step_seconds`.

A step here is Lightning's training batch: forward, backward and the optimizer step, from this
callback's on_train_batch_start to its on_train_batch_end (on a GPU, each end waits for the device,
so a step's kernels count in it, not in the next). It is the first callback
(conf/train/callbacks/default.yaml lists it first), so snapshot writing and sibling comparisons, which
run in later callbacks' on_train_batch_end, are not in it; data loading happens before the start.
The median over steps is the run's cost (robust to the compilation of the first steps and to
other processes on a shared machine); the first step is reported beside it.

Every trainer.log_every_n_steps steps (and at the last) it also writes the step, the training loss and
the median step time since the last such line to the run's log (app.log, at DEBUG: on the console
with -v only), so a run's log holds its losses and speed, not only its start and end.
"""

from __future__ import annotations

import logging
import math
import statistics
import time

import lightning.pytorch as pl
import torch

log = logging.getLogger(__name__)


def _synchronize(module) -> None:
    """Wait for the module's device to finish what was launched (CUDA runs kernels asynchronously)."""
    device = getattr(module, "device", None)
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimes(pl.Callback):
    def __init__(self):
        self.seconds: list[float] = []
        self._start: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        _synchronize(pl_module)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._start is not None:
            _synchronize(pl_module)  # a GPU's kernels run after their launch: the step ends when they have
            self.seconds.append(time.perf_counter() - self._start)
            self._start = None
        step = int(trainer.global_step)
        every = max(1, int(getattr(trainer, "log_every_n_steps", 50) or 50))
        if step % every == 0 or step == trainer.max_steps:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            value = float(loss.detach()) if hasattr(loss, "detach") else math.nan
            recent = statistics.median(self.seconds[-every:]) if self.seconds else math.nan
            log.debug("step %d: loss %.5g, %.3f s/step (median of the last %d)", step, value, recent,
                      min(every, len(self.seconds)))

    def results(self) -> dict:
        return {"step_seconds": self.summary()} if self.summary() else {}

    def summary(self) -> dict | None:
        if not self.seconds:
            return None
        return {"median": statistics.median(self.seconds), "first": self.seconds[0], "count": len(self.seconds),
                "total": sum(self.seconds)}
