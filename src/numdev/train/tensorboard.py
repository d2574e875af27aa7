"""numdev's TensorBoard logger: runs named by what they change, the cards that matter first, an HParams view.

Lightning's TensorBoardLogger, with three differences:

  - where the event files go, and so what TensorBoard calls the run: a directory named by the run's
    command-line overrides (Hydra's job.override_dirname, e.g. `attention=sdpa_flash,seed.init=1`)
    inside the run directory, so a sweep's runs read `0/attention=baseline,seed.init=0` rather than
    `0/tensorboard`; a run without overrides gets `run_name` (run_name="" puts the files in the run
    directory itself, as the study does: its runs are named r<replicate>/<role> by their directories);
  - Lightning's automatic `epoch` scalar is not written: TensorBoard sorts its cards by tag group,
    and numdev's groups are chosen so that `distance/` (weight distances to the sibling) and `loss/`
    come first; an `epoch` card would sit between them and says nothing for step-based training;
  - log_hyperparams also writes TensorBoard's HParams summary (the run's defining choices,
    numdev.train.trackers.choices, with the tags of `metric_tags` as its metrics: losses, caption
    agreement, the distance to the sibling, the shadow's per-call deviation), so the HParams tab lists
    every run of a sweep with what it changed beside how far it moved.
"""

from __future__ import annotations

import re
from pathlib import Path

from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

HPARAM_METRICS = ("loss/train", "loss/heldout", "samples/colour_accuracy", "samples/shape_accuracy", "samples/position_accuracy")
MAX_NAME = 120  # characters of a run's directory name (file systems allow 255)


def run_name(default: str = "run") -> str:
    """The run's command-line overrides as Hydra's override dirname (keys hydra/default.yaml excludes
    left out), or `default` when there are none or outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig

    name = HydraConfig.get().job.override_dirname if HydraConfig.initialized() else ""
    name = re.sub(r"[/\\\x00]", "_", name or "")[:MAX_NAME]
    return name or default


def metric_tags(cfg) -> tuple[str, ...]:
    """The scalar tags the HParams view shows beside the choices (their last values): HPARAM_METRICS, and
    the distance to the sibling (numdev.train.callbacks.sibling's tags) and the shadow's per-call deviation
    where the run has them."""
    from omegaconf import OmegaConf

    from numdev.train.callbacks.sibling import default_label

    tags = list(HPARAM_METRICS)
    reference = OmegaConf.select(cfg, "sibling.reference", default=None)
    if reference is not None:
        label = OmegaConf.select(cfg, "sibling.label", default=None) or default_label(Path(str(reference)))
        tags += [f"distance/{label}/rel_frobenius", f"distance/{label}/w1_over_std"]
    if OmegaConf.select(cfg, "callbacks.shadow", default=None) is not None:
        tags += ["shadow/all/out_rel_rms", "shadow/all/out_bias"]
    return tuple(tags)


class TensorBoardLogger(LightningTensorBoardLogger):
    def __init__(self, save_dir: str, run_name_default: str | None = "run", metric_tags: tuple[str, ...] = HPARAM_METRICS,
                 **kwargs):
        """run_name_default: the directory name when the run has no overrides; None or "": the event
        files go into save_dir itself."""
        self.metric_tags = tuple(metric_tags)  # what HParams shows beside the choices (set by the run: metric_tags(cfg))
        version = run_name(run_name_default) if run_name_default else ""
        kwargs.setdefault("name", "")
        kwargs["version"] = version
        super().__init__(save_dir, **kwargs)

    def log_metrics(self, metrics, step=None) -> None:
        super().log_metrics({k: v for k, v in metrics.items() if k != "epoch"}, step)

    @rank_zero_only  # as Lightning's own: other DDP ranks have no event file to write to
    def log_hyperparams(self, params, metrics=None) -> None:
        super().log_hyperparams(params, metrics)  # hparams.yaml (default_hp_metric=false: no summary of its own)
        if metrics is not None:
            return  # Lightning wrote the HParams summary with these metrics
        from torch.utils.tensorboard.summary import hparams

        flat = _flatten(params if isinstance(params, dict) else vars(params))
        # The metric values are read by TensorBoard from the run's scalars of these tags (the last value).
        experiment, start, end = hparams(flat, {tag: 0.0 for tag in self.metric_tags})
        writer = self.experiment.file_writer  # SummaryWriter's public attribute, opened at its construction
        if writer is None:
            raise RuntimeError(f"{self.log_dir}: the TensorBoard writer was closed before the hyperparameters were logged")
        for summary in (experiment, start, end):
            writer.add_summary(summary)


def _flatten(tree, prefix: str = "") -> dict:
    """{"model.hidden": 64, ...}: HParams takes numbers, strings and booleans; lists and None are shown as text."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat
