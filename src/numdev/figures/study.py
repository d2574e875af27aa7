"""The study's figures: their entries in the figure list (the claims of Figs. 7 and 8), and the
figures themselves, drawn from summary.json's numbers (numdev.analysis.study computes them; nothing is
recomputed here).

fig7.png            Flash vs Baseline over training: every replicate, their mean and its band
fig8.png            (a) the calibration ladder: D at the calibration step against the rung's size, and every
                    role's equivalent size eps* on it; (b) the early-phase curves on log axes; (c) the late,
                    shared regime: every role's distance over the whole run (the paper's slope panel)
loss_curves.png     the training loss of every run, one panel per role, replicates overlaid
downstream.png      held-out loss and caption agreement of every run, per role

Bands are the per-step spread of the mean over replicates by the house rule (numdev.stats.intervals: the 95%
bootstrap interval from 5 replicates, else their range), and each title says which; with one
replicate there is no band, only the line.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from numdev.figures.common import Figure
from numdev.figures.plotting import plt, save_png
from numdev.runs.layout import DOWNSTREAM, FIG7, FIG8, LOSS_CURVES
from numdev.stats import intervals as stats
from numdev.weights.metrics import EARLY_METRIC, LABELS

STUDY_FIGURES = (
    Figure(
        "fig7",
        "Fig. 7 — Flash vs Baseline weights over training",
        "Trained with identical seeds, the Flash and Baseline runs' weights drift apart over training, by max difference and Wasserstein distance, and the gap only grows.",
        phase="study",
        module="numdev.analysis.study",
    ),
    Figure(
        "fig8",
        "Fig. 8 — proxies",
        "Flash's weight deviation grows at a rate comparable to or below a different random initialisation, and 2-5x below FP16-vs-FP32 training.",
        phase="study",
        module="numdev.analysis.study",
    ),
)


def draw_all(summary: dict, study_dir: Path, ladder: str) -> list[str]:
    """Every study figure into study_dir; `ladder`: the calibration ladder's name (numdev.analysis.early.INIT_LADDER).
    Returns the names of the figures drawn: a figure with nothing to show (no loss curves, no held-out
    outcomes) is not drawn, and an earlier analysis's file of that name is removed, so no console line or
    report names a picture of other data."""
    drawn = []
    for name, draw in ((FIG7, lambda p: fig7(summary, p)), (FIG8, lambda p: fig8(summary, p, ladder)),
                       (LOSS_CURVES, lambda p: loss_curves(summary, p)), (DOWNSTREAM, lambda p: downstream(summary, p))):
        path = study_dir / name
        path.unlink(missing_ok=True)
        draw(path)
        if path.is_file():
            drawn.append(name)
    return drawn


def _band(ax, steps, values_by_rep: dict, colour, label: str, thin: bool = False) -> None:
    curves = np.array(list(values_by_rep.values()), dtype=np.float64)  # (replicates, steps)
    mean = curves.mean(axis=0)
    if thin:
        for curve in curves:
            ax.plot(steps, curve, "-", color=colour, lw=0.6, alpha=0.45)
    ax.plot(steps, mean, "o-", ms=2.5, color=colour, label=label)
    if len(curves) >= 2:
        bands = [stats.mean_interval(curves[:, i]) for i in range(curves.shape[1])]
        ax.fill_between(steps, [b.low for b in bands], [b.high for b in bands], color=colour, alpha=0.2, lw=0)


def fig7(summary: dict, path: Path) -> None:
    role = summary["under_test"]
    pair = summary["pairs"]["reference"].get(role) if role else None
    metrics = [m for m in dict.fromkeys((summary["primary_metric"], summary["paper_metric"], "max_abs")) if m in summary["metrics"]]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        entry = (pair or {}).get(metric)
        if entry:
            _band(ax, entry["steps"], entry["values"], "C0", f"{len(entry['values'])} replicate(s), mean", thin=True)
        ax.set_xlabel("training step")
        ax.set_ylabel(LABELS.get(metric, metric))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Fig. 7 — Flash vs Baseline weights over training (whole model; band: {stats.mean_spread_words(len(summary['replicates']))})")
    save_png(fig, path)


def _geomean_at(entry: dict, step: int) -> float | None:
    if step not in entry["steps"]:
        return None
    i = entry["steps"].index(step)
    values = [v[i] for v in entry["values"].values() if v[i] > 0]
    return float(np.exp(np.mean(np.log(values)))) if values else None


def _ladder_panel(ax, summary: dict, ladder: str) -> None:
    calib = summary.get("calibration") or {}
    rungs = (calib.get("ladders") or {}).get(ladder)
    if not rungs:
        ax.text(0.5, 0.5, "no calibration ladder in this study\n(experiment=flash_stability_early)", ha="center", va="center",
                transform=ax.transAxes, fontsize=9)
        ax.axis("off")
        return
    step, pairs = calib["step"], summary["pairs"]["reference"]
    sizes = [r["size"] for r in rungs]
    values = [_geomean_at(pairs[r["role"]][EARLY_METRIC], step) for r in rungs]
    ax.plot(sizes, values, "ks-", ms=5, label="init ladder (geometric mean)")
    for rung, size in zip(rungs, sizes):
        for v in pairs[rung["role"]][EARLY_METRIC]["values"].values():
            i = pairs[rung["role"]][EARLY_METRIC]["steps"].index(step)
            ax.plot([size], [v[i]], ".", color="0.6", ms=3)
    if calib["floor"].get("floor") is not None:
        ax.axvline(calib["floor"]["floor"], color="0.4", ls=":", lw=1, label=f"resolution floor {calib['floor']['floor']:g}")
    equivalents = calib["equivalent"].get(ladder, {})
    shown = [r for r in summary["role_order"] if summary["roles"][r]["kind"] in ("under_test", "proxy", "control") and r in equivalents
             and r not in {x["role"] for x in rungs}]
    for k, role in enumerate(shown):
        entry = equivalents[role]
        value = _geomean_at(pairs[role][EARLY_METRIC], step)
        if value is None:
            continue
        colour = f"C{k % 10}"
        ax.axhline(value, color=colour, lw=1, alpha=0.7)
        if entry.get("status") == "measured":
            est = stats.Estimate(**entry["estimate"])
            ax.errorbar([est.value], [value], xerr=[[est.value - est.low], [est.high - est.value]] if est.has_interval else None,
                        fmt="o", color=colour, capsize=3, label=f"{role}: eps* {entry['text']}")
        else:
            ax.plot([], [], color=colour, label=f"{role}: {entry['text'].split(':')[0]}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("relative size eps of the initial-weight perturbation")
    ax.set_ylabel(f"‖ΔW‖/‖W‖ at step {step}")
    ax.set_title(f"(a) the ladder at step {step}; eps* of each role", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6)


def _early_panel(ax, summary: dict) -> None:
    roles = summary["role_order"]
    pairs = summary["pairs"]["reference"]
    for role in roles:
        entry = (pairs.get(role) or {}).get(EARLY_METRIC)
        if not entry:
            continue
        keep = [i for i, s in enumerate(entry["steps"]) if 1 <= s <= 128]
        if len(keep) < 2:
            continue
        curves = np.array([[v[i] for i in keep] for v in entry["values"].values()])
        curves = np.where(curves > 0, curves, np.nan)
        seen = ~np.isnan(curves).all(axis=0)  # steps where some replicate is above 0 (a log axis has no 0)
        mean = np.full(curves.shape[1], np.nan)
        mean[seen] = np.exp(np.nanmean(np.log(curves[:, seen]), axis=0))
        ladder = summary["roles"].get(role, {}).get("ladder")
        style = dict(color="0.55", lw=0.8, ls="--") if ladder else dict(color=f"C{roles.index(role) % 10}", lw=1.6)
        ax.plot([entry["steps"][i] for i in keep], mean, marker=".", ms=3, label=role, **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training step (log)")
    ax.set_ylabel("‖ΔW‖/‖W_ref‖ to the reference (geometric mean)")
    ax.set_title("(b) the early phase on log axes (grey dashed: ladder rungs)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, ncol=2)


def fig8(summary: dict, path: Path, ladder: str) -> None:
    metric = summary["primary_metric"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2), squeeze=False)
    _ladder_panel(axes[0][0], summary, ladder)
    _early_panel(axes[0][1], summary)
    roles = [r for r in summary["role_order"] if not summary["roles"].get(r, {}).get("ladder") or r == "ulp"]
    for ax, against in zip(axes[0][2:], ["reference"]):
        for role in roles:
            entry = summary["pairs"][against].get(role, {}).get(metric)
            if not entry:
                continue
            slope = stats.Estimate(**entry["slope"])
            _band(ax, entry["steps"], entry["values"], f"C{roles.index(role) % 10}", f"{role} (slope {slope.value:.1e})")
        linthresh = _linthresh(summary["pairs"][against], metric)
        ax.set_yscale("symlog", linthresh=linthresh)
        _decade_ticks(ax, linthresh)
        ax.set_xlabel("training step")
        ax.set_ylabel(f"{LABELS.get(metric, metric)} to the {against} run")
        ax.set_title(f"(c) the late, shared regime: the whole run\n(OLS slope in the legend; bands: "
                     f"{stats.mean_spread_words(len(summary['replicates']))})", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Fig. 8 — how big is Flash's deviation? The ladder gives units; early on a log axis; late, every role alike")
    save_png(fig, path)


def _decade_ticks(ax, linthresh: float) -> None:
    """0 and the decades above the linear region: symlog's own ticks put 0 and 10^k (k = the linear
    threshold's decade) one tick apart, where their labels overlap."""
    from matplotlib.ticker import FixedLocator, NullLocator

    top = ax.get_ylim()[1]
    if not (linthresh > 0 and top > linthresh):
        return
    first, last = math.ceil(math.log10(linthresh)) + 1, math.floor(math.log10(top))
    ax.yaxis.set_major_locator(FixedLocator([0.0, *(10.0 ** k for k in range(first, last + 1))]))
    ax.yaxis.set_minor_locator(NullLocator())


def _linthresh(pairs: dict, metric: str) -> float:
    positive = [v for pair in pairs.values() if pair.get(metric) for values in pair[metric]["values"].values() for v in values if v > 0]
    return float(min(positive)) if positive else 1e-12


def loss_curves(summary: dict, path: Path) -> None:
    roles = [r for r in summary["role_order"] if any((summary["loss_curves"].get(r) or {}).values())]
    if not roles:
        return
    columns = min(4, len(roles))
    rows = math.ceil(len(roles) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.8 * rows), squeeze=False, sharex=True, sharey=True)
    reference = next((r for r, meta in summary["roles"].items() if meta["kind"] == "reference"), None)
    for ax, role in zip(axes.flat, roles):
        if reference is not None and role != reference:
            for curve in summary["loss_curves"][reference].values():
                if curve:
                    ax.plot(curve["steps"], _smooth(curve["loss"]), color="0.6", lw=0.8)
        for i, (replicate, curve) in enumerate(sorted(summary["loss_curves"][role].items())):
            if curve:
                ax.plot(curve["steps"], _smooth(curve["loss"]), color=f"C{i}", lw=1, label=f"r{replicate}")
        ax.set_title(f"{role}" + (" (grey: reference)" if role != reference else ""), fontsize=9)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(roles):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.supxlabel("training step")
    fig.supylabel("training loss (EMA 0.9)")
    fig.suptitle("Training loss of every run")
    save_png(fig, path)


def _smooth(values, beta: float = 0.9) -> list[float]:
    out, average = [], None
    for v in values:
        average = v if average is None else beta * average + (1 - beta) * v
        out.append(average)
    return out


def downstream(summary: dict, path: Path) -> None:
    outcomes = [o for o in summary["downstream"] if summary["downstream"][o]["roles"]]
    if not outcomes:
        return
    fig, axes = plt.subplots(1, len(outcomes), figsize=(4.2 * len(outcomes), 3.8), squeeze=False)
    for ax, outcome in zip(axes[0], outcomes):
        entry = summary["downstream"][outcome]
        roles = [r for r in summary["role_order"] if r in entry["roles"]]
        for i, row in enumerate(entry["roles"][r] for r in roles):
            values = list(row["per_replicate"].values())
            ax.plot([i] * len(values), values, "o", color="0.5", ms=3)
            mean = stats.Estimate(**row["mean"])
            error = [[mean.value - mean.low], [mean.high - mean.value]] if mean.has_interval else None
            ax.errorbar([i], [mean.value], yerr=error, fmt="s", color="C0", ms=5, capsize=3)
        ax.set_xticks(range(len(roles)), roles, rotation=45, fontsize=8)
        ax.set_title(entry["label"], fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Downstream: every run (grey) and the mean over replicates with its spread ({stats.mean_spread_words(len(summary['replicates']))})")
    save_png(fig, path)
