"""Function-level agreement between two sibling runs: do they compute the same function?

Weight distances say how far apart two runs' parameters are; these say how differently the two
models behave, on inputs both runs saw identically (Summers & Dinneen 2021 measure the same
nondeterminism by prediction churn; Frankle et al. 2020 and Altıntaş et al. 2025 by linear mode
connectivity):

- `prediction_disagreement(run_a, run_b)`: the two runs' predictions on the held-out set (the same
  images, timesteps and noise as the held-out loss: heldout_predictions.safetensors, written by
  numdev.train.callbacks.heldout) compared: relative RMS difference rms(a - b) / rms(b) over every
  value, and the Pearson correlation of the two predictions per image (DISAGREEMENT_RULE);
- `churn(run_a, run_b)`: the fraction of the final samples whose classified colour, shape or position
  differs between the runs (eval.json; sample i of both runs starts from the same noise, since the
  sample seed and captions are the same), and whose any class differs (CHURN_RULE);
- `loss_barrier(run_a, run_b)`: the held-out loss along the straight line between the two runs'
  final weights, W(alpha) = (1 - alpha) W_a + alpha W_b, evaluated by the held-out callback's own
  code (numdev.train.callbacks.heldout.heldout_evaluation), and the barrier
  max_alpha [L(alpha) - ((1 - alpha) L(0) + alpha L(1))] (BARRIER_RULE).

Each refuses, in one line naming the files, two runs whose inputs differ (another held-out set,
other captions or sample seed, another model). Identical runs give exactly 0 disagreement, 0 churn
and a barrier of exactly 0 (the interpolation and the chord are computed so that equal ends give
equal values bit for bit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from numdev.analysis.run_model import rebuilt, saved_config
from numdev.runs.layout import RunDir
from numdev.train.callbacks.heldout import (
    HELDOUT_BATCH_SIZE,
    HELDOUT_IMAGES,
    HELDOUT_SEED,
    heldout_targets,
)
from numdev.weights.store import list_snapshots, load_snapshot

DISAGREEMENT_RULE = (
    "prediction disagreement on the held-out set (the same images, timesteps and noise for both runs): relative RMS "
    "difference = rms(a - b) / rms(b) over every predicted value (b: the second run, the reference); per image the "
    "Pearson correlation of the two runs' predictions (its mean, median and minimum over images); identical "
    "predictions give 0 and 1"
)
GREEDY_RULE = (
    "greedy next-token disagreement on the held-out windows (a language model; the same windows for both runs): the "
    "fraction of positions whose greedy (argmax) next token differs between the runs, and the fraction of windows with "
    "any such position; identical predictions give 0"
)
CONTINUATION_CHURN_RULE = (
    "churn of a language model's samples: over the fixed prompts both runs continued greedily, the fraction whose "
    "continuation differs in any byte"
)
CHURN_RULE = (
    "churn (Summers & Dinneen 2021): over the final samples both runs generated from the same captions and sample "
    "seed (sample i of both starts from the same noise), the fraction whose classified colour differs, shape "
    "differs, position differs, and whose any of the three differs ('no object' is a class); the runs' accuracies "
    "beside"
)
BARRIER_RULE = (
    "loss barrier (linear mode connectivity; Frankle et al. 2020, Altıntaş et al. 2025): the held-out diffusion loss "
    "L(alpha) at W(alpha) = (1 - alpha) W_a + alpha W_b (torch.lerp in float32: equal ends give W_a bit for bit) from the "
    "two runs' final weight snapshots, evaluated as the held-out callback evaluates (its images, timesteps, noise, "
    "batches; run_b's model, precision and attention, or eager attention); barrier = max over the alphas of "
    "L(alpha) - (L(0) + alpha (L(1) - L(0))); 0 for identical runs, > 0 when the path rises above the chord, < 0 "
    "when it lies below it at every alpha evaluated"
)
ATTENTIONS = ("run_b", "eager")


def _held_out_set(record: dict) -> dict:
    """What identifies the held-out set a record was made on (and the step it was made at)."""
    return {"images": record["images"], "seed": record["seed"], "step": record["step"],
            "inputs_sha256": record.get("inputs_sha256")}


def _refuse_other_sets(a: RunDir, b: RunDir, first: dict, second: dict, what: str, keys=("images", "seed", "step")) -> None:
    keys = [*keys, *(["inputs_sha256"] if first.get("inputs_sha256") and second.get("inputs_sha256") else [])]
    differ = [k for k in keys if first.get(k) != second.get(k)]
    if differ:
        shown = ", ".join(f"{k} {first.get(k)} vs {second.get(k)}" if k != "inputs_sha256" else "the inputs' sha256" for k in differ)
        raise ValueError(f"{a.heldout} and {b.heldout}: {what} made on different held-out sets ({shown}): compare runs "
                         "evaluated on the same images, timesteps and noise")


def _correlation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation of the rows of a and b (float64); nan where a row is constant."""
    ac = a - a.mean(axis=1, keepdims=True)
    bc = b - b.mean(axis=1, keepdims=True)
    # sqrt(S * S) == S in IEEE arithmetic: identical rows give exactly 1
    with np.errstate(divide="ignore", invalid="ignore"):
        return (ac * bc).sum(axis=1) / np.sqrt((ac * ac).sum(axis=1) * (bc * bc).sum(axis=1))


def prediction_disagreement(run_a: str | Path, run_b: str | Path) -> dict:
    """How differently two runs predict on the held-out set (DISAGREEMENT_RULE).

    Returns relative_rms (rms(a - b) / rms(b)), rms_difference, rms_b, correlation {mean, median, min,
    max, constant_images} over images, per_image_correlation, and the held-out set (images, seed,
    step). Refuses runs evaluated on different held-out sets, and damaged prediction files, in one
    line naming the file(s)."""
    a, b = RunDir(run_a), RunDir(run_b)
    pa, ra = a.read_heldout_predictions()
    pb, rb = b.read_heldout_predictions()
    _refuse_other_sets(a, b, ra, rb, "the held-out predictions were")
    if pa.shape != pb.shape:
        raise ValueError(f"{a.heldout_predictions} and {b.heldout_predictions}: predictions of shapes {list(pa.shape)} and "
                         f"{list(pb.shape)}: not the same model output")
    if "tokens" in rb:  # a language model: its predictions are the greedy next tokens
        differ = pa != pb
        return {"disagreement": float(differ.mean()), "measure": "greedy_tokens", "positions": int(differ.size),
                "windows_differing": float(differ.any(axis=1).mean()),
                **{k: v for k, v in _held_out_set(rb).items() if k != "inputs_sha256"},
                "runs": [str(a.path), str(b.path)], "rule": GREEDY_RULE}
    x = pa.astype(np.float64).reshape(len(pa), -1)
    y = pb.astype(np.float64).reshape(len(pb), -1)
    rms_difference = float(np.sqrt(np.mean((x - y) ** 2)))
    rms_b = float(np.sqrt(np.mean(y**2)))
    relative = rms_difference / rms_b if rms_b > 0 else (0.0 if rms_difference == 0 else math.inf)
    per_image = _correlation(x, y)
    defined = per_image[np.isfinite(per_image)]
    correlation = {
        "mean": float(defined.mean()) if defined.size else None,
        "median": float(np.median(defined)) if defined.size else None,
        "min": float(defined.min()) if defined.size else None,
        "max": float(defined.max()) if defined.size else None,
        "constant_images": int(per_image.size - defined.size),  # a constant prediction has no correlation
    }
    return {
        "disagreement": relative, "measure": "relative_rms",
        "relative_rms": relative, "rms_difference": rms_difference, "rms_b": rms_b, "correlation": correlation,
        "per_image_correlation": [float(c) if math.isfinite(c) else None for c in per_image],
        **{k: v for k, v in _held_out_set(rb).items() if k != "inputs_sha256"},
        "runs": [str(a.path), str(b.path)], "rule": DISAGREEMENT_RULE,
    }


EVALUATION_ERROR_RULE = (
    "the held-out set's own sampling error of a paired effect: per image i the two runs' losses on the same input, "
    "d_i = L_a,i - L_b,i; the standard error of mean(d) over the images, relative to L_b; the per-image losses are "
    "recomputed from the saved predictions and the set's targets, and used only when their means reproduce both "
    "runs' recorded held-out losses (relative 1e-4)"
)


def evaluation_error(run_a: str | Path, run_b: str | Path) -> dict:
    """How much of a paired held-out effect (L_a - L_b) / L_b the evaluation set alone could make (EVALUATION_ERROR_RULE):
    an effect several of these wide is the weights', not the 256 images' sampling. One line naming the file on damage."""
    a, b = RunDir(run_a), RunDir(run_b)
    ra, rb = a.read_heldout(), b.read_heldout()
    if "item_losses" in ra and "item_losses" in rb:  # each item's loss recorded (a language model's windows, a user's model)
        _refuse_other_sets(a, b, ra, rb, "the held-out losses were")
        return _evaluation_error(np.asarray(ra["item_losses"], float), np.asarray(rb["item_losses"], float), (ra, rb), (a, b))
    if "tokens" in ra or "tokens" in rb:
        raise ValueError(f"{a.heldout} or {b.heldout} records no per-window losses (item_losses): made before numdev recorded "
                         "them; train the runs again for the held-out set's own error")
    pa, ra = a.read_heldout_predictions()
    pb, rb = b.read_heldout_predictions()
    _refuse_other_sets(a, b, ra, rb, "the held-out predictions were")
    cfg = saved_config(b)
    make = getattr(instantiate(cfg.data), "heldout_dataset", None)
    if make is None:
        raise ValueError(f"{b.config}: its data has no held-out split")
    node = cfg.get("callbacks", {}).get("heldout") or {}
    targets = heldout_targets(make(rb["images"]), instantiate(cfg.diffusion.schedule), cfg.diffusion.prediction,
                              seed=rb["seed"], batch_size=int(node.get("batch_size", HELDOUT_BATCH_SIZE))).double().numpy()
    if targets.shape != pa.shape or targets.shape != pb.shape:
        raise ValueError(f"{b.heldout_predictions}: predictions of shape {list(pb.shape)}, targets {list(targets.shape)}")
    la = ((pa.astype(np.float64) - targets) ** 2).reshape(len(pa), -1).mean(axis=1)
    lb = ((pb.astype(np.float64) - targets) ** 2).reshape(len(pb), -1).mean(axis=1)
    return _evaluation_error(la, lb, (ra, rb), (a, b))


def _evaluation_error(la: np.ndarray, lb: np.ndarray, records: tuple, runs: tuple) -> dict:
    """EVALUATION_ERROR_RULE from the two runs' per-item losses, each checked against its recorded held-out loss."""
    (ra, rb), (a, b) = records, runs
    if la.shape != lb.shape or la.size < 2:
        raise ValueError(f"{a.heldout} and {b.heldout}: {la.size} and {lb.size} per-item losses: not one held-out set of 2 or more")
    for losses, record, run in ((la, ra, a), (lb, rb, b)):
        if not math.isclose(losses.mean(), record["heldout_loss"], rel_tol=1e-4):
            raise ValueError(f"{run.heldout}: the saved predictions give a held-out loss of {losses.mean():.6g}, the record "
                             f"{record['heldout_loss']:.6g}: not reproduced, so not used")
    d = la - lb
    return {"effect": float(d.mean() / lb.mean()), "se": float(d.std(ddof=1) / math.sqrt(d.size) / lb.mean()),
            "images": int(d.size), "runs": [str(a.path), str(b.path)], "rule": EVALUATION_ERROR_RULE}


CLASSES = ("colour", "shape", "position")


def churn(run_a: str | Path, run_b: str | Path) -> dict:
    """The fraction of the final samples whose classes differ between two runs (CHURN_RULE).

    Returns {"samples": n scored, "colour", "shape", "position", "any": fractions, "accuracy": {"a": ...,
    "b": ...}, "step", "sample_seed"}. Refuses (one line naming both eval.json) when the captions,
    the sample seed, the sampler or the step differ: then sample i of the two runs did not start
    from the same noise and the same caption."""
    a, b = RunDir(run_a), RunDir(run_b)
    if a.continuations.is_file() or b.continuations.is_file():
        return _continuation_churn(a, b)
    ea, eb = a.read_samples(), b.read_samples()
    captions = [[s["caption"] if s else None for s in e["samples"]] for e in (ea, eb)]
    differ = [what for what, same in (("captions", captions[0] == captions[1]), ("sample seeds", ea["sample_seed"] == eb["sample_seed"]),
                                      ("samplers", ea.get("sampler") == eb.get("sampler")), ("steps", ea["step"] == eb["step"]))
              if not same]
    if differ:
        raise ValueError(f"{a.eval} and {b.eval}: the samples were generated with different {' and '.join(differ)}: churn "
                         "compares samples that start from the same caption and noise")
    pairs = [(x, y) for x, y in zip(ea["samples"], eb["samples"]) if x is not None and y is not None]
    if not pairs:
        raise ValueError(f"{a.eval} and {b.eval}: no scored sample (no caption names one shapes object): nothing to compare")
    changed = {key: sum(x.get(key) != y.get(key) for x, y in pairs) / len(pairs) for key in CLASSES}
    changed["any"] = sum(any(x.get(k) != y.get(k) for k in CLASSES) for x, y in pairs) / len(pairs)
    accuracy = {name: {key: e.get(f"{key}_accuracy") for key in CLASSES} for name, e in (("a", ea), ("b", eb))}
    return {"samples": len(pairs), **changed, "accuracy": accuracy, "step": ea["step"], "sample_seed": ea["sample_seed"],
            "runs": [str(a.path), str(b.path)], "rule": CHURN_RULE}


def _continuation_churn(a: RunDir, b: RunDir) -> dict:
    """A language model's churn (CONTINUATION_CHURN_RULE): the prompts whose greedy continuations differ."""
    ea, eb = a.read_continuations(), b.read_continuations()
    prompts = [[s["prompt"] for s in e["samples"]] for e in (ea, eb)]
    if prompts[0] != prompts[1] or ea["length"] != eb["length"] or ea["step"] != eb["step"]:
        raise ValueError(f"{a.continuations} and {b.continuations}: other prompts, lengths or steps: churn compares "
                         "continuations of the same prompts")
    if not prompts[0]:
        raise ValueError(f"{a.continuations}: no prompt: nothing to compare")
    differ = [x["continuation"] != y["continuation"] for x, y in zip(ea["samples"], eb["samples"])]
    return {"samples": len(differ), "any": sum(differ) / len(differ), "step": ea["step"],
            "runs": [str(a.path), str(b.path)], "rule": CONTINUATION_CHURN_RULE}


# -- linear mode connectivity -------------------------------------------------------------------------
def _final_step(run: RunDir, record: dict | None) -> int:
    steps = list_snapshots(run.path)
    if not steps:
        raise ValueError(f"{run.index}: no snapshot: the run has no final weights to interpolate")
    if record is not None and record["step"] != steps[-1]:
        raise ValueError(f"{run.heldout}: evaluated at step {record['step']}, but the last snapshot is step {steps[-1]}: "
                         "the final weights are not the ones the held-out loss was computed with")
    return steps[-1]


def _check_alphas(alphas: Sequence[float]) -> list[float]:
    values = []
    for alpha in alphas:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise ValueError(f"alphas: {alpha!r} must lie strictly between 0 and 1 (the runs themselves are alpha 0 and 1)")
        values.append(float(alpha))
    if not values or len(set(values)) != len(values):
        raise ValueError(f"alphas={list(alphas)!r}: give one or more distinct values in (0, 1)")
    return sorted(values)


def loss_barrier(run_a: str | Path, run_b: str | Path, alphas: Sequence[float] = (0.25, 0.5, 0.75),
                 attention: str = "run_b", device: str = "cpu") -> dict:
    """The held-out loss along the line between two runs' final weights, and its barrier (BARRIER_RULE).

    The model, precision, optimization, data and held-out settings are run_b's config's (the two
    runs must share the model and the held-out set); `attention`: "run_b" (its backend, built anew:
    a backend with its own random stream, like output_noise, starts that stream again) or "eager"
    (numdev.attention.Eager under run_b's precision). L(0) and L(1) are the runs' own final weights,
    evaluated exactly as the held-out callback evaluated them: with run_b's settings on both runs,
    each equals its heldout.json (`endpoints_match_heldout_json`: {a, b}; a run evaluated with another
    run's attention or precision need not). Returns alphas (0, ..., 1),
    losses, chord, excess (loss - chord), barrier (the largest excess over the interior alphas),
    barrier_alpha, loss_a, loss_b, heldout_json {a, b}, steps {a, b}, the held-out set and the rule.
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"attention={attention!r}: use {' or '.join(ATTENTIONS)}")
    interior = _check_alphas(alphas)
    a, b = RunDir(run_a), RunDir(run_b)
    cfg_a, cfg = saved_config(a), saved_config(b)
    if OmegaConf.to_container(cfg_a.model) != OmegaConf.to_container(cfg.model):
        raise ValueError(f"{a.config} and {b.config}: different models: weights interpolate only between runs of one model")
    records = {}
    for name, run in (("a", a), ("b", b)):
        records[name] = run.read_heldout() if run.heldout.is_file() else None
    if records["a"] is not None and records["b"] is not None:
        _refuse_other_sets(a, b, records["a"], records["b"], "the held-out losses were", keys=("images", "seed"))
    node = cfg.callbacks.get("heldout") if cfg.get("callbacks") is not None else None
    reference = records["b"] or records["a"]
    num_images = reference["images"] if reference else int(node.get("num_images", HELDOUT_IMAGES)) if node is not None else HELDOUT_IMAGES
    seed = reference["seed"] if reference else int(node.get("seed", HELDOUT_SEED)) if node is not None else HELDOUT_SEED
    batch_size = int(node.get("batch_size", HELDOUT_BATCH_SIZE)) if node is not None else HELDOUT_BATCH_SIZE
    steps = {"a": _final_step(a, records["a"]), "b": _final_step(b, records["b"])}
    weights_a, weights_b = load_snapshot(a.path, steps["a"]), load_snapshot(b.path, steps["b"])

    with rebuilt(b.path, attention="run" if attention == "run_b" else "eager", device=device, config=cfg) as run_model:
        names = {n for n, _ in run_model.model.named_parameters()}
        for run, weights in ((a, weights_a), (b, weights_b)):  # both checked before anything is evaluated
            if set(weights) != names:
                raise ValueError(f"{run.index}: the snapshot's parameters are not the model's of {b.config}")
        dataset = run_model.heldout_dataset(num_images)

        def loss_at(state: dict[str, torch.Tensor]) -> tuple[float, str]:
            run_model.load(state)
            result = run_model.heldout(dataset, seed=seed, batch_size=batch_size)
            return result.loss, result.inputs_sha256

        loss_a, inputs = loss_at(weights_a)
        losses = [loss_a]
        for alpha in interior:  # torch.lerp: W_a + alpha (W_b - W_a) (from the far end past 0.5): equal ends give W_a bit for bit
            losses.append(loss_at({name: torch.lerp(weights_a[name], weights_b[name], alpha) for name in weights_a})[0])
        loss_b = loss_at(weights_b)[0]
        losses.append(loss_b)
        backend = run_model.backend
    for name, run in (("a", a), ("b", b)):
        recorded = (records[name] or {}).get("inputs_sha256")
        if recorded and recorded != inputs:
            raise ValueError(f"{run.heldout}: made on other held-out inputs than {b.config}'s settings give: compare runs "
                             "evaluated on the same images, timesteps and noise")
    points = [0.0, *interior, 1.0]
    chord = [loss_a, *(loss_a + alpha * (loss_b - loss_a) for alpha in interior), loss_b]  # equal ends: a flat chord
    excess = [loss - line for loss, line in zip(losses, chord)]
    worst = max(range(1, len(points) - 1), key=lambda i: excess[i])
    recorded = {name: (records[name] or {}).get("heldout_loss") for name in ("a", "b")}
    return {
        "alphas": points, "losses": losses, "chord": chord, "excess": excess,
        "barrier": excess[worst], "barrier_alpha": points[worst],
        "loss_a": loss_a, "loss_b": loss_b, "heldout_json": recorded,
        "endpoints_match_heldout_json": {"a": recorded["a"] == loss_a, "b": recorded["b"] == loss_b},
        "steps": steps, "images": num_images, "seed": seed, "inputs_sha256": inputs,
        "attention": backend.describe() if hasattr(backend, "describe") else type(backend).__name__,
        "precision": cfg.precision.name, "runs": [str(a.path), str(b.path)], "rule": BARRIER_RULE,
    }

