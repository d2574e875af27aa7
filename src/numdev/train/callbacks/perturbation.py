"""A weight perturbation applied during training: init_perturbation with `step: t` (t > 0).

The perturbation (numdev.models.perturb: one ulp, or W(1 + eps z) with z from seed.perturbation) is
applied once, when the global step becomes t: after step t - 1's optimizer update and before
anything else looks at those weights (this callback runs before the snapshot hub, and Lightning
runs the checkpoint callback last), so step t's forward, snapshot t, a checkpoint at t and the
samples at t all see the perturbed weights, and snapshots 0..t-1 are the unperturbed run's.

Resume needs no state of its own: the perturbation fires on the transition to step t. A run
resumed from a checkpoint at step t or later holds it already (the checkpoint at t is written
after it) and never makes that transition again; one resumed from before t makes it and perturbs
at t. Under DDP every rank applies the same draw to its replica; under FSDP (sharded parameters)
it is refused.
"""

from __future__ import annotations

import logging

import lightning.pytorch as pl

from numdev.models.perturb import Perturbation, perturb

log = logging.getLogger(__name__)


class PerturbAtStep(pl.Callback):
    def __init__(self, perturbation: Perturbation, seed: int):
        if perturbation.step <= 0:
            raise ValueError(f"init_perturbation.step={perturbation.step}: a step-0 perturbation is applied when the model is built")
        self.perturbation, self.seed = perturbation, seed
        self._step_at_start: int | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        from lightning.pytorch.strategies import FSDPStrategy

        if isinstance(trainer.strategy, FSDPStrategy):
            raise ValueError(f"init_perturbation.step={self.perturbation.step}: a perturbation during training is not "
                             "implemented under FSDP (sharded parameters); use step 0 (at initialisation) or trainer=ddp_gpu")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step_at_start = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = self.perturbation.step
        if trainer.global_step == step and self._step_at_start == step - 1:  # this batch's update made step t
            perturb(pl_module.model, self.perturbation, self.seed)
            log.debug("perturbed the weights at the start of step %d: %s", step, self.perturbation)
