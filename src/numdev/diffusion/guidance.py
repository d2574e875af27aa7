"""Classifier-free guidance (Ho & Salimans): push the conditional prediction away from the unconditional one.

eps = eps_uncond + scale * (eps_cond - eps_uncond); scale 1 is the plain conditional model, 0 the
unconditional one. The model learns both by seeing the empty caption for a fraction p_uncond of
training examples.
"""

from __future__ import annotations

import torch

EMPTY_CAPTION = ""


def guided_epsilon(eps_cond: torch.Tensor, eps_uncond: torch.Tensor, scale: float) -> torch.Tensor:
    return eps_uncond + scale * (eps_cond - eps_uncond)


def guided_model(model, text, null_text, scale: float):
    """eps(x, t) of `model` (x, t, text features) under guidance `scale`.

    The conditional and unconditional halves run as one batch of 2B. `text` and `null_text` are
    text-feature tuples (e.g. numdev.models.TextFeatures) of the same batch size.
    """

    def eps_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if scale == 1.0:
            return model(x, t, text)
        both = type(text)(*(torch.cat([c, u]) for c, u in zip(text, null_text)))
        eps_cond, eps_uncond = model(torch.cat([x, x]), torch.cat([t, t]), both).chunk(2)
        return guided_epsilon(eps_cond, eps_uncond, scale)

    return eps_fn
