"""Captions -> images: encode the captions once, then run the sampler with classifier-free guidance."""

from __future__ import annotations

import torch

from numdev.diffusion.guidance import EMPTY_CAPTION, guided_model
from numdev.diffusion.parametrization import to_epsilon
from numdev.diffusion.samplers import Sampler
from numdev.diffusion.schedule import NoiseSchedule


@torch.no_grad()
def generate(
    model,
    captions: list[str],
    schedule: NoiseSchedule,
    sampler: Sampler,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
    prediction: str = "epsilon",
) -> torch.Tensor:
    """(B, C, H, W) float32 images in [-1, 1] for `captions`, from a DiT-like `model`.

    `model` needs tokenize(captions), encode_text(tokens) and forward(x, t, text), plus
    in_channels and image_size attributes; `prediction` says what its output is (epsilon or v).
    """
    tokens = model.tokenize(list(captions)).to(device)
    null_tokens = model.tokenize([EMPTY_CAPTION] * len(captions)).to(device)
    text, null_text = model.encode_text(tokens), model.encode_text(null_tokens)
    guided = guided_model(model, text, null_text, sampler.guidance)  # guidance is linear: fine on v too

    def eps_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return to_epsilon(schedule, prediction, guided(x, t).float(), x, t)

    shape = (len(captions), model.in_channels, model.image_size, model.image_size)
    return sampler.sample(eps_fn, shape, schedule, generator, device).clamp(-1, 1)
