"""Diffusion: noise schedule, DDPM objective, DDIM/DDPM samplers, classifier-free guidance."""

from numdev.diffusion.generate import generate
from numdev.diffusion.guidance import EMPTY_CAPTION, guided_epsilon, guided_model
from numdev.diffusion.objective import NoiseDraw, draw_noise, epsilon_loss
from numdev.diffusion.parametrization import PREDICTIONS, to_epsilon, training_target
from numdev.diffusion.samplers import Sampler
from numdev.diffusion.schedule import NoiseSchedule

__all__ = [
    "PREDICTIONS",
    "to_epsilon",
    "training_target",
   "EMPTY_CAPTION", "NoiseDraw", "NoiseSchedule", "Sampler", "draw_noise", "epsilon_loss", "generate", "guided_epsilon", "guided_model"]
