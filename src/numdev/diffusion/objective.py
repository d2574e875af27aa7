"""The DDPM training objective: noise an image at a uniformly drawn timestep, predict the noise
(epsilon) or the velocity v (parametrization.py), mean squared error.

All randomness (timesteps, noise, which captions are dropped for classifier-free guidance) is
drawn from one explicit CPU generator, the run's diffusion-noise stream (seed.noise), then moved
to the batch's device: the draws are the same on every device and precision, and saving the
generator's state in a checkpoint makes a resumed run draw exactly what an uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from numdev.diffusion.schedule import NoiseSchedule


@dataclass
class NoiseDraw:
    t: torch.Tensor  # (B,) int64 timesteps
    noise: torch.Tensor  # (B, C, H, W) standard normal, float32
    drop_caption: torch.Tensor  # (B,) bool: replace this caption by the empty one


def draw_noise(shape: tuple[int, ...], schedule: NoiseSchedule, p_uncond: float, generator: torch.Generator) -> NoiseDraw:
    batch = shape[0]
    t = torch.randint(0, schedule.num_steps, (batch,), generator=generator)
    noise = torch.randn(shape, generator=generator, dtype=torch.float32)
    drop = torch.rand(batch, generator=generator, dtype=torch.float32) < p_uncond
    return NoiseDraw(t=t, noise=noise, drop_caption=drop)


def diffusion_loss(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error, computed in at least float32 (bf16/fp16 predictions are upcast)."""
    dtype = torch.promote_types(predicted.dtype, torch.float32)
    return F.mse_loss(predicted.to(dtype), target.to(dtype))
