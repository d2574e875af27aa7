"""Report sections of a training study: Figs. 7-8 with their verdicts, the downstream effect, and the
runs themselves (loss curves side by side, each role's sample grid with its captions).

The tables are built here once and reused by scripts/study_table.py for README.md.
"""

from __future__ import annotations

from pathlib import Path

from numdev.analysis.study import analyse
from numdev.cli.commands import script, tensorboard
from numdev.figures import FIGURES
from numdev.report.html import LOSS_CURVES, SAMPLES, Section
from numdev.runs.atomic import read_json
from numdev.runs.layout import DOWNSTREAM, MULTIRUN, SUMMARY
from numdev.runs.layout import LOSS_CURVES as LOSS_CURVES_PNG
from numdev.runs.schemas import STUDY_SUMMARY
from numdev.stats.intervals import MIN_CI, Estimate
from numdev.stats.verdicts import FAILS, HOLDS, RANGE_NO_VERDICT, Verdict
from numdev.train.evaluation import CHANCE, agreement_text
from numdev.weights.metrics import LABELS

COMMAND = "experiment=flash_stability"


def _estimate(entry: dict | None, fmt: str = ".2e", unit: str = "") -> str:
    return Estimate(**entry).text(fmt, unit) if entry else "–"


def roles_table(summary: dict, metric: str | None = None) -> str:
    """Markdown: each role's distance to the reference (slope, final value) and its ratio to Flash."""
    metric = metric or summary["primary_metric"]
    under_test = summary["under_test"]
    head = (
        f"| role | kind | what differs from the reference | slope / step [interval] | at step {summary['steps']} [interval] "
        f"| slope ratio to {under_test} [interval] | ratio's interval |\n| --- | --- | --- | --- | --- | --- | --- |"
    )
    rows = []
    for role in summary["role_order"]:
        pair = summary["pairs"]["reference"].get(role)
        entry = pair.get(metric) if pair else None
        if not entry:
            continue
        ratio = summary["ratios"].get(f"{role}/{under_test}", {}).get(metric)
        verdict = Verdict(**ratio["verdict"]) if ratio else None
        rows.append(
            f"| {role} | {pair['kind']} | {pair['label']} | {_estimate(entry['slope'])} | {_estimate(entry['final'])} | "
            f"{_estimate(ratio['estimate'], '.2g', 'x') if ratio else '–'} | "
            f"{_side_of_one(verdict) if verdict else '–'} |"
        )
    return head + "\n" + "\n".join(rows)


def equivalent_table(summary: dict) -> str:
    """Markdown: every role's equivalent size on each ladder (numdev.analysis.early), and the floor."""
    from numdev.analysis.early import INIT_LADDER, NOISE_LADDER

    calib = summary.get("calibration") or {}
    if "equivalent" not in calib:
        return ""
    init, noise = calib["equivalent"].get(INIT_LADDER, {}), calib["equivalent"].get(NOISE_LADDER, {})
    control = calib["floor"]["control"]
    head = (f"| role | kind | what differs from the reference | D / D_{control} at step {calib['step']} | eps* (init-weight ladder) "
            f"| delta* (attention-output noise ladder) |\n| --- | --- | --- | --- | --- | --- |")
    rows = []
    for role in summary["role_order"]:
        if role not in init:
            continue
        meta = summary["roles"][role]
        to_control = init[role].get("ratio_to_control") or {}
        ratio = _estimate(to_control.get("estimate"), ".3g", "x") if to_control.get("estimate") else "–"
        rows.append(f"| {role} | {meta['kind']} | {meta['label']} | {ratio} | {init[role]['text']} | "
                    f"{noise[role]['text'] if role in noise else '–'} |")
    floor = calib["floor"]
    note = (f"\n\nResolution floor at step {calib['step']} ({calib['step_rule']}): {floor['text']}. Rule: {floor['rule']}. "
            f"Intervals: {summary['early']['interval_rule']}.")
    return head + "\n" + "\n".join(rows) + note


def early_table(summary: dict) -> str:
    """Markdown: ratios to the role under test at the early steps, first crossings, the shift."""
    early = summary.get("early") or {}
    if not early:
        return ""
    under_test = summary["under_test"]
    steps, thresholds = early["steps"], early["thresholds"]
    head = ("| role | " + " | ".join(f"D/D_{under_test} at {s}" for s in steps) + " | "
            + " | ".join(f"first step D ≥ {t:g}" for t in thresholds) + f" | shift vs {under_test} [window] |\n| --- |"
            + " --- |" * (len(steps) + len(thresholds) + 1))
    rows = []
    for role in summary["role_order"]:
        if role not in early["ratios"]:
            continue
        cells = [_estimate((early["ratios"][role].get(str(s)) or {}).get("estimate"), ".2g") for s in steps]
        for t in thresholds:
            entry = early["crossings"].get(role, {}).get(f"{t:g}", {})
            if "estimate" in entry:
                cells.append(_estimate(entry["estimate"], ".3g"))
            elif entry.get("at_start") and entry["at_start"] == entry.get("replicates"):
                cells.append("0 (starts above it)")
            else:
                cells.append(f"{entry.get('reached', 0)} of {entry.get('replicates', 0)} reach it")
        shift = early["shifts"].get(role, {})
        window = shift.get("window") or []
        span = f"steps {window[0]}-{window[-1]}" if window else "none"
        cells.append(f"{_estimate(shift['estimate'], '.2g', 'x')} [{span}]" if "estimate" in shift else f"– ({shift.get('problem', '')})")
        rows.append(f"| {role} | " + " | ".join(cells) + " |")
    return head + "\n" + "\n".join(rows) + f"\n\nWindow rule: {early['window_rule']}."


def _side_of_one(verdict: Verdict) -> str:
    """Where a ratio's interval lies (rule: numdev.analysis.study.ratio_of_growths)."""
    if verdict.status == HOLDS:
        return "above 1"
    if verdict.status == FAILS:
        return "below 1"
    if RANGE_NO_VERDICT in verdict.detail:
        return f"not measurable: a range from fewer than {MIN_CI} replicates"
    return "not measurable: " + ("a curve does not grow" if "does not grow" in verdict.detail else "contains 1 or one replicate")


def at_chance(outcome: str, mean: Estimate) -> bool:
    """An agreement score that cannot be told from a guess: its interval over replicates contains the
    chance level. (Without an interval, one replicate, nothing can be told: the value is shown as such.)"""
    chance = CHANCE[outcome.removesuffix("_accuracy")]
    return mean.has_interval and mean.low <= chance <= mean.high


def _agreement_cell(outcome: str, row: dict) -> str:
    """A caption-agreement score beside its chance level; at chance: no interval and no difference."""
    mean = Estimate(**row["mean"])
    if at_chance(outcome, mean):
        return f"at chance ({mean.value:.2f})"
    cell = mean.text(".2f")
    if "difference_to_reference" in row and mean.has_interval:
        cell += f" (Δ {_estimate(row['difference_to_reference'], '+.2f')})"
    return cell


def downstream_table(summary: dict) -> str:
    """Markdown: per role, each outcome's mean over replicates and its paired difference to the reference."""
    outcomes = [o for o in ("heldout_loss", "colour_accuracy", "shape_accuracy", "position_accuracy") if o in summary["downstream"]]
    if not outcomes:
        return ""
    head = "| role | " + " | ".join(
        f"{summary['downstream'][o]['label']} (Δ to reference)" if o == "heldout_loss"
        else f"{summary['downstream'][o]['label']} (chance {CHANCE[o.removesuffix('_accuracy')]:.2f})" for o in outcomes
    ) + " |\n| --- |" + " --- |" * len(outcomes)
    rows = []
    for role in summary["role_order"]:
        cells = []
        for outcome in outcomes:
            row = summary["downstream"][outcome]["roles"].get(role)
            if row is None:
                cells.append("–")
                continue
            fmt = ".4f" if outcome == "heldout_loss" else ".2f"
            if outcome != "heldout_loss":
                cells.append(_agreement_cell(outcome, row))
                continue
            cell = _estimate(row["mean"], fmt)
            if "difference_to_reference" in row:
                cell += f" (Δ {_estimate(row['difference_to_reference'], '+.2e' if outcome == 'heldout_loss' else '+' + fmt)})"
            cells.append(cell)
        rows.append(f"| {role} | " + " | ".join(cells) + " |")
    spreads = [
        f"{summary['downstream'][o]['label']} {summary['downstream'][o]['seed_spread']:.3g}"
        for o in outcomes if summary["downstream"][o].get("seed_spread") is not None
    ]
    note = f"\n\nSeed-to-seed spread (std of the reference over replicates): {', '.join(spreads)}." if spreads else ""
    note += ("\n\nCaption agreement beside chance (a guess: 1 of the dataset's colours, shapes, 3 x 3 positions); "
             "'at chance': the score's interval over replicates contains the chance level, so it is not told "
             "from guessing and no interval or difference is shown.")
    return head + "\n" + "\n".join(rows) + note


def study_sections(study_dir: Path) -> list[Section]:
    study_dir = Path(study_dir)
    path = study_dir / SUMMARY
    # Validated before use: a truncated or edited summary is one line naming the file and the field.
    summary = STUDY_SUMMARY.check(path, read_json(path, "study summary")) if path.is_file() else analyse(study_dir)
    overrides = _extra_overrides(study_dir)
    args = overrides if any(o.startswith("experiment=") for o in overrides) else [COMMAND, *overrides]
    command = " ".join([script("numdev-train"), *args])
    origin = summary.get("provenance")  # where the study ran (numdev.runs.provenance)
    replicates = len(summary["replicates"])
    setting = (
        f"{summary['under_test_backend']} vs {summary['reference_backend']}, {summary['precision']}, {summary['model']}, "
        f"{summary['steps']} steps, {replicates} replicate(s)" + (
            " (one replicate: no intervals, no verdicts)" if replicates < 2
            else f" (fewer than {MIN_CI}: each spread is the range of the {replicates}, labelled so, and carries no verdict)"
            if replicates < MIN_CI else "")
    )
    metric = summary["primary_metric"]
    fig7, fig8 = (Verdict(**summary["verdicts"][k]) for k in ("fig7", "fig8"))
    late = Verdict(**summary["verdicts"]["fig8_late"]) if "fig8_late" in summary["verdicts"] else None
    extra7 = [f"Measure: {summary['growth_measure']}"]
    if summary.get("missing"):  # numdev-study --partial
        extra7.append(f"Analysed without {len(summary['missing'])} job(s) of the study (numdev-study --partial): "
                      + ", ".join(summary["missing"]) + ".")
    shadow = summary.get("shadow")
    if shadow and "out" in shadow:
        line = f"Per call (the reference's attention computed beside every Flash call): output max |Δ| {shadow['out']['max_abs']:.2e} (in {shadow['out']['max_abs_layer']}), mean {shadow['out']['mean_abs']:.2e}"
        if "dq" in shadow:
            line += "; gradients max |Δ| " + ", ".join(f"{q} {shadow[q]['max_abs']:.2e}" for q in ("dq", "dk", "dv") if q in shadow)
        extra7.append(line + ".")
    files = [("the study", study_dir), ("summary.json", path)]
    title7, claim7 = FIGURES["fig7"].title, FIGURES["fig7"].claim
    title8, claim8 = FIGURES["fig8"].title, FIGURES["fig8"].claim
    paper_metric = summary["paper_metric"]
    equivalents, early_rows = equivalent_table(summary), early_table(summary)
    tables8 = ""
    if equivalents:
        tables8 += "Equivalent perturbation sizes (panel a: the ladder):\n\n" + equivalents + "\n\n"
    if early_rows:
        tables8 += "The early phase (panel b):\n\n" + early_rows + "\n\n"
    tables8 += "The late, shared regime (panel c; the paper's slope ratios):\n\n" + roles_table(summary)
    parts8 = {"early measures (the verdict)": fig8.as_dict()}
    extra8 = []
    if late is not None:
        parts8["late, shared regime (second panel)"] = late.as_dict()
        extra8.append(summary["captions"].get("fig8_late", ""))
    extra8.append(f"Distances: {LABELS.get(metric, metric)} (primary).")
    if paper_metric != metric:
        tables8 += f"\n\nThe same by the paper's metric, {LABELS.get(paper_metric, paper_metric)}:\n\n" + roles_table(summary, paper_metric)
    sections = [
        Section(
            title=title7, claim=claim7, measured=summary["captions"].get("fig7", "") + f" ({setting}).",
            figure=study_dir / "fig7.png", status=fig7.status, verdict=fig7.detail, rule=fig7.rule, extra=extra7, command=command,
            provenance=origin, files=files, tensorboard=tensorboard(study_dir),
        ),
        Section(
            title=title8, claim=claim8, measured=summary["captions"]["fig8"], figure=study_dir / "fig8.png",
            table_markdown=tables8, status=fig8.status, parts=parts8, rule=fig8.rule, extra=extra8, command=command,
            provenance=origin, files=files, tensorboard=tensorboard(study_dir),
        ),
    ]
    sections.append(Section(
        title="Downstream — does Flash change what the model does?",
        claim="Not measured in the paper: held-out diffusion loss and how well samples follow their captions, for every run; "
        "a sibling's difference to the reference beside the seed-to-seed spread.",
        measured=summary["captions"].get("downstream", "no held-out loss or caption scores in these runs"),
        figure=study_dir / DOWNSTREAM, table_markdown=downstream_table(summary), command=command,
        provenance=origin, files=files,
    ))
    if summary.get("optimizations"):  # experiment=optimizations (numdev.analysis.optimizations)
        sections.append(_optimizations_section(summary, setting, command, origin))
    samples = [
        (Path(s["path"]), f"{role} (replicate {s['replicate']}): samples at step {summary['steps']} with their captions"
         + (f"; they match them: {agreement_text(s['scores'])}" if s["scores"].get("scored") else ""))
        for role, s in ((r, summary["samples"][r]) for r in summary["role_order"] if r in summary.get("samples", {}))
    ]
    sections.append(Section(
        title="The runs — training loss",
        claim="What a reader of the paper cannot see: the runs behind the curves.",
        measured=f"Training loss of every run, one panel per role ({setting}).",
        figure=study_dir / LOSS_CURVES_PNG, command=command, provenance=origin, anchor=LOSS_CURVES,
        tensorboard=tensorboard(study_dir), files=files,
    ))
    sections.append(Section(
        title="The runs — samples with their captions",
        claim="What each run draws for the same captions at the end of training.",
        measured=f"Each role's final samples, captions above each sample ({setting}).",
        images=samples, command=command, provenance=origin, anchor=SAMPLES,
    ))
    return sections


def catalogue_sections(study_dir: Path) -> list[Section]:
    """An optimizations catalogue (experiment=optimizations) beside another study: its table only
    (its own Figs. 7-8, of the fp32 low-floor setting: numdev-report --study DIR)."""
    study_dir = Path(study_dir)
    path = study_dir / SUMMARY
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: give the multirun directory of a finished numdev-train "
                                "experiment=optimizations (analysed: numdev-study DIR --no-truth)")
    summary = STUDY_SUMMARY.check(path, read_json(path, "study summary"))
    if not summary.get("optimizations"):
        raise ValueError(f"{path}: no optimizations table: not a summary of experiment=optimizations "
                         f"(give it as --study, or rerun numdev-study {study_dir})")
    overrides = _extra_overrides(study_dir)
    args = overrides if any(o.startswith("experiment=") for o in overrides) else ["experiment=optimizations", *overrides]
    setting = (f"{summary['precision']} reference, {summary['model']}, {summary['steps']} steps, "
               f"{len(summary['replicates'])} replicate(s)")
    section = _optimizations_section(summary, setting, " ".join([script("numdev-train"), *args]), summary.get("provenance"))
    section.files = [("the catalogue", study_dir), ("summary.json", path)]
    section.extra.append(f"The catalogue's own Figs. 7-8 and runs: {script('numdev-report')} --study {study_dir}")
    return [section]


def _optimizations_section(summary: dict, setting: str, command: str, origin: dict | None) -> Section:
    table = summary["optimizations"]
    return Section(
        title="Optimizations — how far each moves the weights, next to what it costs",
        claim="Not in the paper, which closes by asking how other optimizations compare: each optimization as a role "
        "against its own baseline with the same seeds.",
        measured=f"Per optimization: one call against FP64 (phase 1), the equivalent initial-weight perturbation eps* "
        f"(phase 2), the step-time ratio to its baseline measured in the same study and the held-out loss change "
        f"against another data order's ({setting}).",
        table_markdown=table["markdown"], extra=[f"Rule ({k}): {v}." for k, v in table["rules"].items()],
        command=command, provenance=origin, anchor="optimizations",
    )


def _extra_overrides(study_dir: Path) -> list[str]:
    import yaml

    path = study_dir / MULTIRUN
    if not path.is_file():
        return []
    task = yaml.safe_load(path.read_text(encoding="utf-8")).get("hydra", {}).get("overrides", {}).get("task", [])
    return [o for o in task if not o.startswith("hydra.sweep.dir=")]
