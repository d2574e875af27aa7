"""What the network outputs: the noise (epsilon, DDPM) or the velocity v (Salimans & Ho).

    x_t = a x_0 + s eps,  a = sqrt(alpha_bar_t), s = sqrt(1 - alpha_bar_t)
    epsilon:  the network predicts eps; the loss is |eps_hat - eps|^2 (Ho et al.)
    v:        the network predicts v = a eps - s x_0; the loss is |v_hat - v|^2

Both are mean squared errors on the network output; they weight the noise levels differently.
In terms of x_0, epsilon's loss weighs each level by its signal-to-noise ratio a^2/s^2, so the
very noisy levels, where layout and colour are decided, hardly count; v weighs them by SNR + 1.
Samplers work with eps either way (`to_epsilon`).
"""

from __future__ import annotations

import torch

from numdev.diffusion.schedule import NoiseSchedule

PREDICTIONS = ("epsilon", "v")


def check_prediction(prediction: str) -> str:
    if prediction not in PREDICTIONS:
        raise ValueError(f"diffusion.prediction={prediction!r}: use one of {', '.join(PREDICTIONS)}")
    return prediction


def training_target(schedule: NoiseSchedule, prediction: str, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    if prediction == "epsilon":
        return noise
    a, s = schedule.signal_noise(t, x0.dtype)
    return a * noise - s * x0


def to_epsilon(schedule: NoiseSchedule, prediction: str, output: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """eps from the network's output at x_t (B, C, H, W), timesteps t (B,)."""
    if prediction == "epsilon":
        return output
    a, s = schedule.signal_noise(t, output.dtype)
    return s * x_t.to(output.dtype) + a * output
