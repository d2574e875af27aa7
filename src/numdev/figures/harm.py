"""The harm study's figures, drawn from its summary (numdev.runs.harm_summary; numdev.analysis.harm computes it).

- calibration.png: every role's equivalent per-call noise delta* against the step (log axes), its
  interval band over replicates, the ladder's rungs as dotted lines and the stable window bold;
  where a step is not measured its status is marked at the axis;
- harm.png: the held-out loss effect of every attention-noise rung against delta, the margin, and
  delta_harm with its interval; the roles under test placed at their delta* with their own effect;
- controls.png: every role's held-out effect with its 95% interval (a range below 5 replicates)
  against the +/- margin, each pre-registered claim's verdict beside it.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from numdev.figures.plotting import save_png  # noqa: E402
from numdev.runs.harm_summary import HarmSummary  # noqa: E402

FILES = ("calibration.png", "harm.png", "controls.png")
NOISE = "attention_noise"
plt.rcParams.update({"font.size": 11, "axes.titlesize": 12, "legend.fontsize": 10})


def _estimate(entry: dict | None) -> tuple[float, float, float] | None:
    if not entry or not entry.get("estimate"):
        return None
    e = entry["estimate"]
    value, low, high = e.get("value"), e.get("low"), e.get("high")
    if value is None or not math.isfinite(value):
        return None
    return value, low if low is not None else value, high if high is not None else value


def calibration_figure(summary: HarmSummary, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 5.5), constrained_layout=True)
    for rung in summary.calibration.get(NOISE, {}).get("rungs", []):
        ax.axhline(rung["size"], color="0.8", linestyle=":", linewidth=1)
        ax.text(1, rung["size"], f" {rung['size']:g}", color="0.5", fontsize=9, va="bottom")
    for role in summary.roles.values():
        entry = role.calibration.get(NOISE)
        if not entry or role.kind in ("ladder", "reference", "truth"):
            continue
        points = [(int(s), _estimate(e)) for s, e in entry["steps"].items() if e.get("status") == "measured"]
        points = [(s, e) for s, e in sorted(points) if e is not None]
        if not points:
            continue
        steps = [s for s, _ in points]
        line, = ax.plot(steps, [e[0] for _, e in points], marker="o", markersize=3, linewidth=1, label=role.label)
        ax.fill_between(steps, [e[1] for _, e in points], [e[2] for _, e in points], color=line.get_color(), alpha=0.15)
        window = entry.get("stability") or {}
        if window.get("stable"):
            chosen = [(s, e) for s, e in points if s in window["steps"]]
            ax.plot([s for s, _ in chosen], [e[0] for _, e in chosen], color=line.get_color(), linewidth=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("delta* (equivalent per-call relative noise)")
    ax.set_title("Calibration over steps: delta* at every snapshot (bold: the stable window)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=9)
    save_png(fig, path)
    plt.close(fig)


def harm_figure(summary: HarmSummary, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 5.5), constrained_layout=True)
    margin = summary.margin["margin"]
    xs, ys, lows, highs = [], [], [], []
    for rung in summary.harm.get("rungs", []):
        effect = summary.roles[rung["role"]].effects.get("heldout_loss") if rung["role"] in summary.roles else None
        if not effect:
            continue
        xs.append(rung["size"])
        ys.append(effect["mean"])
        lows.append(effect["mean"] - effect["interval"]["low"] if effect["interval"].get("low") is not None else 0)
        highs.append(effect["interval"]["high"] - effect["mean"] if effect["interval"].get("high") is not None else 0)
    if xs:
        ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", color="black", capsize=3, label="attention-noise ladder (rungs)")
    ax.axhline(margin, color="tab:red", linestyle="--", label=f"margin: +{margin:.0%} held-out loss")
    ax.axhline(0, color="0.6", linewidth=0.8)
    harm = _estimate(summary.harm)
    if harm:
        ax.axvline(harm[0], color="tab:red", linewidth=1)
        ax.axvspan(harm[1], harm[2], color="tab:red", alpha=0.1, label=f"delta_harm {summary.harm['text']}")
    for role in summary.roles.values():
        if role.kind != "under_test":
            continue
        value = ((role.calibration.get(NOISE) or {}).get("value") or {})
        delta = _estimate(value)
        effect = role.effects.get("heldout_loss")
        if delta and effect:
            ax.errorbar([delta[0]], [effect["mean"]], xerr=[[delta[0] - delta[1]], [delta[2] - delta[0]]], marker="s", capsize=3,
                        linestyle="none", label=f"{role.label} at its delta*")
    ax.set_xscale("log")
    ax.set_xlabel("per-call relative noise delta")
    ax.set_ylabel("held-out loss vs the reference (relative)")
    ax.set_title("Where training is harmed: the noise ladder's effect, the margin and delta_harm")
    ax.legend(loc="upper left", fontsize=9)
    save_png(fig, path)
    plt.close(fig)


def controls_figure(summary: HarmSummary, path: Path) -> None:
    rows = [(name, role) for name, role in summary.roles.items() if role.effects.get("heldout_loss")]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.8), constrained_layout=True)
    margin = summary.margin["margin"]
    for i, (_, role) in enumerate(rows):
        effect = role.effects["heldout_loss"]
        low, high = effect["interval"].get("low"), effect["interval"].get("high")
        colour = {"harms": "tab:red", "no_harm": "tab:green", "more_harm_than": "tab:orange"}.get(role.claim or "", "tab:blue")
        if low is not None and high is not None:
            ax.plot([low, high], [i, i], color=colour, linewidth=2)
        ax.plot([effect["mean"]], [i], marker="o", color=colour)
        verdict = f"{role.control['symbol']} {role.claim}" if role.control else ""
        ax.text(1.01, i, verdict, transform=ax.get_yaxis_transform(), va="center", fontsize=10)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{role.label} ({name})" for name, role in rows], fontsize=9)
    ax.axvline(margin, color="tab:red", linestyle="--")
    ax.axvline(-margin, color="tab:red", linestyle="--")
    ax.axvline(0, color="0.6", linewidth=0.8)
    ax.set_xscale("symlog", linthresh=margin / 10)
    ax.set_xlabel(f"held-out loss vs the reference (relative); dashed: +/- the margin {margin:.0%}")
    ax.set_title("Every role's downstream effect and the verdicts on the pre-registered claims")
    ax.invert_yaxis()
    save_png(fig, path)
    plt.close(fig)


def draw_all(summary: HarmSummary, study_dir: Path) -> None:
    calibration_figure(summary, study_dir / FILES[0])
    harm_figure(summary, study_dir / FILES[1])
    controls_figure(summary, study_dir / FILES[2])
