"""The LightningModule of any nn.Module that computes its own loss (the bring-your-own-model protocol).

The model (model._target_: any importable nn.Module) is built with `attention=<numdev backend>`
among its arguments and implements

    loss(batch) -> a scalar tensor           the mean loss of a batch (training and held-out)
    item_losses(batch) -> a (B,) tensor      optional: each item's loss (the held-out set's own error)

Its attention should go through numdev.models.attention.Attention (or call the backend it was given,
backend(q, k, v, causal=...) on (B, H, N, D) tensors), so attention=..., the shadow and the optimizations
apply to it. Nothing in a step draws random numbers here; a model that needs noise draws it from its
own generator. docs/workloads.md#custom gives the whole recipe.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
from torch.utils.data import DataLoader

from numdev.train.callbacks.heldout import HeldOutResult
from numdev.train.module import TrainModule


class ModelLossModule(TrainModule):
    def __init__(self, model: torch.nn.Module, *args, **kwargs):
        if not callable(getattr(model, "loss", None)):
            raise ValueError(f"model._target_ builds a {type(model).__name__} without a loss(batch) method: objective=model_loss "
                             "needs one (docs/workloads.md#custom), or choose the objective that trains it")
        super().__init__(model, *args, **kwargs)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("loss/train", loss, prog_bar=True, batch_size=_batch_size(batch), sync_dist=self._world()[1] > 1)
        return loss

    def _loss(self, batch) -> torch.Tensor:
        loss = self.model.loss(batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(f"{type(self.model).__name__}.loss(batch) returned {type(loss).__name__}"
                             f"{'' if not isinstance(loss, torch.Tensor) else f' of shape {list(loss.shape)}'}: it must return a scalar tensor")
        return loss.reshape(())

    @torch.no_grad()
    def heldout(self, dataset, *, seed: int, batch_size: int, forward_context: Callable, keep_predictions: bool) -> HeldOutResult:
        """The mean of loss(batch) over the held-out items, each batch weighted by its size (and, with
        item_losses, each item's loss). No predictions are kept: the model's outputs are its own."""
        was_training = self.model.training
        self.model.eval()
        total, count, digest, items = 0.0, 0, hashlib.sha256(), []
        try:
            for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
                batch = self.transfer_batch_to_device(batch, self.device, 0)
                _digest(digest, batch)
                size = _batch_size(batch)
                with forward_context():
                    total += float(self._loss(batch).double()) * size
                    if callable(getattr(self.model, "item_losses", None)):
                        items += self.model.item_losses(batch).double().reshape(-1).tolist()
                count += size
        finally:
            self.model.train(was_training)
        extra = {"item_losses": items} if len(items) == count else {}
        return HeldOutResult(total / count, digest.hexdigest(), None, extra=extra)


def _batch_size(batch) -> int:
    """The number of items in a collated batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else []
    for value in values:
        size = _batch_size(value) if isinstance(value, (torch.Tensor, dict, list, tuple)) else None
        if size:
            return size
    return 1


def _digest(digest, batch) -> None:
    """Fold a batch's tensors into the held-out inputs' sha256 (which held-out set was evaluated)."""
    if isinstance(batch, torch.Tensor):
        digest.update(batch.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(batch, dict):
        for key in sorted(batch):
            _digest(digest, batch[key])
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            _digest(digest, value)
