"""Samplers: from pure noise to an image, with a noise predictor eps(x_t, t).

Both walk a respaced subsequence of the training timesteps (T-1 ... 0) and, at each step,
estimate x_0 from the predicted noise (clipped to the data range [-1, 1]), then:
  ddim  move deterministically (eta=0) or partly stochastically (eta>0) to the previous step
        (Song et al., DDIM);
  ddpm  draw from the DDPM posterior q(x_prev | x_t, x_0) with the respaced betas (Ho et al.;
        the respacing of Nichol & Dhariwal): ancestral sampling.
The last step returns the x_0 estimate itself. Noise comes from an explicit generator.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from numdev.diffusion.schedule import NoiseSchedule

KINDS = ("ddim", "ddpm")
EpsilonFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Sampler:
    def __init__(self, kind: str = "ddim", steps: int = 25, eta: float = 0.0, guidance: float = 3.0, clip: bool = True):
        if kind not in KINDS:
            raise ValueError(f"unknown sampler {kind!r}: use one of {', '.join(KINDS)}")
        if steps < 1:
            raise ValueError(f"diffusion.sampler.steps={steps} must be at least 1")
        if eta < 0:
            raise ValueError(f"diffusion.sampler.eta={eta} must be >= 0")
        self.kind, self.steps, self.eta, self.guidance, self.clip = kind, steps, eta, guidance, clip

    def timesteps(self, schedule: NoiseSchedule) -> list[int]:
        """Descending, distinct training timesteps from T-1 to 0."""
        steps = min(self.steps, schedule.num_steps)
        ts = torch.linspace(schedule.num_steps - 1, 0, steps, dtype=torch.float64).round().long().tolist()
        return sorted(set(ts), reverse=True)

    @torch.no_grad()
    def sample(
        self,
        eps_fn: EpsilonFn,
        shape: tuple[int, ...],
        schedule: NoiseSchedule,
        generator: torch.Generator,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """Images (B, C, H, W) in float32, roughly in [-1, 1]."""
        x = torch.randn(shape, generator=generator, dtype=torch.float32).to(device)
        alpha_bar = schedule.alpha_bar
        ts = self.timesteps(schedule)
        x0 = x
        for i, t in enumerate(ts):
            ab = float(alpha_bar[t])
            ab_prev = float(alpha_bar[ts[i + 1]]) if i + 1 < len(ts) else 1.0
            t_batch = torch.full((shape[0],), t, dtype=torch.long, device=device)
            eps = eps_fn(x, t_batch).float()
            x0 = (x - (1 - ab) ** 0.5 * eps) / ab**0.5
            if self.clip:
                x0 = x0.clamp(-1, 1)
                eps = (x - ab**0.5 * x0) / (1 - ab) ** 0.5
            if i + 1 == len(ts):
                break
            z = torch.randn(shape, generator=generator, dtype=torch.float32).to(device)
            if self.kind == "ddim":
                sigma = self.eta * ((1 - ab_prev) / (1 - ab) * (1 - ab / ab_prev)) ** 0.5
                x = ab_prev**0.5 * x0 + max(1 - ab_prev - sigma**2, 0.0) ** 0.5 * eps + sigma * z
            else:
                beta = 1 - ab / ab_prev  # the respaced step's beta
                mean = (ab_prev**0.5 * beta * x0 + (1 - beta) ** 0.5 * (1 - ab_prev) * x) / (1 - ab)
                variance = beta * (1 - ab_prev) / (1 - ab)
                x = mean + variance**0.5 * z
        return x0

    def describe(self) -> dict:
        return {"kind": self.kind, "steps": self.steps, "eta": self.eta, "guidance": self.guidance, "clip": self.clip}
