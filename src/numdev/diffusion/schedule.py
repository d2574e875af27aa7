"""The DDPM noise schedule: how much signal is left at each of T discrete timesteps.

alpha_bar[t] = prod_{s<=t} (1 - beta_s); x_t = sqrt(alpha_bar[t]) x_0 + sqrt(1 - alpha_bar[t]) eps.
Held in float64 and cast on use, so every precision sees the same schedule.
"""

from __future__ import annotations

import math

import torch

KINDS = ("linear", "cosine")


class NoiseSchedule:
    def __init__(self, num_steps: int = 1000, kind: str = "linear", beta_start: float = 1e-4, beta_end: float = 0.02):
        if kind not in KINDS:
            raise ValueError(f"unknown noise schedule {kind!r}: use one of {', '.join(KINDS)}")
        if num_steps < 2:
            raise ValueError(f"diffusion.schedule.num_steps={num_steps} must be at least 2")
        self.num_steps, self.kind = num_steps, kind
        if kind == "linear":  # DDPM (Ho et al.)
            betas = torch.linspace(beta_start, beta_end, num_steps, dtype=torch.float64)
        else:  # improved DDPM (Nichol & Dhariwal)
            s = 0.008
            f = torch.cos((torch.arange(num_steps + 1, dtype=torch.float64) / num_steps + s) / (1 + s) * math.pi / 2) ** 2
            betas = (1 - f[1:] / f[:-1]).clamp(max=0.999)
        self.betas = betas  # (T,)
        self.alpha_bar = torch.cumprod(1 - betas, dim=0)  # (T,)

    def signal_noise(self, t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """sqrt(alpha_bar[t]) and sqrt(1 - alpha_bar[t]) shaped (B, 1, 1, 1) for image batches."""
        ab = self.alpha_bar.to(t.device)[t]
        return ab.sqrt().to(dtype).view(-1, 1, 1, 1), (1 - ab).sqrt().to(dtype).view(-1, 1, 1, 1)

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x_t from x_0 (B, C, H, W), noise like x_0, timesteps t (B,)."""
        signal, sigma = self.signal_noise(t, x0.dtype)
        return signal * x0 + sigma * noise

    def describe(self) -> dict:
        return {"num_steps": self.num_steps, "kind": self.kind}
