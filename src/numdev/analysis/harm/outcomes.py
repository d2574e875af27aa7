"""What each run of a harm study ended with: its downstream outcomes and what it records of itself.

Per run (role, replicate), read through the run directory's checked readers (numdev.runs.layout.RunDir):
- `heldout_loss` (heldout.json), `colour_accuracy` and `position_accuracy` (eval.json): the
  downstream outcomes (OUTCOMES, with the sense in which they are better);
- `skipped_updates`: steps whose update the instability monitor skipped (non-finite values under
  policy skip, instability.json): a positive control that went non-finite says so;
- `attention_tiling` and `precision_gemm` (run.json): how its attention tiles, how its bf16
  products are computed;
- `step_seconds`: its median step time (run.json);
- the shadow's per-call deviation where the run has one (shadow.csv: relative RMS and signed bias
  of the attention output against the reference's attention on the same inputs).
"""

from __future__ import annotations

import math

import numpy as np

from numdev.runs.layout import RunDir

# outcome -> (label, +1 when larger is better, -1 when smaller is better)
OUTCOMES = {
    "heldout_loss": ("held-out loss", -1),
    "colour_accuracy": ("colour agreement", +1),
    "position_accuracy": ("position agreement", +1),
}


def run_outcomes(run_dir) -> dict:
    """The outcomes and self-records of one finished run (None where the run has none)."""
    run = RunDir(run_dir)
    record = run.read_record()
    out = {key: run.read_outcome(key) for key in OUTCOMES}
    out["unigram_entropy"] = run.read_outcome("unigram_entropy")  # a language model's context-free loss (LEARNED_RULE)
    events = run.read_instability()["events"] if run.instability.is_file() else []
    out["skipped_updates"] = sum(1 for e in events if e.get("action") == "skipped")
    out["attention_tiling"] = (record.get("attention_tiling") or {}).get("layers")  # each layer's tiling (numdev.train.callbacks.tiling)
    out["precision_gemm"] = (record.get("precision_gemm") or {}).get("route")
    seconds = record.get("step_seconds") or {}
    out["step_seconds"] = seconds.get("median") if isinstance(seconds, dict) else None
    out["per_call"] = per_call(run) if run.shadow_csv.is_file() else None
    return out


def per_call(run: RunDir) -> dict | None:
    """The forward output's per-call deviation from the shadow (numdev.train.callbacks.shadow: one row per
    attention layer and step), averaged over every layer and every step it was measured at."""
    rows = [r for r in run.read_shadow() if r.get("quantity") == "out"]
    if not rows:
        return None
    out = {}
    for key in ("rel_rms", "bias", "mean_abs", "max_abs"):  # numdev.train.callbacks.shadow's columns
        values = [float(r[key]) for r in rows if r.get(key) is not None and math.isfinite(float(r[key]))]
        if values:
            out[key] = float(np.mean(values))
    return out or None


def relative_effect(role: float | None, reference: float | None, sense: int) -> float | None:
    """How much worse the role is than the reference, as a fraction of the reference (positive: worse)."""
    if role is None or reference is None or not math.isfinite(role) or not math.isfinite(reference) or reference == 0:
        return None
    return -sense * (role - reference) / abs(reference)
