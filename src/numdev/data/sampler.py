"""An endless, resumable, seeded order of dataset indices, cut into batches.

The stream is epoch 0's permutation, then epoch 1's, ... each drawn from (seed, epoch) alone, and
batch b is a fixed slice of it. So the order depends on seed.data and nothing else (not on
workers, devices' timing or the global RNG), and a run resumed at step s starts at batch s of the
very same stream: no sampler state needs saving. With several devices, each global batch of
batch_size x world_size indices is split by rank.
"""

from __future__ import annotations

import numpy as np


class StepBatchSampler:
    def __init__(self, size: int, batch_size: int, seed: int, start_batch: int = 0, rank: int = 0, world_size: int = 1):
        if size <= 0:
            raise ValueError("the dataset is empty: nothing to train on")
        if batch_size <= 0:
            raise ValueError(f"data.batch_size={batch_size} must be a positive integer")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.start_batch, self.rank, self.world_size = start_batch, rank, world_size
        self._epoch, self._perm = None, None

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.size)
        return self._perm

    def batch(self, b: int) -> list[int]:
        """Indices of this rank's part of global batch b."""
        first = (b * self.world_size + self.rank) * self.batch_size  # position in the endless stream
        out = []
        for position in range(first, first + self.batch_size):
            epoch, i = divmod(position, self.size)
            out.append(int(self.permutation(epoch)[i]))
        return out

    def __iter__(self):
        b = self.start_batch
        while True:  # endless: training length is trainer.max_steps
            yield self.batch(b)
            b += 1
