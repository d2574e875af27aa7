"""Diffusion: noise schedule, DDPM objective (epsilon or v), DDIM/DDPM samplers, classifier-free guidance."""

from numdev.diffusion.generate import generate
from numdev.diffusion.guidance import EMPTY_CAPTION, guided_epsilon, guided_model
from numdev.diffusion.objective import NoiseDraw, diffusion_loss, draw_noise
from numdev.diffusion.parametrization import PREDICTIONS, to_epsilon, training_target
from numdev.diffusion.samplers import Sampler
from numdev.diffusion.schedule import NoiseSchedule

__all__ = [
    "EMPTY_CAPTION",
    "PREDICTIONS",
    "NoiseDraw",
    "NoiseSchedule",
    "Sampler",
    "diffusion_loss",
    "draw_noise",
    "generate",
    "guided_epsilon",
    "guided_model",
    "to_epsilon",
    "training_target",
]
