"""Training callbacks: the resume checkpoint, generated samples with their scores (weight snapshots: train/snapshots.py)."""

from __future__ import annotations

import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from numdev.diffusion import generate
from numdev.figures.plotting import save_png
from numdev.figures.samples import sample_figure
from numdev.runs import layout
from numdev.runs.atomic import write_json
from numdev.train.evaluation import score_shapes
from numdev.train.trackers import drawing, log_metrics


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return value


class LastCheckpoint(ModelCheckpoint):
    """Only checkpoints/last.ckpt (overwritten), every `every_n_steps` steps and when training ends."""

    def __init__(self, dirpath: str, every_n_steps: int):
        super().__init__(
            dirpath=dirpath,
            save_last=True,
            save_top_k=0,
            every_n_train_steps=_positive("checkpoint.every_n_steps", every_n_steps),
            enable_version_counter=False,
            save_on_train_epoch_end=False,
        )

    def on_train_end(self, trainer, pl_module) -> None:
        # ModelCheckpoint skips the end of training if it saved earlier; a resumable run needs it.
        if not trainer.fast_dev_run and self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class SampleGrid(pl.Callback):
    """Generate images for fixed captions every `every_n_steps` steps and at the end.

    Each time: a figure of the samples with their captions to TensorBoard ("samples"), and for
    shapes captions their agreement (numdev.train.evaluation) as samples/* scalars. At the end also
    samples.png and eval.json in the run directory. The sampling noise comes from its own
    generator (`seed`), the same every time and for every run, so it never touches training's.
    """

    def __init__(self, run_dir: str, every_n_steps: int = 250, num_samples: int = 36, seed: int = 0, columns: int = 6):
        self.run_dir = Path(run_dir)
        self.every_n_steps = _positive("callbacks.samples.every_n_steps", every_n_steps)
        self.num_samples = _positive("callbacks.samples.num_samples", num_samples)
        self.seed, self.columns = seed, columns
        self.last: dict | None = None  # the latest evaluation: step, images, captions, summary
        self.final: dict | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self.evaluate(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        last = self.evaluate(trainer, pl_module)  # reused if training ended on a sampling step
        if last is None:
            return
        fig = self.figure(last)
        save_png(fig, self.run_dir / layout.SAMPLES, dpi=130)
        write_json(self.run_dir / layout.EVAL, last["summary"])
        self.final = last["summary"]

    def results(self) -> dict:
        if self.final is None:
            return {}
        return {"eval": {k: self.final[k] for k in ("step", "scored", "colour_accuracy", "shape_accuracy", "position_accuracy")}}

    def evaluate(self, trainer, pl_module) -> dict | None:
        """Sample, score and log at the current step (once per step; rank zero only)."""
        step = trainer.global_step
        sharded = "FSDP" in type(trainer.strategy).__name__  # under FSDP a forward pass is a collective: all ranks sample
        if not trainer.is_global_zero and not sharded:
            return None
        if self.last is not None and self.last["step"] == step:
            return self.last if trainer.is_global_zero else None
        captions = trainer.datamodule.preview_captions(self.num_samples)
        start = time.perf_counter()
        images = self.generate(trainer, pl_module, captions)
        scores = score_shapes(images, captions)
        summary = {
            "step": step,
            "sampler": pl_module.sampler.describe(),
            "sample_seed": self.seed,
            "seconds": time.perf_counter() - start,
            **scores,
        }
        self.last = {"step": step, "images": images, "captions": captions, "summary": summary}
        if not trainer.is_global_zero:
            return None
        experiment = drawing(trainer)
        if experiment is not None:
            experiment.add_figure("samples", self.figure(self.last), global_step=step, close=True)
        if scores["scored"]:
            metrics = {f"samples/{k}": scores[k] for k in ("colour_accuracy", "shape_accuracy", "position_accuracy")}
            log_metrics(trainer, metrics, step=step)
        return self.last

    def figure(self, evaluation: dict):
        summary = evaluation["summary"]
        title = f"step {summary['step']}"
        if summary["scored"]:
            title += (
                f": colour {summary['colour_accuracy']:.0%}, shape {summary['shape_accuracy']:.0%}, "
                f"position {summary['position_accuracy']:.0%} of {summary['scored']} match their captions"
            )
        return sample_figure(evaluation["images"], evaluation["captions"], title, summary["samples"], self.columns)

    def generate(self, trainer, pl_module, captions: list[str]) -> torch.Tensor:
        model = pl_module.model
        was_training = model.training
        model.eval()
        try:
            with trainer.precision_plugin.forward_context():
                return generate(
                    model, captions, pl_module.schedule, pl_module.sampler,
                    torch.Generator().manual_seed(self.seed), pl_module.device, pl_module.prediction,
                )
        finally:
            model.train(was_training)
