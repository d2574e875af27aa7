"""The training progress bar: Lightning's, without its `v_num` (the run's name as its TensorBoard version,
which numdev sets to the run's overrides: `v_num=ps=2` said nothing), with the loss and the step time."""

from __future__ import annotations

from lightning.pytorch.callbacks import TQDMProgressBar


class ProgressBar(TQDMProgressBar):
    def get_metrics(self, trainer, pl_module) -> dict:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items
