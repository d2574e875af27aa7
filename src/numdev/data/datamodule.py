"""What every caption data module shares: an endless, resumable training loader.

Batches are {"image": (B, 3, R, R) float32 in [-1, 1], "caption": list of B strings}.
The loader starts at the batch the trainer has already consumed (global step x gradient
accumulation), so a run resumed from a checkpoint continues the data stream exactly; with the
loader being endless, the training length is trainer.max_steps.
"""

from __future__ import annotations

import lightning.pytorch as pl
from torch.utils.data import DataLoader, Dataset

from numdev.data.sampler import StepBatchSampler


def consumed_batches(trainer) -> int:
    """Batches a (possibly resumed) trainer has already trained on; 0 without a trainer."""
    if trainer is None:
        return 0
    return int(trainer.global_step) * int(trainer.accumulate_grad_batches)


def rank_and_world(trainer) -> tuple[int, int]:
    if trainer is None:
        return 0, 1
    return int(trainer.global_rank), int(trainer.world_size)


class CaptionDataModule(pl.LightningDataModule):
    """Subclasses build a map-style dataset of {"image", "caption"} items in `build_dataset`."""

    def __init__(self, batch_size: int, num_workers: int = 0, seed: int = 0):
        super().__init__()
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"data.batch_size={batch_size!r} must be a positive integer")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"data.num_workers={num_workers!r} must be an integer, 0 or more")
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.dataset: Dataset | None = None

    def build_dataset(self) -> Dataset:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.dataset is None:
            self.dataset = self.build_dataset()

    def train_dataloader(self) -> DataLoader:
        self.setup()
        rank, world = rank_and_world(self.trainer)
        sampler = StepBatchSampler(
            len(self.dataset), self.batch_size, self.seed, consumed_batches(self.trainer), rank, world
        )
        # Items depend on their index only, so workers change speed, never content or order.
        return DataLoader(
            self.dataset, batch_sampler=sampler, num_workers=self.num_workers, persistent_workers=False
        )

    def caption_vocabulary(self) -> tuple[list[str], str] | None:
        """Texts whose tokens are exactly the tokens every training caption can have, and a description
        of them; None when the captions are not known before training (they are then recorded as seen).
        The run records which token-embedding rows train from this (numdev.weights.token_rows)."""
        return None

    def preview_captions(self, n: int) -> list[str]:
        """n captions to generate samples for (the same ones at every logging step)."""
        self.setup()
        return [self.dataset[i % len(self.dataset)]["caption"] for i in range(n)]
