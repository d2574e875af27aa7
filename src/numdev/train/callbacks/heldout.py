"""Held-out loss: the diffusion loss on images training never draws, at fixed timesteps and noise.

Every run of a study evaluates the same images (the data module's `heldout_dataset`), the same
evenly spaced timesteps and the same noise (from `seed`), with captions kept, in the run's own
precision and attention: the numbers of two sibling runs differ only because their weights do.
At the end of training: heldout.json in the run directory and loss/heldout in TensorBoard; with
`save_predictions` (the default) also the model's predictions on those inputs,
heldout_predictions.safetensors (float32, tensor "prediction", (images, C, H, W)), its sha256 in
heldout.json (numdev.runs.layout.RunDir.read_heldout_predictions checks it), for the
function-level comparisons of numdev.analysis.function_level.

`heldout_evaluation` is the one evaluation: the callback calls it on the trained model, and
numdev.analysis.function_level.loss_barrier on interpolated weights.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import lightning.pytorch as pl
import torch

from numdev.diffusion import diffusion_loss, training_target
from numdev.runs.atomic import write_json
from numdev.runs.layout import HELDOUT, write_heldout_predictions
from numdev.train.trackers import log_metrics

HELDOUT_IMAGES, HELDOUT_SEED = 256, 0  # the callback's defaults (conf/train/callbacks/default.yaml sets the same)
HELDOUT_BATCH_SIZE = 64  # images per forward pass (the loss sums per-batch means: the same batches give the same number)


@dataclass(frozen=True)
class HeldOutResult:
    loss: float  # the mean diffusion loss over the held-out images
    inputs_sha256: str  # of the images (float32), timesteps (int64) and noise (float32) evaluated: which held-out set
    predictions: torch.Tensor | None  # (images, C, H, W) float32 on CPU, with keep_predictions (a language model: its greedy tokens)
    extra: dict = field(default_factory=dict)  # a workload's further measures (a language model's perplexity, tokens)


@torch.no_grad()
def heldout_evaluation(model: torch.nn.Module, schedule, prediction: str, dataset, *, seed: int, batch_size: int,
                       device, dtype: torch.dtype, forward_context: Callable, keep_predictions: bool = False) -> HeldOutResult:
    """The diffusion loss of `model` on `dataset` at evenly spaced timesteps and noise from `seed`.

    forward_context: the run's precision context (a precision plugin's `forward_context`); dtype:
    the dtype the model's parameters are in (images are cast to it). The model is put in eval mode
    and back. The loss is the mean over images of the per-batch MSE weighted by the batch's size.
    """
    was_training = model.training
    model.eval()
    total, digest, kept = 0.0, hashlib.sha256(), []
    try:
        for pixels, t, noise, captions in heldout_batches(dataset, schedule, seed=seed, batch_size=batch_size):
            images = pixels.to(device, dtype)
            for part in (pixels.float(), t, noise):
                digest.update(part.contiguous().numpy().tobytes())
            t, noise = t.to(device), noise.to(device, images.dtype)
            with forward_context():
                tokens = model.tokenize(captions).to(device)
                predicted = model(schedule.add_noise(images, noise, t), t, model.encode_text(tokens))
                target = training_target(schedule, prediction, images, noise, t)
            total += float(diffusion_loss(predicted, target)) * len(captions)
            if keep_predictions:
                kept.append(predicted.detach().to("cpu", torch.float32))
    finally:
        model.train(was_training)
    return HeldOutResult(total / len(dataset), digest.hexdigest(), torch.cat(kept) if keep_predictions else None)


def heldout_batches(dataset, schedule, *, seed: int, batch_size: int):
    """The held-out inputs every run is evaluated on, batch by batch: (pixels, timesteps, noise, captions), the
    timesteps evenly spaced over the schedule across the images, the noise drawn from `seed` in batch order."""
    generator = torch.Generator().manual_seed(seed)
    steps = torch.linspace(0, schedule.num_steps - 1, len(dataset)).round().long()  # every noise level
    for start in range(0, len(dataset), batch_size):
        items = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        pixels = torch.stack([item["image"] for item in items])
        noise = torch.randn(pixels.shape, generator=generator)
        yield pixels, steps[start : start + len(items)], noise, [item["caption"] for item in items]


def heldout_targets(dataset, schedule, prediction: str, *, seed: int, batch_size: int) -> torch.Tensor:
    """The training targets of the held-out inputs (float32, (images, C, H, W)): with a run's saved predictions,
    its loss image by image."""
    return torch.cat([training_target(schedule, prediction, pixels.float(), noise, t).float()
                      for pixels, t, noise, _ in heldout_batches(dataset, schedule, seed=seed, batch_size=batch_size)])


class HeldOutLoss(pl.Callback):
    def __init__(self, run_dir: str, num_images: int = HELDOUT_IMAGES, batch_size: int = HELDOUT_BATCH_SIZE, seed: int = HELDOUT_SEED,
                 save_predictions: bool = True):
        for name, value in (("num_images", num_images), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"callbacks.heldout.{name}={value!r} must be a positive integer")
        if not isinstance(save_predictions, bool):
            raise ValueError(f"callbacks.heldout.save_predictions={save_predictions!r} must be true or false")
        self.run_dir, self.num_images, self.batch_size, self.seed = Path(run_dir), num_images, batch_size, seed
        self.save_predictions = save_predictions
        self.result: dict | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        make = getattr(trainer.datamodule, "heldout_dataset", None)
        if make is not None:  # a held-out set that cannot be made (more items than it has, none given) fails now, not after training
            make(self.num_images)

    def on_train_end(self, trainer, pl_module) -> None:
        make = getattr(trainer.datamodule, "heldout_dataset", None)
        if make is None or not trainer.is_global_zero:  # data without a held-out split: nothing to report
            return
        evaluated = pl_module.heldout(  # the workload's own held-out measure (numdev.train.module, numdev.train.language)
            make(self.num_images), seed=self.seed, batch_size=self.batch_size,
            forward_context=trainer.precision_plugin.forward_context, keep_predictions=self.save_predictions,
        )
        step = int(trainer.global_step)
        self.result = {"step": step, "heldout_loss": evaluated.loss, "images": self.num_images, "seed": self.seed,
                       "inputs_sha256": evaluated.inputs_sha256, **evaluated.extra}
        if evaluated.predictions is not None:  # the file first, then the record that names its checksum
            self.result["predictions"] = write_heldout_predictions(
                self.run_dir, evaluated.predictions.numpy(), step=step, images=self.num_images, seed=self.seed)
        write_json(self.run_dir / HELDOUT, self.result)
        log_metrics(trainer, {"loss/heldout": evaluated.loss}, step=trainer.global_step)
