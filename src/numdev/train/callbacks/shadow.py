"""Per-call attention deviation during training: a shadow backend beside the training backend.

Every `every_n_steps` steps, each attention call of that step's forward is also computed by the
shadow backend (numdev.models.shadow), and with `backward` its gradients dQ, dK, dV too. Logged
per layer to TensorBoard (`shadow/<layer>/<out|dq|dk|dv>_max_abs`, `..._mean_abs`, and the signed
mean deviation `..._bias` and relative RMS deviation `..._rel_rms`) and for all layers
(`shadow/all/...`: the maximum over layers of max_abs and mean_abs; bias and rel_rms of every
layer's elements pooled, numdev.models.shadow.pooled), and kept in <run_dir>/shadow.csv. Gradients
are divided by the loss scale under fp16-mixed, so they are in the units of the true gradients
(rel_rms, a ratio, needs no scaling).

Select the shadow with the `shadow` config group's options, which are the attention configs:
`numdev-train attention=sdpa_flash attention@shadow=baseline`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning.pytorch as pl

from numdev.models.shadow import AttentionShadow, pooled
from numdev.runs import tables
from numdev.runs.atomic import write_text
from numdev.runs.layout import SHADOW_COLUMNS, SHADOW_CSV
from numdev.train.trackers import log_metrics


class ShadowDeviation(pl.Callback):
    def __init__(self, run_dir: str, backend=None, every_n_steps: int = 10, backward: bool = True):
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps <= 0:
            raise ValueError(f"callbacks.shadow.every_n_steps={every_n_steps!r} must be a positive integer")
        self.run_dir = Path(run_dir)
        self.backend, self.every_n_steps, self.backward = backend, every_n_steps, backward
        self.shadow: AttentionShadow | None = None
        self.rows: list[dict] = []

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.backend is not None and self.shadow is None:
            _warn_if_same_backend(self.backend, pl_module.model)
            self.shadow = AttentionShadow(self.backend, backward=self.backward).attach(pl_module.model)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self.shadow is not None:
            self.shadow.detach()
            self.shadow = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.shadow is not None:
            self.shadow.recording = trainer.global_step % self.every_n_steps == 0

    def on_after_backward(self, trainer, pl_module) -> None:
        if self.shadow is None or not self.shadow.recording:
            return
        self.shadow.recording = False  # nothing else this step (sampling, ...) is shadowed
        self.shadow.backward_deviation()
        scale = _loss_scale(trainer)
        step = trainer.global_step
        rows = []
        for row in self.shadow.collect():
            if row["quantity"] != "out":
                row = {**row, **{k: row[k] / scale for k in SCALED}}
            rows.append({"step": step, **row})
        if not rows or not trainer.is_global_zero:
            return
        self.rows.extend(rows)
        write_text(self.run_dir / SHADOW_CSV, tables.to_csv(self.rows, list(SHADOW_COLUMNS)))
        log_metrics(trainer, tensorboard_metrics(rows), step=step)


SCALED = ("max_abs", "mean_abs", "ref_max_abs", "bias", "diff_rms", "shadow_rms")  # in the gradient's units: / loss scale


def tensorboard_metrics(rows: list[dict]) -> dict[str, float]:
    """`shadow/<layer>/<quantity>_<stat>` per row, and `shadow/all/...`: max over layers of max_abs and
    mean_abs, bias and rel_rms of all rows of a quantity pooled."""
    metrics = {}
    for row in rows:
        for stat in ("max_abs", "mean_abs", "bias", "rel_rms"):
            metrics[f"shadow/{row['layer']}/{row['quantity']}_{stat}"] = row[stat]
        for stat in ("max_abs", "mean_abs"):
            key = f"shadow/all/{row['quantity']}_{stat}"
            metrics[key] = max(metrics.get(key, 0.0), row[stat])
    for quantity in dict.fromkeys(row["quantity"] for row in rows):
        for stat, value in pooled([r for r in rows if r["quantity"] == quantity]).items():
            metrics[f"shadow/all/{quantity}_{stat}"] = value
    return metrics


def _loss_scale(trainer) -> float:
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0


def _warn_if_same_backend(shadow, model) -> None:
    """A shadow identical to the training backend measures nothing: every deviation is 0. Say so."""
    from numdev.models.attention import AttentionCall

    trained = next((m.backend for m in model.modules() if isinstance(m, AttentionCall)), None)
    describe = getattr(trained, "describe", None)
    if describe is not None and type(trained) is type(shadow) and describe() == shadow.describe():
        warnings.warn(
            f"attention@shadow is the training backend itself ({shadow.describe()}): every shadow deviation will be 0; "
            "shadow another backend, e.g. attention=sdpa_flash attention@shadow=baseline",
            stacklevel=2,
        )

