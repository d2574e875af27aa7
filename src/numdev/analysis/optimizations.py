"""The optimizations table (experiment=optimizations, docs/optimizations.md): one row per optimization.

Rows are the study's roles that change the training (kinds under_test, proxy, optimization; the
`data` control as the seed-to-seed yardstick); ladder rungs and the floor control give the units.
Per row:

- **kernel**: real (the kernel a user gets on this machine) or emulated (numdev's emulation of the
  arithmetic), from the run's own record (run.json `optimization.kernel`, else its attention backend);
- **phase 1**: the deviation of one call against FP64 (max |d|, mean |d|, mean signed d), for rows
  that change the attention call: the run's own backend (as configured, its optimization applied)
  on the study's image self-attention shape, N(0, 1) inputs, PHASE1_SEEDS seeds; for rows that change
  the matrix products (GEMM_OPTIMIZATIONS), one linear call of the model's width as the optimization
  computes it (its `active()` settings and its swapped nn.Linear) against the FP64 product; whole-
  training changes are not one call;
- **eps***: the equivalent initial-weight perturbation against the row's own baseline
  (`study.baseline` in its role file; the reference unless it says otherwise), on the study's init
  ladder at the calibration step (numdev.analysis.early); a row whose baseline is another role is
  compared with that role's runs of the same replicate (from the snapshots);
- **step time ratio**: the run's median step time over its baseline's (run.json step_seconds,
  measured in the same study), per replicate, geometric mean with the t interval (ranges below 5);
- **downstream**: the held-out loss (diffusion, or next-token cross-entropy for a language model) at the run's last step (numdev.train.callbacks.heldout), the row
  minus its baseline per replicate, mean with its interval; its mean |Δ| is set against the `data`
  control's (another data order against the reference: the seed-to-seed yardstick). Caption
  agreement needs samples, which the catalogue does not draw (64 steps: docs/study.md#early).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hydra.utils import instantiate

from numdev.analysis import early
from numdev.config.objective import objective_of
from numdev.stats import intervals as stats

ROW_KINDS = ("under_test", "proxy", "optimization", "control")
PHASE1_SEEDS = 5
PHASE1_BATCH = 8
NOT_ONE_CALL = "phase 1: not one call (changes the whole training step)"
HELDOUT = "heldout_loss"  # numdev.analysis.study.DOWNSTREAM's outcome the table reads
YARDSTICK = "data"  # the control whose |Δ| to the reference is the seed-to-seed yardstick
GEMM_OPTIMIZATIONS = ("matmul_bf16", "fp8_linear", "mxfp8_linear", "nvfp4_linear", "fp8_block_linear", "torchao_fp8", "torchao_mxfp8")
EMULATED_BACKENDS = ("flash_emulated", "baseline", "output_noise")


def table(runs: dict, curves: dict, calibration: dict, pair_curves, log=print, downstream: dict | None = None) -> dict:
    """{"rows": [...], "markdown": the table, "rules": ...}: see the module's docstring.

    runs: numdev.analysis.study.discover's; curves: against the reference (role -> replicate -> curve);
    pair_curves(run_dir, baseline_dir, baseline_role) -> curve of a run against another role's run;
    downstream: numdev.analysis.study.downstream's (per outcome, role: per-replicate values).
    """
    reference = next(role for role, by_rep in runs.items() if _first(by_rep)["kind"] == "reference")
    heldout = (downstream or {}).get(HELDOUT, {}).get("roles", {})
    yardstick = _heldout_change(heldout, YARDSTICK, reference) if YARDSTICK != reference else None
    rows = []
    for role, by_rep in runs.items():
        first = _first(by_rep)
        if first["kind"] not in ROW_KINDS or first.get("ladder"):
            continue
        baseline = (first["config"].get("study") or {}).get("baseline") or reference
        if baseline not in runs:
            raise ValueError(f"conf/train/study/{role}.yaml: study.baseline={baseline!r} is not a role of this study: add it to the sweep")
        rows.append({
            "role": role, "label": first["label"], "kind": first["kind"], "baseline": baseline,
            "kernel": kernel_of(first["record"]),
            "optimization": (first["record"].get("optimization") or {}).get("name", "none"),
            "phase1": phase1(first, runs[reference], log),
            "equivalent": _equivalent(role, baseline, reference, runs, curves, calibration, pair_curves),
            "step_time_ratio": step_time_ratio(by_rep, runs[baseline]),
            "first_step_s": _spread_of(by_rep, "first"),
            "downstream": _downstream(heldout, role, baseline, yardstick),
        })
    loss, shape = _workload_words(_first(runs[reference])["config"])
    return {"rows": rows, "markdown": markdown(rows, calibration), "rules": {
        "equivalent": "eps*: " + early.FLOOR_RULE + "; " + early.CALIBRATION_RULE,
        "step_time": "median step time of the run over its baseline's, per replicate; " + stats.LOG_RULE,
        "downstream": f"{loss} at the last step (numdev.train.callbacks.heldout), the row minus its baseline "
                      f"per replicate: mean [{stats.RULE}; from fewer than {stats.MIN_BOOTSTRAP} replicates the range]; "
                      f"'more than a seed' when its mean |Δ| exceeds the {YARDSTICK} control's mean |Δ| to the reference",
        "phase1": f"one attention call against FP64 (golden_attention), {shape}, N(0,1) inputs; "
                  f"matrix-product rows: one hidden x hidden linear call against the FP64 product, N(0,1) inputs, "
                  f"nn.Linear's weight range; {PHASE1_SEEDS} seeds: mean over seeds [range]",
    }}


def _workload_words(config: dict) -> tuple[str, str]:
    """What the rules call the workload's held-out loss and its attention call (the reference run's config)."""
    target = str((objective_of(config) or {}).get("_target_", ""))
    loss = ("held-out next-token cross-entropy (nats per token)" if target.endswith("CausalLMModule")
            else "held-out diffusion loss" if target.endswith("DiffusionModule") else "held-out loss (the model's own)")
    try:
        shape = "causal self-attention over the training window" if sequence(config)[1] else "image self-attention shape"
    except (KeyError, TypeError, ValueError):  # a user's model: its attention call as the catalogue measures it
        shape = "the model's attention shape"
    return loss, shape


def _first(by_rep: dict) -> dict:
    return by_rep[min(by_rep)]


def kernel_of(record: dict) -> str:
    """real or emulated, from the run's own record."""
    kernel = (record.get("optimization") or {}).get("kernel", "none")
    if kernel != "none":
        return kernel
    return "emulated" if record.get("backend") in EMULATED_BACKENDS else "real"


def _heldout_change(heldout: dict, role: str, baseline: str) -> dict | None:
    """The role's held-out loss minus its baseline's, paired by replicate: {"estimate", "mean_abs", "n"}."""
    mine, theirs = (heldout.get(r, {}).get("per_replicate", {}) for r in (role, baseline))
    common = sorted(set(mine) & set(theirs), key=int)
    if not common:
        return None
    diffs = [mine[r] - theirs[r] for r in common]
    return {"estimate": stats.mean_interval(diffs).as_dict(), "mean_abs": float(np.mean(np.abs(diffs))), "n": len(diffs)}


def _downstream(heldout: dict, role: str, baseline: str, yardstick: dict | None) -> dict:
    change = _heldout_change(heldout, role, baseline)
    if change is None:
        return {"text": "not measured (no heldout.json: callbacks.heldout was off)"}
    estimate = stats.Estimate(**change["estimate"])
    text = f"held-out loss Δ {estimate.text('+.2g')}" if estimate.n > 1 else f"held-out loss Δ {estimate.value:+.2g} (one replicate)"
    out = {"heldout_loss": change}
    if role == YARDSTICK:
        text += " (the seed-to-seed yardstick)"
    elif yardstick is not None:
        more = change["mean_abs"] > yardstick["mean_abs"]
        out["more_than_a_seed"] = more
        text += (f"; mean |Δ| {change['mean_abs']:.2g} vs {yardstick['mean_abs']:.2g} for another data order: "
                 f"{'more' if more else 'no more'} than a seed")
    out["text"] = text
    return out


def _spread_of(by_rep: dict, key: str) -> dict | None:
    """Median, min and max over replicates of a step_seconds entry (the first step: compilation, caches)."""
    values = [run["record"].get("step_seconds", {}).get(key) for run in by_rep.values()]
    values = [v for v in values if v is not None]
    return {"median": float(np.median(values)), "min": float(min(values)), "max": float(max(values))} if values else None


def step_time_ratio(by_rep: dict, baseline: dict) -> dict:
    """The role's median step time over its baseline's, paired by replicate."""
    top, bottom = [], []
    for r in sorted(set(by_rep) & set(baseline)):
        a = by_rep[r]["record"].get("step_seconds", {}).get("median")
        b = baseline[r]["record"].get("step_seconds", {}).get("median")
        if a and b:
            top.append(a)
            bottom.append(b)
    if not top:
        return {"text": "not measured (no step_seconds in run.json)"}
    estimate = stats.log_ratio_interval(top, bottom)
    return {"estimate": estimate.as_dict(), "text": estimate.text(".2f", "x") if estimate.n > 1 else f"{estimate.value:.2f}x (one replicate)"}


def _equivalent(role, baseline, reference, runs, curves, calibration, pair_curves) -> dict:
    equivalent = (calibration.get("equivalent") or {}).get(early.INIT_LADDER)
    if not equivalent:
        return {"text": f"not measurable: {calibration.get('problem', 'no init ladder')}"}
    if baseline == reference:
        entry = equivalent.get(role, {"text": "not measurable"})
        return {k: entry.get(k) for k in ("text", "status", "estimate", "per_replicate") if k in entry}
    rungs = [(rung["role"], rung["size"]) for rung in calibration["ladders"][early.INIT_LADDER]]
    pseudo = f"{role} vs {baseline}"
    merged = {**curves, pseudo: {r: pair_curves(run["dir"], runs[baseline][r]["dir"], baseline)
                                 for r, run in runs[role].items() if r in runs[baseline]}}
    entry = early.equivalent_size(merged, rungs, pseudo, calibration["step"], calibration["floor"])
    return {k: entry.get(k) for k in ("text", "status", "estimate", "per_replicate") if k in entry}


def phase1(run: dict, reference_runs: dict, log=print) -> dict:
    """One attention call of this run's backend against FP64, when the row changes the attention call."""
    record, config = run["record"], run["config"]
    optimization = (record.get("optimization") or {}).get("name", "none")
    if optimization in GEMM_OPTIMIZATIONS:
        return linear_call(config)
    reference = _first(reference_runs)["record"]
    same_attention = record.get("attention") == reference.get("attention")
    if optimization != "none" and same_attention:
        return {"status": "not one call", "text": NOT_ONE_CALL}
    if record.get("precision") != reference.get("precision"):
        return {"status": "not one call", "text": NOT_ONE_CALL}
    if same_attention:  # a control: the same arithmetic, other seeds
        return {"status": "same call", "text": "– (the reference's attention call)"}
    backend = instantiate(config["attention"])
    if config.get("optimization") is not None:
        backend = instantiate(config["optimization"]).attention(backend)
    model = config["model"]
    heads, dim = int(model["heads"]), int(model["hidden"]) // int(model["heads"])
    tokens, causal = sequence(config)
    from numdev.attention.golden import golden_attention

    def call(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = (torch.randn(PHASE1_BATCH, heads, tokens, dim, generator=g) for _ in range(3))
        return backend(q, k, v, causal=causal), golden_attention(q, k, v, causal=causal)

    return _measured(call, [PHASE1_BATCH, heads, tokens, dim])


def sequence(config: dict) -> tuple[int, bool]:
    """(tokens, causal) of the model's main attention call: a language model's window (data.sequence_length,
    causal), else a DiT's image tokens ((data.resolution / model.patch)^2, not causal)."""
    data, model = config["data"], config["model"]
    if "sequence_length" in data:
        return int(data["sequence_length"]), True
    return (int(data["resolution"]) // int(model["patch"])) ** 2, False


def linear_call(config: dict) -> dict:
    """One nn.Linear call of the model's width (hidden -> hidden, the batch's tokens as rows, weights
    drawn as nn.Linear draws them) computed as the optimization computes it, against the FP64 product."""
    from torch import nn

    optimization = instantiate(config["optimization"])
    model = config["model"]
    hidden = int(model["hidden"])
    rows = PHASE1_BATCH * sequence(config)[0]

    def call(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(rows, hidden, generator=g)
        bound = hidden ** -0.5  # nn.Linear's default init range for its weights
        weight = (torch.rand(hidden, hidden, generator=g) * 2 - 1) * bound
        linear = nn.Linear(hidden, hidden, bias=False)
        linear.weight.data.copy_(weight)
        with optimization.active():
            layer = optimization.model(nn.Sequential(linear))
            out = layer(x)
        return out, x.double() @ weight.double().t()

    return _measured(call, [rows, hidden, hidden])


def _measured(call, shape: list[int]) -> dict:
    """max |d|, mean |d|, mean signed d of call(generator) -> (output, FP64 golden), over PHASE1_SEEDS seeds."""
    from numdev.bench.metrics import deviation

    per = {"max_abs": [], "mean_abs": [], "mean_signed": []}
    for seed in range(PHASE1_SEEDS):
        with torch.no_grad():
            out, golden = call(torch.Generator().manual_seed(seed))
            d = deviation(out, golden)
        for key in per:
            per[key].append(d[key])
    out = {"status": "measured", "seeds": PHASE1_SEEDS, "shape": shape}
    for key, values in per.items():
        out[key] = {"mean": float(np.mean(values)), "low": float(np.min(values)), "high": float(np.max(values))}
    out["text"] = "; ".join(f"{name} {out[key]['mean']:.2e}" for key, name in
                            (("max_abs", "max"), ("mean_abs", "mean"), ("mean_signed", "mean signed")))
    return out


def _cell(phase: dict, key: str) -> str:
    if phase.get("status") != "measured":
        return "–"
    entry = phase[key]
    return f"{entry['mean']:.2e} [{entry['low']:.2e}, {entry['high']:.2e}]"


def _escaped(text: str) -> str:
    """A table cell's text: its | (as in "mean |Δ|") would end the cell."""
    return text.replace("\\|", "|").replace("|", "\\|")


def markdown(rows: list[dict], calibration: dict) -> str:
    """The table as Markdown (summary.json carries it; scripts/optimization_table.py and numdev-report show it)."""
    lines = [
        "| optimization (role) | kernel | baseline | phase 1 vs FP64: max \\|d\\| | mean \\|d\\| | mean signed d "
        "| phase 2: eps* (init ladder) | step time ratio | first step (s): median [min, max] | downstream |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        p = row["phase1"]
        if p.get("status") == "measured":
            cells = [_cell(p, "max_abs"), _cell(p, "mean_abs"), _cell(p, "mean_signed")]
        else:
            cells = [p["text"], "", ""]
        spread = row.get("first_step_s")
        first = f"{spread['median']:.2g} [{spread['min']:.2g}, {spread['max']:.2g}]" if spread else "–"
        texts = [_escaped(t) for t in (row["equivalent"]["text"], row["step_time_ratio"]["text"], first, row["downstream"]["text"])]
        lines.append(f"| {row['label']} (`{row['role']}`) | {row['kernel']} | {row['baseline']} | "
                     + " | ".join([*map(_escaped, cells), *texts]) + " |")
    floor = (calibration.get("floor") or {}).get("text")
    if floor:
        lines.append("")
        lines.append(f"Calibration step {calibration['step']}; resolution floor: {floor}.")
    return "\n".join(lines)


def ordering(rows: list[dict]) -> list[dict]:
    """Rows ordered by how much they move the weights per unit of speed-up (eps* / (speed-up - 1)),
    for rows whose step-time ratio's interval lies below 1; the others follow, ordered by eps*
    (below the floor first). Each entry: role, label, eps (value or None), below_floor, speedup, faster, per_unit."""
    out = []
    for row in rows:
        if row["kind"] == "control":  # a yardstick, not an optimization
            continue
        estimate = (row["equivalent"].get("estimate") or {}) if row["equivalent"].get("status") == "measured" else {}
        eps = estimate.get("value")
        ratio = (row["step_time_ratio"].get("estimate") or {}).get("value")
        speedup = 1.0 / ratio if ratio else None
        interval = row["step_time_ratio"].get("estimate") or {}
        faster = interval.get("high") is not None and interval["high"] < 1.0  # the ratio's interval lies below 1
        entry = {"role": row["role"], "label": row["label"], "eps": eps, "eps_text": row["equivalent"]["text"],
                 "below_floor": row["equivalent"].get("status") == "below the floor",
                 "speedup": speedup, "faster": faster, "per_unit": None}
        if eps is not None and faster and speedup and speedup > 1:
            entry["per_unit"] = eps / (speedup - 1.0)
        out.append(entry)
    def key(e):  # faster rows by eps* per unit of speed-up; then the others by eps* (below the floor first)
        size = 0.0 if e["below_floor"] else (math.inf if e["eps"] is None else e["eps"])
        return (e["per_unit"] is None, e["per_unit"] if e["per_unit"] is not None else size, -(e["speedup"] or 0.0))

    return sorted(out, key=key)
