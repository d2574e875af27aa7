"""The snapshot callback: one schedule and one gathered state dict per step for everything that reads
the weights at snapshot steps.

At step 0, at the schedule's steps (SnapshotSchedule: every `every_n_steps`, or `log`: the
log-spaced LOG_STEPS, then every `every_n_steps`) and at the final step, `WeightSnapshots` gathers the full
(unsharded) parameters once (a collective under FSDP), writes weights/step_XXXXXXXX.safetensors
(numdev.weights.store; global rank 0 only), then hands the same float32 state to its listeners
(the sibling comparison, numdev.train.callbacks.sibling), so they run on exactly the snapshot's weights
and steps. It also keeps token_rows.json (numdev.weights.token_rows): declared at the start, every
training batch checked against it.

With `sorted_values` (snapshot.sorted_values=true: a run that others compare with, the study's
reference) it also sorts the weight sets (numdev.weights.distances.prepare, split by this run's
token rows; a set unchanged since the previous snapshot is not sorted again) and writes them
beside the snapshot, before its index entry (weights/sorted_XXXXXXXX.safetensors,
numdev.weights.store), so the comparing runs read them instead of each sorting them again.
`prepared` keeps them: this run's own sibling comparison reuses them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import lightning.pytorch as pl
import torch

from numdev.runs.layout import indexed_rows
from numdev.weights.distances import Prepared, prepare
from numdev.weights.store import SnapshotWriter, SortedSets, parameter_state
from numdev.weights.token_rows import TokenRows, embedding_name


class SnapshotListener(Protocol):
    def attach_to(self, hub: WeightSnapshots | None) -> None: ...

    def on_snapshot(self, trainer, pl_module, step: int, state: dict[str, torch.Tensor], prepared: Prepared | None) -> None:
        """`state`: the snapshot's float32 weights; `prepared`: the same sorted (snapshot.sorted_values), else None."""

    def on_resume(self, trainer, pl_module, step: int) -> None: ...


# The early phase on a log axis (docs/study.md#schedule): a perturbation grows like e·exp(λt) for the
# first ~100 steps, so comparisons are spaced by a factor of about 1.5 there, then every_n_steps.
LOG_STEPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
SCHEDULES = ("every", "log")


class SnapshotSchedule:
    """Snapshot steps: step 0, the schedule's steps, and the final step.

    every: every `every_n_steps` steps; log: LOG_STEPS, then every `every_n_steps` steps after them.
    """

    def __init__(self, every_n_steps: int, kind: str = "every"):
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps <= 0:
            raise ValueError(f"snapshot.every_n_steps={every_n_steps!r} must be a positive integer")
        if kind not in SCHEDULES:
            raise ValueError(f"snapshot.schedule={kind!r}: use {' or '.join(SCHEDULES)}")
        self.every_n_steps, self.kind = every_n_steps, kind

    def due(self, step: int) -> bool:
        if self.kind == "log" and step <= LOG_STEPS[-1]:
            return step == 0 or step in LOG_STEPS
        return step % self.every_n_steps == 0

    def steps(self, max_steps: int) -> list[int]:
        """Every snapshot step of a run of max_steps steps (the final step included)."""
        return sorted({s for s in range(max_steps + 1) if self.due(s)} | {max_steps})


class WeightSnapshots(pl.Callback):
    """weights/step_XXXXXXXX.safetensors at the schedule's steps; listeners get the same state.

    Parameters come from the strategy's full (unsharded) state_dict on every rank (a collective
    under FSDP); only global rank 0 writes and runs the listeners. `seconds` keeps the time each
    write took (listeners not included; the sorting with `sorted_values` included).
    """

    def __init__(self, run_dir: str, every_n_steps: int, sorted_values: bool = False, schedule: str = "every",
                 trained_only: bool = False):
        for key, value in (("sorted_values", sorted_values), ("trained_only", trained_only)):
            if not isinstance(value, bool):
                raise ValueError(f"snapshot.{key}={value!r} must be true or false")
        self.run_dir = Path(run_dir)
        self.schedule = SnapshotSchedule(every_n_steps, schedule)
        self.trained_only = trained_only
        self.sorted_values = sorted_values
        self.prepared: Prepared | None = None  # with sorted_values: the latest snapshot's sets, sorted
        self.writer: SnapshotWriter | None = None
        self.token_rows: TokenRows | None = None
        self.listeners: list[SnapshotListener] = []
        self.names: list[str] = []
        self.last_step: int | None = None
        self.seconds: list[float] = []

    def subscribe(self, listener: SnapshotListener) -> None:
        if listener not in self.listeners:
            self.listeners.append(listener)

    def setup(self, trainer, pl_module, stage: str) -> None:
        # Names before the strategy wraps the model: the plain parameter names.
        model = pl_module.model
        named = list(model.named_parameters())
        self.names = [name for name, _ in named]
        if not trainer.is_global_zero:
            return
        shapes = {name: list(p.shape) for name, p in named}
        self.writer = SnapshotWriter(self.run_dir, getattr(model, "name", type(model).__name__), shapes, self.trained_only)
        embedding = embedding_name(model)
        if embedding is not None and hasattr(model, "tokenize"):
            self.token_rows = TokenRows(self.run_dir, embedding, shapes[embedding][0], model.tokenize)

    def on_train_start(self, trainer, pl_module) -> None:
        step = trainer.global_step
        if self.token_rows is not None:
            datamodule = getattr(trainer, "datamodule", None)
            vocabulary = datamodule.caption_vocabulary() if hasattr(datamodule, "caption_vocabulary") else None
            self.token_rows.start(vocabulary, step)
        if step == 0:
            self.save(trainer, pl_module)
        elif trainer.is_global_zero:
            for listener in self.listeners:
                listener.on_resume(trainer, pl_module, step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.token_rows is not None and isinstance(batch, dict) and "caption" in batch:
            self.token_rows.check(batch["caption"], trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.schedule.due(trainer.global_step):
            self.save(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self.save(trainer, pl_module)

    def save(self, trainer, pl_module) -> None:
        step = trainer.global_step
        if step == self.last_step:
            return
        self.last_step = step
        start = time.perf_counter()
        full = trainer.strategy.lightning_module_state_dict()  # keys "model.<parameter name>"; every rank takes part
        if self.writer is None:
            return
        state = parameter_state((name, full[f"model.{name}"]) for name in self.names)
        sorted_sets = None
        rows = indexed_rows([self.token_rows.record()], step) if self.token_rows is not None else None
        if self.sorted_values:
            try:
                self.prepared = prepare(state, rows, previous=self.prepared)
                sorted_sets = SortedSets(self.prepared.sorted, self.prepared.pooled_sorted, rows)
            except ValueError:  # NaN/Inf weights have no distances: the comparing runs say so themselves
                self.prepared = None
        self.writer.write(step, state, sorted_sets, rows)
        self.seconds.append(time.perf_counter() - start)
        for listener in self.listeners:
            listener.on_snapshot(trainer, pl_module, step, state, self.prepared)

    def results(self) -> dict:
        if not self.seconds:
            return {}
        return {"snapshot_write_seconds": {"mean": sum(self.seconds) / len(self.seconds), "count": len(self.seconds)}}
