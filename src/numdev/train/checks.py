"""Checks before training starts: can this backend run with this precision on this device?

Each check tries the backend on tiny tensors shaped like the model's three kinds of attention
call (image self-attention, cross-attention, causal text self-attention) in the dtype the
attention inputs will have, so every combination that cannot run fails in a second with one
line saying what to change, instead of minutes into training.
"""

from __future__ import annotations

import torch

from numdev.attention.registry import BackendUnavailable
from numdev.cli.errors import one_line

ACCELERATORS = ("cpu", "cuda")
COMPUTE_DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_accelerator(accelerator: str) -> torch.device:
    if accelerator not in ACCELERATORS:
        raise ValueError(
            f"trainer.accelerator={accelerator!r}: use cpu or cuda (trainer=cpu or trainer=gpu), "
            "so precision and attention checks know the device"
        )
    if accelerator == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.accelerator=cuda but no CUDA device is visible: use trainer=cpu")
    return torch.device(accelerator)


def compute_dtype(compute: str) -> torch.dtype:
    if compute not in COMPUTE_DTYPES:
        raise ValueError(f"precision.compute={compute!r}: use one of {', '.join(COMPUTE_DTYPES)}")
    return COMPUTE_DTYPES[compute]


def check_backend(backend, precision: str, dtype: torch.dtype, device: torch.device, calls: list[tuple[int, int]]) -> None:
    """Run `backend` on probe inputs for each (heads, head_dim) in `calls`, with gradients as training
    will (a forward-only kernel or formats preset is refused here, not at the first step); a refusal is
    one line."""
    for heads, head_dim in calls:
        for n_q, n_k, causal in ((4, 4, False), (4, 3, False), (3, 3, True)):
            q = torch.zeros(1, heads, n_q, head_dim, dtype=dtype, device=device, requires_grad=True)
            k = torch.zeros(1, heads, n_k, head_dim, dtype=dtype, device=device, requires_grad=True)
            try:
                with torch.enable_grad():
                    backend(q, k, k, causal=causal)
            except (BackendUnavailable, ValueError) as error:
                raise BackendUnavailable(
                    f"attention={backend.name} with precision={precision} on {device.type}: {one_line(error)}; "
                    "change attention=, precision= or trainer="
                ) from None
