"""The study's analysis: the paper's Figs. 7 and 8 and the growth-rate ratios behind "2-5x".

A study directory holds the sibling runs of `numdev-train experiment=flash_stability`:

    reference/   Baseline attention, the pair's precision
    flash/       the attention under test, same seeds and precision
    init/        Baseline, another weight-initialisation seed
    fp32/        Baseline in fp32 (vs reference: what low-precision training changes)

Each pair's weight-distance curve comes from the comparing run's sibling CSV (written live by
numdev.train.sibling) when it covers every snapshot step, otherwise from the snapshots
themselves (numdev.analysis.compare), so studies run by any launcher can be analysed. The growth
of each curve is fitted as numdev.analysis.growth says (OLS slope against the step, with an
intercept), and the ratios low-precision/flash and init/flash are the ratios of the Wasserstein
slopes, which is what the paper's Fig. 8 compares.

    numdev-study STUDY_DIR        (re)analyse a finished study; also run at the end of the multirun
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from numdev.analysis.compare import compare_runs, model_curve, read_csv
from numdev.analysis.growth import __doc__ as GROWTH_DOC
from numdev.analysis.growth import fit_growth, slope_ratio
from numdev.atomic import WriteError, write_json
from numdev.errors import fail
from numdev.plotting import plt, save_png
from numdev.train.snapshots import list_snapshots

ROLES = ("reference", "flash", "init", "fp32")
# pair name -> (run, its sibling), as the paper's Fig. 8 names them
PAIRS = {
    "flash": ("flash", "reference"),
    "init": ("init", "reference"),
    "low_precision": ("fp32", "reference"),
}
PAIR_LABELS = {
    "flash": "Flash vs Baseline",
    "init": "different initialisation",
    "low_precision": "{precision} vs fp32",
}
SUMMARY = "summary.json"


def study_curves(study_dir: Path, log=print) -> dict[str, list[dict]]:
    """pair -> rows {step, tensor, max_abs, wasserstein} (numdev-compare's rows)."""
    missing = [role for role in ROLES if not (study_dir / role).is_dir()]
    if missing:
        raise FileNotFoundError(
            f"{study_dir} is not a finished study: no run directory for {missing} "
            "(expected reference/, flash/, init/, fp32/ from numdev-train experiment=flash_stability)"
        )
    curves = {}
    for pair, (run, sibling) in PAIRS.items():
        live = study_dir / run / "sibling" / f"{sibling}.csv"
        steps = list_snapshots(study_dir / sibling)
        rows = read_csv(live) if live.is_file() else []
        if sorted({r["step"] for r in rows}) != steps:
            log(f"[study] {pair}: computing the distances from the snapshots of {run}/ and {sibling}/")
            rows = compare_runs(study_dir / run, study_dir / sibling, log=log)
        curves[pair] = rows
    return curves


def analyse(study_dir: str | Path, log=print) -> dict:
    """Fit, figure and summarise a study; writes fig7.png, fig8.png and summary.json into it."""
    study_dir = Path(study_dir)
    curves = study_curves(study_dir, log)
    runs = {role: _run_record(study_dir / role) for role in ROLES}
    precision = runs["reference"].get("precision", "?")
    fits = {}
    for pair, rows in curves.items():
        steps, w1 = model_curve(rows, "wasserstein")
        _, max_abs = model_curve(rows, "max_abs")
        fits[pair] = {
            "label": PAIR_LABELS[pair].format(precision=precision),
            "steps": steps,
            "wasserstein": w1,
            "max_abs": max_abs,
            "wasserstein_fit": fit_growth(steps, w1),
            "max_abs_fit": fit_growth(steps, max_abs),
        }
    ratios = {
        f"{pair}/flash": {
            metric: _finite(slope_ratio(fits[pair][f"{metric}_fit"], fits["flash"][f"{metric}_fit"]))
            for metric in ("wasserstein", "max_abs")
        }
        for pair in ("low_precision", "init")
    }
    flash = fits["flash"]
    summary = {
        "study": str(study_dir),
        "pair_precision": precision,
        "flash_backend": runs["flash"].get("backend"),
        "reference_backend": runs["reference"].get("backend"),
        "model": runs["reference"].get("model"),
        "steps": flash["steps"][-1],
        "pairs": fits,
        "ratios": ratios,
        "fit_method": " ".join(GROWTH_DOC.split("\n\n")[1].split()),
        "paper": "Flash introduces roughly 2-5x less weight deviation than low-precision (FP16 vs FP32) training",
        "fig7_gap_grows": bool(flash["wasserstein_fit"]["slope"] > 0 and flash["wasserstein"][-1] > flash["wasserstein"][1]),
        "shadow": _shadow_summary(study_dir / "flash" / "shadow.csv"),
        "samples": {role: runs[role].get("eval") for role in ROLES},
    }
    lowp = ratios["low_precision/flash"]["wasserstein"]
    summary["low_precision_ratio_in_paper_range"] = lowp is not None and 2.0 <= lowp <= 5.0
    summary["caption_fig7"] = _caption_fig7(flash)
    summary["caption_fig8"] = _caption_fig8(fits, ratios, precision)
    _figure_fig7(flash, study_dir / "fig7.png")
    _figure_fig8(fits, study_dir / "fig8.png")
    write_json(study_dir / SUMMARY, summary)
    log(summary["caption_fig7"])
    log(summary["caption_fig8"])
    log(f"-> {study_dir / SUMMARY}, fig7.png, fig8.png")
    return summary


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _run_record(run_dir: Path) -> dict:
    path = run_dir / "run.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {run_dir} is not a numdev-train run directory")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from None


def _shadow_summary(path: Path) -> dict | None:
    if not path.is_file():
        return None
    from numdev.train.shadow import read_shadow_csv

    rows = read_shadow_csv(path)
    out = {}
    for quantity in ("out", "dq", "dk", "dv"):
        chosen = [r for r in rows if r["quantity"] == quantity]
        if chosen:
            worst = max(chosen, key=lambda r: r["max_abs"])
            out[quantity] = {
                "max_abs": worst["max_abs"],
                "max_abs_layer": worst["layer"],
                "max_abs_step": worst["step"],
                "mean_abs": sum(r["mean_abs"] for r in chosen) / len(chosen),
                "relative_max": max(r["max_abs"] / r["ref_max_abs"] for r in chosen if r["ref_max_abs"] > 0)
                if any(r["ref_max_abs"] > 0 for r in chosen) else None,
                "calls": len(chosen),
            }
    return out


def _caption_fig7(flash: dict) -> str:
    w1, mx = flash["wasserstein"], flash["max_abs"]
    return (
        f"Flash vs Baseline over {flash['steps'][-1]} steps: max |Δ| {mx[1]:.2e} at step {flash['steps'][1]} -> "
        f"{mx[-1]:.2e}; Wasserstein-1 {w1[1]:.2e} -> {w1[-1]:.2e} (slope {flash['wasserstein_fit']['slope']:.2e}/step, "
        f"R² {flash['wasserstein_fit']['r2']:.2f})"
    )


def _caption_fig8(fits: dict, ratios: dict, precision: str) -> str:
    def ratio(key):
        value = ratios[key]["wasserstein"]
        return "undefined (Flash's curve does not grow)" if value is None else f"{value:.1f}x"

    return (
        f"Wasserstein growth rates (OLS slope): Flash {fits['flash']['wasserstein_fit']['slope']:.2e}, "
        f"init {fits['init']['wasserstein_fit']['slope']:.2e}, {precision} vs fp32 "
        f"{fits['low_precision']['wasserstein_fit']['slope']:.2e} per step; low-precision/Flash "
        f"{ratio('low_precision/flash')}, init/Flash {ratio('init/flash')} (paper: low precision 2-5x Flash)"
    )


def _figure_fig7(flash: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric, label in ((axes[0], "max_abs", "max |W_flash − W_baseline|"), (axes[1], "wasserstein", "Wasserstein-1")):
        ax.plot(flash["steps"], flash[metric], "o-", ms=3, color="C0")
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle("Fig. 7 — Flash vs Baseline weights over training (whole model)")
    save_png(fig, path)


def _figure_fig8(fits: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, fit in enumerate(fits.values()):
        steps, values, line = fit["steps"], fit["wasserstein"], fit["wasserstein_fit"]
        for ax in axes:
            ax.plot(steps, values, "o-", ms=3, color=f"C{i}", label=f"{fit['label']} (slope {line['slope']:.1e})")
        axes[0].plot(steps, [line["slope"] * s + line["intercept"] for s in steps], "--", color=f"C{i}", lw=1)
    axes[0].set_title("linear, with the fitted lines")
    axes[1].set_title("log scale")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("training step")
        ax.set_ylabel("Wasserstein-1 to the reference (whole model)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Fig. 8 — weight deviation of Flash next to its proxies")
    save_png(fig, path)


class StudyAnalysis(Callback):
    """Hydra callback (experiment=flash_stability): analyse the study when the multirun ends."""

    def on_multirun_end(self, config, **kwargs) -> None:
        study_dir = Path(config.hydra.sweep.dir)
        try:
            analyse(study_dir)
        except (FileNotFoundError, ValueError, WriteError) as error:
            print(f"numdev-study: the analysis did not run: {error}", file=sys.stderr)
            return
        from numdev.commands import tensorboard

        print(f"TensorBoard: {tensorboard(study_dir)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="numdev-study", description="(Re)analyse a finished flash-stability study: fig7.png, fig8.png, summary.json")
    parser.add_argument("study_dir", help="the multirun directory of numdev-train experiment=flash_stability")
    args = parser.parse_args(argv)
    try:
        analyse(args.study_dir, log=lambda m: print(m, file=sys.stderr) if m.startswith(("[", "warning")) else print(m))
    except (FileNotFoundError, ValueError, WriteError) as error:
        fail("numdev-study", error)


if __name__ == "__main__":
    main()
