"""Any map-style datasets as numdev's data: a user's own training and held-out sets (the bring-your-own-model recipe).

    data:
      _target_: numdev.data.datasets.DatasetModule
      train: {_target_: mypackage.data.TrainSet, ...}      a torch Dataset: __len__, __getitem__(i) -> one item
      heldout: {_target_: mypackage.data.HeldOutSet, ...}  optional: the held-out loss's items (never trained on)
      batch_size: 16

Items are collated by PyTorch's default collate (tensors stacked, numbers as tensors, dicts of them).
Training batches come from numdev's endless, resumable sampler (numdev.data.sampler): item order
depends on seed.data only, so sibling runs see the same batches and a resumed run continues the same
stream. docs/workloads.md#custom gives the whole recipe.
"""

from __future__ import annotations

from torch.utils.data import Dataset, Subset

from numdev.data.datamodule import CaptionDataModule


class DatasetModule(CaptionDataModule):
    def __init__(self, train: Dataset, heldout: Dataset | None = None, batch_size: int = 16, num_workers: int = 0, seed: int = 0):
        super().__init__(batch_size, num_workers, seed)
        for key, value in (("train", train), ("heldout", heldout)):
            if value is not None and not (hasattr(value, "__len__") and hasattr(value, "__getitem__")):
                raise ValueError(f"data.{key} builds a {type(value).__name__}, not a map-style dataset (__len__ and __getitem__): "
                                 f"name one with data.{key}._target_")
        if len(train) == 0:
            raise ValueError(f"data.train ({type(train).__name__}) is empty: nothing to train on")
        self.train, self.heldout = train, heldout

    def build_dataset(self) -> Dataset:
        return self.train

    def heldout_dataset(self, n: int) -> Dataset:
        """The first n held-out items."""
        if self.heldout is None:
            raise ValueError("callbacks.heldout: data.heldout is not set: give a held-out dataset, or callbacks.heldout=null")
        if n > len(self.heldout):
            raise ValueError(f"callbacks.heldout.num_images={n}: data.heldout has {len(self.heldout)} items: ask for at most that many")
        return Subset(self.heldout, range(n))

    def preview_captions(self, n: int) -> list[str]:
        raise ValueError("callbacks.samples: a user's model has no samples to draw: set callbacks.samples=null")
