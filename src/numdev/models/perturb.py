"""Perturb a model's initial weights: by one ulp, or by a relative size eps (the calibration ladder).

`ulp` (the study's noise-floor control): every element moves one unit in the last place away from
zero (0 goes to the smallest subnormal), so |W_ulp - W| == numpy.spacing(|W|) for every element, in
the weights' own dtype; in fp32 that is a relative change between 2^-24 and 2^-23 (ULP_RELATIVE,
the size the ladder gives it).

`relative` (the ladder's init rungs, docs/study.md#ladder): W <- W * (1 + eps * z), z ~ N(0, 1) per
element from its own generator (seed: the run's seed.perturbation), so the perturbation's size is
relative to the initialisation's scale (Altıntaş et al. 2025) and its direction independent of
every other seed. Elements that are 0 stay 0. Config: init_perturbation=ulp, or
init_perturbation={kind: relative, eps: 1e-4}.
"""

from __future__ import annotations

import math

import torch

PERTURBATIONS = ("ulp", "relative")
ULP_RELATIVE = 2.0**-24 * math.sqrt(2)  # fp32: one ulp is 2^-24..2^-23 of |w|; the geometric middle


@torch.no_grad()
def perturb_one_ulp(model: torch.nn.Module) -> None:
    for parameter in model.parameters():
        away_from_zero = torch.where(parameter < 0, -torch.inf, torch.inf).to(parameter.dtype)
        parameter.copy_(torch.nextafter(parameter, away_from_zero))


@torch.no_grad()
def perturb_relative(model: torch.nn.Module, eps: float, seed: int) -> None:
    """W <- W * (1 + eps z) per element, z ~ N(0, 1) from torch.Generator(seed), parameters in order."""
    generator = torch.Generator().manual_seed(seed)
    for parameter in model.parameters():
        z = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
        parameter.mul_((1.0 + eps * z).to(device=parameter.device, dtype=parameter.dtype))


def apply_init_perturbation(model: torch.nn.Module, kind, seed: int = 0) -> None:
    """kind: None (no change), 'ulp', or a mapping {kind: relative, eps: <float>} (config key init_perturbation)."""
    if kind is None:
        return
    if isinstance(kind, str):
        if kind != "ulp":
            raise ValueError(f"init_perturbation={kind!r}: use null, ulp or {{kind: relative, eps: <float>}}")
        perturb_one_ulp(model)
        return
    spec = dict(kind)
    if spec.get("kind") not in PERTURBATIONS:
        raise ValueError(f"init_perturbation.kind={spec.get('kind')!r}: use {' or '.join(PERTURBATIONS)}")
    if spec["kind"] == "ulp":
        perturb_one_ulp(model)
        return
    eps = spec.get("eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 < eps < 1):
        raise ValueError(f"init_perturbation.eps={eps!r} must be a number in (0, 1)")
    perturb_relative(model, float(eps), seed)
