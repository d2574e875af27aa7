"""The objective a run trains with, also for a config saved before the `objective` group existed.

Such a config (a run of an older numdev) trained the diffusion objective with its `diffusion` block's
settings: `objective_of` gives that node, so the training app can rebuild the run and a study's
consistency check can compare it with a newer run's `objective` (numdev.analysis.consistency).
"""

from __future__ import annotations

DIFFUSION = "numdev.train.module.DiffusionModule"


def objective_of(config):
    """config's `objective` node (a DictConfig or a YAML-read dict), or the diffusion objective an older config trained."""
    node = config.get("objective")
    if node is not None or config.get("diffusion") is None:
        return node
    diffusion = config["diffusion"]
    return {"_target_": DIFFUSION, "_partial_": True,
            **{key: diffusion.get(key) for key in ("schedule", "sampler", "p_uncond", "prediction")}}
