"""Perturb a model's weights: by one ulp, or by a relative size eps (the calibration ladder), at
initialisation or at the start of a later training step.

`ulp` (the study's noise-floor control): every element moves one unit in the last place away from
zero (0 goes to the smallest subnormal), so |W_ulp - W| == numpy.spacing(|W|) for every element, in
the weights' own dtype; in fp32 that is a relative change between 2^-24 and 2^-23 (ULP_RELATIVE,
the size the ladder gives it).

`relative` (the ladder's init rungs, docs/study.md#ladder): W <- W * (1 + eps * z), z ~ N(0, 1) per
element from its own generator (seed: the run's seed.perturbation), so the perturbation's size is
relative to the initialisation's scale (Altıntaş et al. 2025) and its direction independent of
every other seed. Elements that are 0 stay 0. The product is formed in fp32 (fp64 for fp64
weights) and rounded once to the weights' dtype. Config: init_perturbation=ulp, or
init_perturbation={kind: relative, eps: 1e-4}.

`step` (default 0): when. 0 is at initialisation, before step 0's snapshot (numdev.train.run);
t > 0 is at the start of training step t, after step t - 1's update and before step t's forward
(numdev.train.callbacks.perturbation): the run is its unperturbed twin up to snapshot t - 1, and
snapshot t is the first that holds the perturbation (The Butterfly Effect, Altıntaş et al. 2025:
perturbations after warm-up). The same generator rule either way: z is drawn afresh from
torch.Generator(seed) over the parameters in order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PERTURBATIONS = ("ulp", "relative")
ULP_RELATIVE = 2.0**-24 * math.sqrt(2)  # fp32: one ulp is 2^-24..2^-23 of |w|; the geometric middle
USE = "use null, ulp or {kind: relative, eps: <float>, step: <int>} (step: the training step it is applied at, 0 at initialisation)"


@dataclass(frozen=True)
class Perturbation:
    kind: str  # ulp | relative
    eps: float | None = None  # relative: the size
    step: int = 0  # 0: at initialisation; t > 0: at the start of training step t


def parse_perturbation(spec) -> Perturbation | None:
    """The config key init_perturbation, checked: None, 'ulp', or a mapping {kind, eps (relative), step}."""
    if spec is None:
        return None
    if isinstance(spec, str):
        if spec != "ulp":
            raise ValueError(f"init_perturbation={spec!r}: {USE}")
        return Perturbation("ulp")
    try:
        spec = dict(spec)
    except (TypeError, ValueError):
        raise ValueError(f"init_perturbation={spec!r}: {USE}") from None
    unknown = sorted(set(spec) - {"kind", "eps", "step"})
    if unknown:
        raise ValueError(f"init_perturbation.{unknown[0]}: not a setting of the perturbation; {USE}")
    kind = spec.get("kind")
    if kind not in PERTURBATIONS:
        raise ValueError(f"init_perturbation.kind={kind!r}: use {' or '.join(PERTURBATIONS)}")
    step = spec.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"init_perturbation.step={step!r} must be a non-negative integer (0: at initialisation; t: at the start of training step t)")
    if kind == "ulp":
        if spec.get("eps") is not None:
            raise ValueError(f"init_perturbation.eps={spec['eps']!r}: a ulp perturbation has no size; use kind=relative for one")
        return Perturbation("ulp", step=step)
    eps = spec.get("eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 < eps < 1):
        raise ValueError(f"init_perturbation.eps={eps!r} must be a number in (0, 1)")
    return Perturbation("relative", float(eps), step)


@torch.no_grad()
def perturb_one_ulp(model: torch.nn.Module) -> None:
    for parameter in model.parameters():
        away_from_zero = torch.where(parameter < 0, -torch.inf, torch.inf).to(parameter.dtype)
        parameter.copy_(torch.nextafter(parameter, away_from_zero))


@torch.no_grad()
def perturb_relative(model: torch.nn.Module, eps: float, seed: int) -> None:
    """W <- W * (1 + eps z) per element, z ~ N(0, 1) from torch.Generator(seed), parameters in order;
    the product in fp32 (fp64 weights: fp64), rounded once to the weights' dtype."""
    generator = torch.Generator().manual_seed(seed)
    for parameter in model.parameters():
        z = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
        work = torch.promote_types(parameter.dtype, torch.float32)
        factor = (1.0 + eps * z).to(device=parameter.device, dtype=work)
        parameter.copy_((parameter.to(work) * factor).to(parameter.dtype))


def perturb(model: torch.nn.Module, perturbation: Perturbation, seed: int = 0) -> None:
    """Apply `perturbation` to the model's weights now (its `step` says when the caller does this)."""
    if perturbation.kind == "ulp":
        perturb_one_ulp(model)
    else:
        perturb_relative(model, perturbation.eps, seed)


def apply_init_perturbation(model: torch.nn.Module, kind, seed: int = 0) -> None:
    """kind: the config key init_perturbation (None: no change). Applied here only when its step is 0
    (at initialisation); a later step is numdev.train.callbacks.perturbation's."""
    perturbation = parse_perturbation(kind)
    if perturbation is not None and perturbation.step == 0:
        perturb(model, perturbation, seed)
