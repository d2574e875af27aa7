"""Qiu & Yao's failure looked for (arXiv:2510.04212): tied row maxima, the signed P·V bias and key
similarity, step by step over a run's snapshots.

Their mechanism: as training makes keys similar and low-rank, several scores of a row tie its
maximum m, so several unnormalised probabilities P = exp(S - m) are exactly 1; the bf16 rounding of
the P·V accumulation is then biased (one sign), the bias reaches the weights through the backward
pass and builds up until the loss explodes. Their fix (numdev's optimization=flash_tie_fix) shifts
the maximum where scores tie it. What is measured here, per attention layer and pooled over layers,
on the first `windows` held-out inputs at every snapshot step (TIE_RULE, BIAS_RULE):

- `row_tie_rate`: the fraction of query rows whose maximum score is attained by two or more keys,
  scores as the run's flash emulator computes them (inputs prepared, q k^T per key block, scaled and
  rounded to the score format, causal keys masked): rows with several P exactly 1;
- `block_tie_rate`: the fraction of (query row, key block) pairs, over blocks with a visible key,
  where two or more scores lie within TIE_TOLERANCE of the block's maximum: where the fix acts;
- `pv_bias`: the signed mean of O - O', O' the same emulator on the same q, k, v with the P·V
  accumulator in FP32 (the accumulator's rounding alone), relative to rms(O'); `pv_bias_share`:
  |mean| / rms(O - O') (1 when every element errs the same way, ~0 for unbiased rounding), and
  `pv_column_share`: the RMS over (head, feature) columns of the per-column signed mean over the
  batch's rows, / rms(O - O') (a bias that leans one way per feature, as theirs does), with
  `pv_column_null` = 1 / sqrt(rows per column), its size for independent zero-mean errors;
- `out_bias`: the signed mean of O - O64 (numdev.attention.golden_attention, FP64) relative to
  rms(O64): the whole call's bias;
- `key_cosine`: the mean cosine similarity of two distinct keys of a sequence (per batch and head);
- `score_max`: the largest scaled score of any row (as rounded to the score format): the fix
  exponentiates against 2m, so a tied maximum m above ~44 makes a row sum below 2^-64 and one above
  ~88 a row sum below float32's smallest normal number, whose reciprocal overflows.

Beside them the held-out loss of the snapshot (the run's own evaluation, numdev.analysis.run_model)
and, from the run's records, its training loss, loss spikes and non-finite events.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from pathlib import Path

import torch

from numdev.analysis.run_model import rebuilt
from numdev.attention import FlashEmulated, golden_attention
from numdev.attention.checks import causal_mask
from numdev.attention.flash_emulated import TIE_TOLERANCE, block_scores
from numdev.models.attention import AttentionCall, name_attention_layers
from numdev.numerics.formats import parse_format
from numdev.numerics.stages import prepared_inputs
from numdev.runs.layout import RunDir
from numdev.weights.store import list_snapshots, load_snapshot

log = logging.getLogger(__name__)

TIE_RULE = (
    "tie rates from the scores as the run's flash emulator computes them (inputs prepared, q k^T per key block, "
    "scaled and rounded to the score format, causal keys masked): row_tie_rate = fraction of query rows whose maximum "
    f"is attained by >= 2 keys exactly; block_tie_rate = fraction of (row, key block) pairs with >= 2 scores within "
    f"{TIE_TOLERANCE} of the block maximum (Qiu & Yao's criterion, where their fix acts)"
)
BIAS_RULE = (
    "pv_bias = mean(O - O') / rms(O'), O' = the same emulator with the P·V accumulator in FP32; pv_bias_share = "
    "|mean(O - O')| / rms(O - O'); pv_column_share = rms over (head, feature) columns of the column's mean of O - O' "
    "over the batch's rows, / rms(O - O'), beside pv_column_null = 1/sqrt(rows per column); out_bias = "
    "mean(O - O64) / rms(O64) against FP64 attention; key_cosine = mean cosine similarity of distinct keys of a "
    "sequence; score_max = the largest scaled score of any row"
)
FP32 = parse_format("fp32")
_SUMS = ("rows", "row_ties", "pairs", "block_ties", "pv_sum", "pv_sq", "pv_col_sq", "pv_cols", "pv_count",
         "ref_sq", "out_sum", "gold_sq", "cos_sum", "cos_count")


def _tie_counts(backend: FlashEmulated, q, k, causal: bool) -> dict[str, torch.Tensor]:
    f = backend.formats
    n_q, n_k, d = q.shape[2], k.shape[2], q.shape[3]
    scale = torch.tensor(1.0 / math.sqrt(d), dtype=q.dtype)  # as AttentionBackend.__call__ and the emulator take it
    block_c = backend.tiles(n_q, n_k, d).block_c
    row_max = torch.full((*q.shape[:3], 1), -math.inf)
    row_count = torch.zeros(row_max.shape)
    pairs = block_ties = torch.zeros(())
    for start in range(0, n_k, block_c):
        stop = min(start + block_c, n_k)
        masked = causal_mask(n_q, torch.arange(start, stop), q.device) if causal else None
        scores = block_scores(q @ k[:, :, start:stop].transpose(-1, -2), scale, masked, f)
        block_max = scores.amax(dim=-1, keepdim=True)
        visible = torch.isfinite(block_max)
        pairs = pairs + visible.sum()
        near = (scores >= block_max - TIE_TOLERANCE).sum(dim=-1, keepdim=True) > 1
        block_ties = block_ties + (near & visible).sum()
        exact = (scores == block_max).sum(dim=-1, keepdim=True).float()
        new_max = torch.maximum(row_max, block_max)
        row_count = row_count * (row_max == new_max) + exact * (visible & (block_max == new_max))
        row_max = new_max
    rows = torch.isfinite(row_max)
    return {"rows": rows.sum(), "row_ties": ((row_count > 1) & rows).sum(), "pairs": pairs, "block_ties": block_ties,
            "score_max": row_max[rows].max() if rows.any() else torch.tensor(-math.inf)}


def call_statistics(backend: FlashEmulated, q, k, v, out, causal: bool) -> dict[str, torch.Tensor]:
    """One attention call's sums (pooled over calls and layers by adding them; `summarise` divides)."""
    with torch.no_grad():
        f = backend.formats
        qp, kp, _ = prepared_inputs(q, k, v, f)
        sums = _tie_counts(backend, qp, kp, causal)
        wide = copy.copy(backend)
        wide.formats = dataclasses.replace(f, accum=FP32)
        ref = wide(q, k, v, causal=causal).double()
        diff = out.double() - ref
        columns = diff.mean(dim=(0, 2))  # (heads, features): the mean over the batch's rows
        gold = golden_attention(q, k, v, causal=causal)
        keys = torch.nn.functional.normalize(kp.double(), dim=-1)
        n = keys.shape[2]
        gram = keys @ keys.transpose(-1, -2)
        sums.update({
            "pv_sum": diff.sum(), "pv_sq": diff.square().sum(), "pv_col_sq": columns.square().sum(),
            "pv_cols": torch.tensor(float(columns.numel())), "pv_count": torch.tensor(float(diff.numel())),
            "ref_sq": ref.square().sum(), "out_sum": (out.double() - gold).sum(), "gold_sq": gold.square().sum(),
            "cos_sum": (gram.sum(dim=(-1, -2)) - gram.diagonal(dim1=-2, dim2=-1).sum(-1)).sum(),
            "cos_count": torch.tensor(float(keys.shape[0] * keys.shape[1] * n * (n - 1))),
        })
        sums["rows_per_column"] = torch.tensor(float(q.shape[0] * q.shape[2]))
    return sums


def summarise(sums: dict[str, float]) -> dict[str, float]:
    """The rates and ratios of BIAS_RULE and TIE_RULE from pooled sums."""
    pv_rms = math.sqrt(sums["pv_sq"] / sums["pv_count"])
    pv_mean = sums["pv_sum"] / sums["pv_count"]
    return {
        "row_tie_rate": sums["row_ties"] / sums["rows"],
        "block_tie_rate": sums["block_ties"] / sums["pairs"],
        "pv_bias": pv_mean / math.sqrt(sums["ref_sq"] / sums["pv_count"]),
        "pv_rel_rms": pv_rms / math.sqrt(sums["ref_sq"] / sums["pv_count"]),
        "pv_bias_share": abs(pv_mean) / pv_rms if pv_rms > 0 else 0.0,
        "pv_column_share": math.sqrt(sums["pv_col_sq"] / sums["pv_cols"]) / pv_rms if pv_rms > 0 else 0.0,
        "pv_column_null": 1.0 / math.sqrt(sums["rows_per_column"]),
        "out_bias": sums["out_sum"] / sums["pv_count"] / math.sqrt(sums["gold_sq"] / sums["pv_count"]),
        "key_cosine": sums["cos_sum"] / sums["cos_count"],
        "score_max": sums["score_max"],
    }


class TieProbe:
    """An attention probe (AttentionCall.probe) adding every call's `call_statistics` to its layer's."""

    def __init__(self, backend: FlashEmulated):
        self.backend = backend
        self.layers: dict[str, dict[str, torch.Tensor]] = {}

    def __call__(self, module: AttentionCall, q, k, v, out) -> None:
        stats = call_statistics(self.backend, q, k, v, out, module.causal)
        kept = self.layers.setdefault(module.layer_name, {})
        for name, value in stats.items():
            if name == "rows_per_column":
                kept[name] = value
            elif name == "score_max":
                kept[name] = torch.maximum(kept[name], value) if name in kept else value
            else:
                kept[name] = kept.get(name, 0) + value

    def results(self) -> dict:
        layers = {name: {key: float(value) for key, value in sums.items()} for name, sums in self.layers.items()}
        pooled = {key: sum(s[key] for s in layers.values()) for key in _SUMS}
        pooled["rows_per_column"] = next(iter(layers.values()))["rows_per_column"]
        pooled["score_max"] = max(s["score_max"] for s in layers.values())
        return {"all": summarise(pooled), "layers": {name: summarise(s) for name, s in layers.items()}}


def snapshot_ties(run_dir: str | Path, windows: int = 16, heldout: int = 64, steps: list[int] | None = None,
                  seed: int = 0) -> list[dict]:
    """Per snapshot step: the held-out loss on `heldout` windows and TIE_RULE/BIAS_RULE's measures on
    the first `windows` of them, with the run's own model, precision and flash emulator."""
    run = RunDir(run_dir)
    available = list_snapshots(run.path)
    chosen = available if steps is None else steps
    missing = sorted(set(chosen) - set(available))
    if missing:
        raise ValueError(f"{run.index}: no snapshot at step(s) {missing}: the run has {available[0]}..{available[-1]}")
    rows = []
    with rebuilt(run.path) as run_model:
        if not isinstance(run_model.backend, FlashEmulated):
            raise ValueError(f"{run.config}: attention is {getattr(run_model.backend, 'name', run_model.backend)}: "
                             "the tie search reads numdev's flash emulator's scores (attention=flash_emulated)")
        name_attention_layers(run_model.model)
        calls = [m for m in run_model.model.modules() if isinstance(m, AttentionCall)]
        try:
            full, probed = run_model.heldout_dataset(heldout), run_model.heldout_dataset(windows)
        except ValueError as error:  # the data module names its own config key; say which argument asked too much
            raise ValueError(f"windows={windows}, heldout={heldout}: more held-out windows than {run.config}'s data has "
                             f"({error})") from None
        for step in chosen:
            run_model.load(load_snapshot(run.path, step))
            loss = run_model.heldout(full, seed=seed, batch_size=heldout).loss
            probe = TieProbe(run_model.backend)
            for module in calls:
                module.probe = probe
            try:
                run_model.heldout(probed, seed=seed, batch_size=windows)
            finally:
                for module in calls:
                    module.probe = None
            rows.append({"step": step, "heldout_loss": loss, **probe.results()})
            log.info("step %d: held-out loss %.4f, row ties %.3g, P.V bias %.3g", step, loss,
                     rows[-1]["all"]["row_tie_rate"], rows[-1]["all"]["pv_bias"])
    return rows
