"""The LightningModules (the glue, not the model): what every workload shares, and DDPM training.

`TrainModule` holds what every objective shares (conf/train/objective/): the optimizer with warmup,
constant and cooldown, the gradient norm, and the run's noise generator (seed.noise), whose state goes
into every Lightning checkpoint so a resumed run continues the exact stream. `DiffusionModule` trains a
text-conditioned image model: one step draws timesteps, noise and caption dropout from that generator,
noises the images, predicts from the (possibly emptied) captions, MSE. The language model's and a user's
model's objectives are numdev.train.language and numdev.train.model_loss. Nothing in a step draws from
the global RNG.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import lightning.pytorch as pl
import torch

from numdev.diffusion import EMPTY_CAPTION, NoiseSchedule, Sampler, diffusion_loss, draw_noise, training_target
from numdev.diffusion.parametrization import check_prediction

CHECKPOINT_KEY = "numdev"



def lr_factor(step: int, *, warmup: int, cooldown: int = 0, max_steps: int | None = None) -> float:
    """The learning rate's factor at optimizer step `step` (0-based): linear warmup over `warmup` steps,
    constant, then with `cooldown` > 0 a linear decay over the last `cooldown` of `max_steps` (the last
    step's factor is 1 / cooldown, never 0)."""
    factor = min(1.0, (step + 1) / warmup) if warmup else 1.0
    if cooldown:
        factor = min(factor, (max_steps - step) / cooldown)
    return max(factor, 0.0)


class TrainModule(pl.LightningModule):
    """What every workload's LightningModule shares: the model, AdamW (or any optimizer) with warmup,
    constant and cooldown, the gradient norm, and one CPU generator (seed.noise) for whatever a
    training step draws (diffusion's timesteps and noise; nothing for a language model), kept in every
    checkpoint. A workload adds training_step and `heldout` (numdev.train.callbacks.heldout calls it)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        warmup_steps: int = 0,
        cooldown_steps: int = 0,
        max_steps: int | None = None,
        noise_seed: int = 0,
    ):
        super().__init__()
        if warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps={warmup_steps} must be >= 0")
        if cooldown_steps < 0 or (cooldown_steps and (max_steps is None or warmup_steps + cooldown_steps > max_steps)):
            raise ValueError(f"optim.cooldown_steps={cooldown_steps} must be >= 0 and, with optim.warmup_steps={warmup_steps}, "
                             f"fit in trainer.max_steps={max_steps}")
        self.model = model
        self.optimizer_factory = optimizer
        self.warmup_steps = warmup_steps
        self.cooldown_steps, self.max_steps = cooldown_steps, max_steps
        self.noise = torch.Generator().manual_seed(int(noise_seed))  # CPU: the same draws on every device

    @property
    def param_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _world(self) -> tuple[int, int]:
        trainer = self._trainer  # None outside a Trainer
        return (int(trainer.global_rank), int(trainer.world_size)) if trainer is not None else (0, 1)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Called after the gradient scaler (fp16-mixed) has unscaled and before clipping.
        if self.trainer.global_step % max(1, self.trainer.log_every_n_steps):
            return
        norms = [p.grad.detach().float().norm() for p in self.model.parameters() if p.grad is not None]
        if norms:
            self.log("train/grad_norm", torch.stack(norms).norm(), batch_size=1)

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.model.parameters())
        # Linear warmup, then constant (as DiT), then (optim.cooldown_steps > 0) a linear decay to 0 over
        # the last cooldown_steps of trainer.max_steps (warmup-stable-decay). Without a cooldown the
        # schedule does not depend on max_steps, so a finished run can be resumed with a larger
        # max_steps and continue on the same curve.
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(
            lr_factor, warmup=self.warmup_steps, cooldown=self.cooldown_steps, max_steps=self.max_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = {"noise_generator": self.noise.get_state()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if CHECKPOINT_KEY not in checkpoint:
            raise ValueError("the checkpoint has no numdev noise-generator state: it was not written by numdev-train")
        self.noise.set_state(checkpoint[CHECKPOINT_KEY]["noise_generator"])


class DiffusionModule(TrainModule):
    """DDPM-style training of a text-conditioned image model (numdev.models.DiT)."""

    def __init__(
        self,
        model: torch.nn.Module,
        schedule: NoiseSchedule,
        sampler: Sampler,
        optimizer: Callable[..., torch.optim.Optimizer],
        warmup_steps: int = 0,
        cooldown_steps: int = 0,
        max_steps: int | None = None,
        p_uncond: float = 0.1,
        noise_seed: int = 0,
        prediction: str = "epsilon",
    ):
        if not 0.0 <= p_uncond < 1.0:
            raise ValueError(f"diffusion.p_uncond={p_uncond} must be in [0, 1)")
        super().__init__(model, optimizer, warmup_steps, cooldown_steps, max_steps, noise_seed)
        self.schedule, self.sampler, self.p_uncond = schedule, sampler, p_uncond
        self.prediction = check_prediction(prediction)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if "image" not in batch:
            raise ValueError(f"model={getattr(self.model, 'name', type(self.model).__name__)} trains on captioned images, but the "
                             "data gives none: choose an image data set (data=shapes, data=folder, data=webdataset)")
        images = batch["image"].to(self.param_dtype)  # (B, C, H, W): float32, or the true-precision dtype
        draw = self.draw(tuple(images.shape))
        captions = [EMPTY_CAPTION if drop else c for c, drop in zip(batch["caption"], draw.drop_caption.tolist())]
        tokens = self.model.tokenize(captions).to(self.device)  # (B, L)
        t = draw.t.to(self.device)
        noise = draw.noise.to(self.device, images.dtype)
        x_t = self.schedule.add_noise(images, noise, t)
        predicted = self.model(x_t, t, self.model.encode_text(tokens))
        loss = diffusion_loss(predicted, training_target(self.schedule, self.prediction, images, noise, t))
        distributed = self._world()[1] > 1
        self.log("loss/train", loss, prog_bar=True, batch_size=len(captions), sync_dist=distributed)
        return loss

    def draw(self, shape: tuple[int, ...]):
        """This rank's rows of the global batch's noise draw.

        Every rank draws for the whole global batch (batch x world size, as the data sampler
        splits it) and keeps its own slice, so a DDP run sees exactly the timesteps, noise and
        caption dropout of a one-process run with the same global batch, and the generator state
        stays the same on every rank. With one process this is the plain draw.
        """
        rank, world = self._world()
        if world == 1:
            return draw_noise(shape, self.schedule, self.p_uncond, self.noise)
        full = draw_noise((shape[0] * world, *shape[1:]), self.schedule, self.p_uncond, self.noise)
        rows = slice(rank * shape[0], (rank + 1) * shape[0])
        return type(full)(t=full.t[rows], noise=full.noise[rows], drop_caption=full.drop_caption[rows])

    def heldout(self, dataset, *, seed: int, batch_size: int, forward_context: Callable, keep_predictions: bool):
        """The diffusion loss on held-out images (numdev.train.callbacks.heldout.heldout_evaluation)."""
        from numdev.train.callbacks.heldout import heldout_evaluation

        return heldout_evaluation(self.model, self.schedule, self.prediction, dataset, seed=seed, batch_size=batch_size,
                                  device=self.device, dtype=self.param_dtype, forward_context=forward_context,
                                  keep_predictions=keep_predictions)
