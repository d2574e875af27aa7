"""Perturb a model's initial weights by exactly one unit in the last place (ulp) per element.

The study's noise-floor control: a run whose start differs from the reference's by the smallest
step the weights' format can take shows how far training's own chaos carries a difference that
small. Every element moves away from zero (0 goes to the smallest subnormal), so
|W_ulp - W| == numpy.spacing(|W|) for every element, in the weights' own dtype.
"""

from __future__ import annotations

import torch

PERTURBATIONS = ("ulp",)


@torch.no_grad()
def perturb_one_ulp(model: torch.nn.Module) -> None:
    for parameter in model.parameters():
        away_from_zero = torch.where(parameter < 0, -torch.inf, torch.inf).to(parameter.dtype)
        parameter.copy_(torch.nextafter(parameter, away_from_zero))


def apply_init_perturbation(model: torch.nn.Module, kind: str | None) -> None:
    """kind: None (no change) or 'ulp' (config key init_perturbation)."""
    if kind is None:
        return
    if kind not in PERTURBATIONS:
        raise ValueError(f"init_perturbation={kind!r}: use null or {', '.join(PERTURBATIONS)}")
    perturb_one_ulp(model)
