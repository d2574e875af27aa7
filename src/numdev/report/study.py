"""Report sections of a training study (Figs. 7-8): the paper's claims beside the measured curves."""

from __future__ import annotations

import json
from pathlib import Path

from numdev.analysis.study import SUMMARY, analyse
from numdev.commands import script
from numdev.report.claims import STUDY_CLAIMS
from numdev.report.html import Section


def study_sections(study_dir: Path) -> list[Section]:
    study_dir = Path(study_dir)
    path = study_dir / SUMMARY
    summary = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else analyse(study_dir)
    config = study_dir / "flash" / "config.yaml"
    command = " ".join([script("numdev-train"), "experiment=flash_stability", *_extra_overrides(study_dir)])
    common = {
        "command": command.strip(),
        "config": config.read_text(encoding="utf-8") if config.is_file() else "",
    }
    precision = summary["pair_precision"]
    lowp = summary["ratios"]["low_precision/flash"]["wasserstein"]
    init = summary["ratios"]["init/flash"]["wasserstein"]
    pairs = summary["pairs"]
    table = "| pair | W1 at the end | W1 slope / step | R² | max abs at the end |\n| --- | --- | --- | --- | --- |\n" + "\n".join(
        f"| {p['label']} | {p['wasserstein'][-1]:.3e} | {p['wasserstein_fit']['slope']:.3e} | "
        f"{p['wasserstein_fit']['r2']:.2f} | {p['max_abs'][-1]:.3e} |"
        for p in pairs.values()
    )
    extra_fig7 = []
    shadow = summary.get("shadow")
    if shadow and "out" in shadow:
        line = (
            f"Per call (Baseline computed beside every Flash call, every 25th step): output max |Δ| "
            f"{shadow['out']['max_abs']:.2e} (in {shadow['out']['max_abs_layer']}), mean {shadow['out']['mean_abs']:.2e}"
        )
        if "dq" in shadow:
            line += "; gradients max |Δ| " + ", ".join(f"{q} {shadow[q]['max_abs']:.2e}" for q in ("dq", "dk", "dv") if q in shadow)
        extra_fig7.append(line + ".")
    samples = summary.get("samples") or {}
    scored = {role: s for role, s in samples.items() if s and s.get("scored")}
    if scored:
        extra_fig7.append(
            "Samples at the end (colour / position match their captions): "
            + "; ".join(f"{role} {s['colour_accuracy']:.0%} / {s['position_accuracy']:.0%}" for role, s in scored.items())
        )
    title7, claim7 = STUDY_CLAIMS["fig7"]
    title8, claim8 = STUDY_CLAIMS["fig8"]
    lowp_text = "undefined" if lowp is None else f"{lowp:.1f}x"
    init_text = "undefined" if init is None else f"{init:.1f}x"
    return [
        Section(
            title=title7,
            claim=claim7,
            measured=summary["caption_fig7"] + f" ({summary['flash_backend']} vs {summary['reference_backend']}, {precision}, {summary['model']}).",
            figure=study_dir / "fig7.png",
            holds=summary["fig7_gap_grows"],
            verdict="the gap grows here" if summary["fig7_gap_grows"] else "the gap does not grow here",
            extra=extra_fig7,
            **common,
        ),
        Section(
            title=title8,
            claim=claim8,
            measured=summary["caption_fig8"] + f". Fit: {summary['fit_method']}",
            figure=study_dir / "fig8.png",
            table_markdown=table,
            holds=bool(lowp is not None and lowp > 1.0),
            verdict=(
                f"low precision/Flash = {lowp_text} (paper 2-5x), init/Flash = {init_text}"
                if lowp is not None else "Flash's curve does not grow: no ratio"
            ),
            **common,
        ),
    ]


def _extra_overrides(study_dir: Path) -> list[str]:
    import yaml

    path = study_dir / "multirun.yaml"
    if not path.is_file():
        return []
    task = yaml.safe_load(path.read_text(encoding="utf-8")).get("hydra", {}).get("overrides", {}).get("task", [])
    return [o for o in task if not o.startswith(("experiment=", "hydra.sweep.dir="))]
