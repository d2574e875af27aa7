"""Held-out loss: the diffusion loss on images training never draws, at fixed timesteps and noise.

Every run of a study evaluates the same images (the data module's `heldout_dataset`), the same
evenly spaced timesteps and the same noise (from `seed`), with captions kept, in the run's own
precision and attention: the numbers of two sibling runs differ only because their weights do.
At the end of training: heldout.json in the run directory and loss/heldout in TensorBoard.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch

from numdev.diffusion import diffusion_loss, training_target
from numdev.runs.atomic import write_json
from numdev.runs.layout import HELDOUT


class HeldOutLoss(pl.Callback):
    def __init__(self, run_dir: str, num_images: int = 256, batch_size: int = 64, seed: int = 0):
        for name, value in (("num_images", num_images), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"callbacks.heldout.{name}={value!r} must be a positive integer")
        self.run_dir, self.num_images, self.batch_size, self.seed = Path(run_dir), num_images, batch_size, seed
        self.result: dict | None = None

    def on_train_end(self, trainer, pl_module) -> None:
        make = getattr(trainer.datamodule, "heldout_dataset", None)
        if make is None or not trainer.is_global_zero:  # data without a held-out split: nothing to report
            return
        loss = self.evaluate(trainer, pl_module, make(self.num_images))
        self.result = {"step": int(trainer.global_step), "heldout_loss": loss, "images": self.num_images, "seed": self.seed}
        write_json(self.run_dir / HELDOUT, self.result)
        if trainer.logger:
            trainer.logger.log_metrics({"loss/heldout": loss}, step=trainer.global_step)

    @torch.no_grad()
    def evaluate(self, trainer, pl_module, dataset) -> float:
        model, schedule = pl_module.model, pl_module.schedule
        generator = torch.Generator().manual_seed(self.seed)
        steps = torch.linspace(0, schedule.num_steps - 1, len(dataset)).round().long()  # every noise level
        was_training = model.training
        model.eval()
        total = 0.0
        try:
            for start in range(0, len(dataset), self.batch_size):
                items = [dataset[i] for i in range(start, min(start + self.batch_size, len(dataset)))]
                images = torch.stack([item["image"] for item in items]).to(pl_module.device, pl_module.param_dtype)
                t = steps[start : start + len(items)].to(pl_module.device)
                noise = torch.randn(images.shape, generator=generator).to(pl_module.device, images.dtype)
                with trainer.precision_plugin.forward_context():
                    tokens = model.tokenize([item["caption"] for item in items]).to(pl_module.device)
                    predicted = model(schedule.add_noise(images, noise, t), t, model.encode_text(tokens))
                    target = training_target(schedule, pl_module.prediction, images, noise, t)
                total += float(diffusion_loss(predicted, target)) * len(items)
        finally:
            model.train(was_training)
        return total / len(dataset)
