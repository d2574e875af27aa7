"""The study's analysis: Figs. 7 and 8, the controls, replicates with intervals, the downstream effect.

A study directory holds the runs of `numdev-train experiment=flash_stability`, one directory per
replicate and role (the roles and what each changes: conf/train/study/, the only place they are
defined; each run's config.yaml carries its `study` block: role, kind, label, replicate):

    r<replicate>/<role>/     e.g. r0/truth, r0/reference, r0/flash, r0/data, r0/noise, r0/ulp, r0/init, r0/fp32

Every role is compared with its replicate's `reference` run (kind reference) and with its
`truth` run (kind truth), snapshot by snapshot. A curve comes from the run's live sibling CSV
(numdev.train.callbacks.sibling) when it covers every snapshot step, else from the snapshots
(numdev.analysis.compare). The growth of each curve and the ratios between roles are computed per
replicate and summarised over replicates with 95% bootstrap intervals (numdev.stats.intervals); verdicts
follow stated rules (numdev.stats.verdicts). The downstream effect compares the runs' held-out loss and
caption agreement.

    numdev-study STUDY_DIR        (re)analyse a finished study; also run at the end of the multirun
"""

from __future__ import annotations

import argparse
import copy
import logging
import re
from pathlib import Path

import numpy as np

from numdev.analysis import consistency, early
from numdev.analysis.study_runs import (
    REFERENCE,
    UNDER_TEST,
    discover,
    first_run,
    kind_of,
    missing_jobs,
    model_curves,
    pair_rows,
    read_json,
    role_of_kind,
    study_curves,
)
from numdev.cli import logs, script_entry
from numdev.cli.errors import fail, interrupted
from numdev.runs.atomic import WriteError, write_json
from numdev.runs.layout import (
    EVAL,
    HELDOUT,
    SAMPLES,
    SUMMARY,
    RunDir,
)
from numdev.runs.provenance import provenance
from numdev.stats import intervals as stats
from numdev.stats import verdicts
from numdev.stats.growth import GROWTH_MEASURE, fit_growth
from numdev.weights.metrics import EARLY_METRIC, LABELS, PAPER_METRIC, PREFERENCE

log = logging.getLogger(__name__)

DOWNSTREAM = {  # per-run outcome -> (file, key, label)
    "heldout_loss": (HELDOUT, "heldout_loss", "held-out loss"),
    "colour_accuracy": (EVAL, "colour_accuracy", "colour agreement"),
    "shape_accuracy": (EVAL, "shape_accuracy", "shape agreement"),
    "position_accuracy": (EVAL, "position_accuracy", "position agreement"),
}
# The paper's Fig. 8 names two proxies: the roles that play them say so (study.paper: init |
# low_precision in conf/train/study/init.yaml, fp32.yaml, bf16.yaml); these names are the fallback for
# studies whose roles predate the key.
PAPER_INIT, PAPER_LOW_PRECISION = "init", "fp32"


def paper_roles(summary: dict) -> tuple[str, str]:
    """(init proxy, low-precision proxy) role names of a summary."""
    roles = summary.get("paper_roles") or {}
    return roles.get("init", PAPER_INIT), roles.get("low_precision", PAPER_LOW_PRECISION)
PAPER_LOW_PRECISION_RANGE = (2.0, 5.0)


# ----------------------------------------------------------------------------- curves


# ----------------------------------------------------------------------------- statistics


def _replicates_of(by_rep: dict) -> list[int]:
    return sorted(by_rep)


def growth_of(curves_by_rep: dict[int, tuple], metric: str) -> dict:
    """Per-replicate fits of one role's curve and their summary over replicates."""
    fits, finals, steps = {}, {}, None
    for replicate, (rep_steps, values) in sorted(curves_by_rep.items()):
        if metric not in values:
            continue
        fits[replicate] = fit_growth(rep_steps, values[metric])
        finals[replicate] = values[metric][-1]
        steps = rep_steps
    if not fits:
        return {}
    slope = stats.mean_interval([f["slope"] for f in fits.values()])
    final = stats.mean_interval(list(finals.values()))
    grows = grows_verdict(slope)
    return {
        "steps": steps,
        "replicates": sorted(fits),
        "per_replicate": {str(r): {"slope": f["slope"], "r2": f["r2"], "final": finals[r]} for r, f in fits.items()},
        "values": {str(r): curves_by_rep[r][1][metric] for r in fits},
        "slope": slope.as_dict(),
        "final": final.as_dict(),
        "grows": grows.as_dict(),
    }


def grows_verdict(slope: stats.Estimate) -> verdicts.Verdict:
    """A curve grows when its mean slope's interval lies above 0 (from fewer than 5 replicates: a range, no verdict)."""
    return verdicts.ratio_verdict(slope, "above", 0.0, what="the slope")


def _flat(growth: dict) -> bool:
    """A curve not shown to grow: its growth is not 'holds', and not only because its slope's spread
    is a range (fewer than 5 replicates), which shows nothing either way."""
    if growth["grows"]["status"] == verdicts.HOLDS:
        return False
    slope = stats.Estimate(**growth["slope"]) if growth.get("slope") else None
    return not (slope is not None and slope.has_interval and slope.method == stats.RANGE)


def ratio_of_growths(numerator: dict, denominator: dict, what: str) -> dict:
    """slope ratio numerator/denominator over the replicates both have, paired, with its verdict.

    Rule: a ratio of growth rates means something only when both curves grow (each mean slope's
    interval lies above 0); otherwise it is "not measurable", whatever its point value.
    Then: holds ("above 1") / fails ("below 1") when its interval excludes 1, else not measurable;
    from fewer than 5 replicates its spread is a range and it carries no verdict.
    """
    common = sorted(set(numerator["replicates"]) & set(denominator["replicates"]))
    if not common:
        return {}
    top = [numerator["per_replicate"][str(r)]["slope"] for r in common]
    bottom = [denominator["per_replicate"][str(r)]["slope"] for r in common]
    estimate = stats.ratio_interval(top, bottom)
    flat = [name for name, part in (("numerator", numerator), ("denominator", denominator)) if _flat(part)]
    if len(common) < 2:
        verdict = verdicts.ratio_verdict(estimate, "above", 1.0, what=what)  # one replicate: no interval, not measurable
    elif flat:
        verdict = verdicts.Verdict(
            verdicts.NOT_MEASURABLE,
            "a ratio of growth rates needs both curves to grow (slope interval above 0), then its interval must exclude 1",
            f"{what} = {estimate.value:.3g}: the {' and the '.join(flat)} curve does not grow (its slope's interval is not above 0)",
        )
    else:
        verdict = verdicts.ratio_verdict(estimate, "above", 1.0, what=what)
    # Whether its 95% interval excludes 1 (a range from fewer than 5 replicates is no interval: False).
    excludes = verdicts.judgeable(estimate) and estimate.excludes(1.0)
    return {"estimate": estimate.as_dict(), "excludes_one": excludes, "verdict": verdict.as_dict()}


def downstream(runs: dict) -> dict:
    """Per role and outcome: the mean over replicates, and the paired difference to the reference."""
    reference = role_of_kind(runs, REFERENCE)
    values: dict[str, dict[str, dict[int, float]]] = {}
    for role, by_rep in runs.items():
        for replicate, run in by_rep.items():
            for outcome, (file, key, _) in DOWNSTREAM.items():
                data = read_json(run["dir"] / file, outcome, required=False)
                if data is not None and data.get(key) is not None:
                    values.setdefault(outcome, {}).setdefault(role, {})[replicate] = float(data[key])
    out = {}
    for outcome, by_role in values.items():
        ref = by_role.get(reference, {})
        spread = float(np.std(list(ref.values()), ddof=1)) if len(ref) >= 2 else None
        entry = {"label": DOWNSTREAM[outcome][2], "seed_spread": spread, "roles": {}}
        for role, by_rep in by_role.items():
            row = {"per_replicate": {str(r): v for r, v in sorted(by_rep.items())}, "mean": stats.mean_interval(list(by_rep.values())).as_dict()}
            common = sorted(set(by_rep) & set(ref))
            if role != reference and common:
                diffs = [by_rep[r] - ref[r] for r in common]
                row["difference_to_reference"] = stats.mean_interval(diffs).as_dict()
                row["mean_abs_difference"] = float(np.mean(np.abs(diffs)))
            entry["roles"][role] = row
        out[outcome] = entry
    return out


# ----------------------------------------------------------------------------- the analysis


def analyse(study_dir: str | Path, log=print, against_truth: bool = True, partial: bool = False) -> dict:
    """Fit, judge, draw and summarise a study: summary.json and the figures, in the study directory.

    against_truth=False compares only the reference with the truth run (the early study: the ladder's
    many runs are read against the reference alone; every other truth pair would be computed offline)."""
    from numdev.analysis.harm import study as harm  # experiment=harm: its own analysis (the runs say so)

    if harm.is_harm_study(discover(Path(study_dir))):
        return harm.analyse(study_dir, log=log, partial=partial).to_json()
    study_dir = Path(study_dir)
    runs = discover(study_dir)
    consistency.check(runs)  # the runs trained one workload, each in its place (a role copied in, an edited rung: one line)
    missing = missing_jobs(study_dir, runs)
    if missing and not partial:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise FileNotFoundError(
            f"{study_dir}: {len(missing)} job(s) of the study have no run: {shown}; rerun the study's command with "
            f"hydra.sweep.dir={study_dir} resume=auto to finish them (finished runs are left as they are), or analyse "
            "what is there with numdev-study DIR --partial (the summary then lists them)")
    if missing:
        log(f"warning: analysing {study_dir} without {len(missing)} job(s): {', '.join(missing)}")
    curves = study_curves(study_dir, runs, log, against_truth)
    reference, under_test = role_of_kind(runs, REFERENCE), role_of_kind(runs, UNDER_TEST)
    metrics = _metrics_present(curves)
    primary = metrics[0]
    paper_metric = next((m for m in PAPER_METRIC if m in metrics), primary)
    pairs = {
        against: {
            role: {"label": first_run(runs[role])["label"], "kind": kind_of(runs[role]), **{m: growth_of(by_rep, m) for m in metrics}}
            for role, by_rep in by_role.items()
        }
        for against, by_role in curves.items()
    }
    ratios = {}
    if under_test is not None and under_test in pairs["reference"]:
        flash = pairs["reference"][under_test]
        for role, pair in pairs["reference"].items():
            if role == under_test:
                continue
            ratios[f"{role}/{under_test}"] = {
                m: ratio_of_growths(pair[m], flash[m], f"{role}/{under_test} slope ratio") for m in metrics if pair[m] and flash[m]
            }
    reference_run = first_run(runs[reference])["record"]
    roles_info = {role: {"ladder": first_run(by_rep)["ladder"]} for role, by_rep in runs.items()}
    summary = {
        "study": str(study_dir),
        "provenance": provenance(seeds=sorted({r for by_rep in runs.values() for r in by_rep}), threads=reference_run.get("threads")),
        "precision": reference_run.get("precision"),
        "under_test": under_test,
        "under_test_backend": first_run(runs[under_test])["record"].get("backend") if under_test else None,
        "reference_backend": reference_run.get("backend"),
        "model": reference_run.get("model"),
        "parameters": _parameters(first_run(runs[reference])["dir"]),
        "steps": reference_run.get("final_step"),
        "replicates": sorted({r for by_rep in runs.values() for r in by_rep}),
        "missing": missing,  # jobs of the sweep without a run (numdev-study --partial)
        "role_order": list(runs),
        "paper_roles": {first_run(by_rep)["paper"]: role for role, by_rep in runs.items() if first_run(by_rep)["paper"]},  # truth, reference, under test, controls, proxies (JSON objects are written sorted)
        "roles": {
            role: {"kind": kind_of(by_rep), "label": first_run(by_rep)["label"], "replicates": _replicates_of(by_rep),
                   "ladder": first_run(by_rep)["ladder"],
                   "backend": first_run(by_rep)["record"].get("backend"), "precision": first_run(by_rep)["record"].get("precision")}
            for role, by_rep in runs.items()
        },
        "metrics": metrics,
        "primary_metric": primary,
        "paper_metric": paper_metric,
        "growth_measure": GROWTH_MEASURE,
        "interval_rule": stats.RULE,
        "pairs": pairs,
        "ratios": ratios,  # the late, shared regime: OLS slopes over the whole run
        "early": early_summary(curves["reference"], under_test),
        "calibration": early.calibration(curves["reference"], roles_info, under_test) if EARLY_METRIC in metrics else {},
        "downstream": downstream(runs),
        "shadow": _shadow_summary(RunDir(first_run(runs[under_test])["dir"])) if under_test else None,
        "loss_curves": {role: {str(r): loss_curve(run["dir"]) for r, run in by_rep.items()} for role, by_rep in runs.items()},
        "samples": {role: _samples(first_run(by_rep)) for role, by_rep in runs.items() if (first_run(by_rep)["dir"] / SAMPLES).is_file()},
    }
    if any(kind_of(by_rep) == "optimization" for by_rep in runs.values()):  # experiment=optimizations: the table
        from numdev.analysis import optimizations

        summary["optimizations"] = optimizations.table(
            runs, curves["reference"], summary["calibration"],
            lambda run, baseline, label: model_curves(pair_rows(run, baseline, label, log)), log, summary["downstream"])
    summary["headline"] = headline(summary)
    summary["verdicts"] = claim_verdicts(summary, curves["reference"])
    summary["captions"] = captions(summary)
    from numdev.figures import study as study_figures

    drawn = study_figures.draw_all(summary, study_dir, early.INIT_LADDER)
    write_json(study_dir / SUMMARY, summary)
    for caption in summary["captions"].values():
        log(caption)
    log(f"-> {', '.join([str(study_dir / SUMMARY), *drawn])}")
    return summary


def early_summary(curves: dict, under_test: str | None) -> dict:
    """The early-phase measures (numdev.analysis.early) of every role against the role under test."""
    if under_test is None or under_test not in curves:
        return {}
    if not any(EARLY_METRIC in v for by_rep in curves.values() for _, v in by_rep.values()):
        return {}
    return {
        "metric": EARLY_METRIC, "steps": list(early.EARLY_STEPS), "thresholds": list(early.THRESHOLDS),
        "interval_rule": stats.LOG_RULE, "window_rule": early.WINDOW_RULE,
        "ratios": early.early_ratios(curves, under_test), "crossings": early.crossings(curves),
        "shifts": early.shifts(curves, under_test),
    }


def headline(summary: dict) -> dict:
    """The study's one answer: the equivalent perturbation size of the role under test and of the
    low-precision proxy, their ratio, and the resolution floor they are read against."""
    calib, under_test = summary.get("calibration") or {}, summary["under_test"]
    if "equivalent" not in calib:
        return {"text": f"no equivalent sizes: {calib.get('problem', 'no calibration ladder in this study')}"}
    _, low = paper_roles(summary)
    init = calib["equivalent"].get(early.INIT_LADDER, {})
    sizes = {role: init[role]["text"] for role in (under_test, low) if role in init}
    ratio = early.equivalent_ratio(calib, low, under_test)
    floor = calib["floor"]
    label = summary.get("roles", {}).get(low, {}).get("label", "low precision vs fp32 training")
    text = (
        f"at step {calib['step']}: {under_test} moves the weights as much as perturbing the initial weights by eps* = "
        f"{sizes.get(under_test, 'n/a')}; {low} ({label}) by eps* = "
        f"{sizes.get(low, 'n/a')}; {ratio['text']}; resolution floor {floor['text']}"
    )
    return {"step": calib["step"], "equivalent": sizes, "low_precision_role": low, "ratio": ratio, "floor": floor.get("floor"), "text": text}


def claim_verdicts(summary: dict, curves: dict | None = None) -> dict:
    """Fig. 7 and Fig. 8, part by part, by the rules of numdev.stats.verdicts.

    Fig. 7 on the primary metric ("only grows": one Kendall's tau per replicate, tested over
    replicates: the points of one replicate's cumulative curve are serially dependent). Fig. 8 on the early
    measures (equivalent sizes, numdev.analysis.early); the paper's slope ratios (the late, shared
    regime) are judged as before in `fig8_late`.
    """
    metric, under_test = summary["primary_metric"], summary["under_test"]
    flash = (summary["pairs"]["reference"].get(under_test) or {}).get(metric) if under_test else None
    out = {"metric": metric}
    if not flash:
        none = verdicts.Verdict(verdicts.NOT_MEASURABLE, "needs the role under test", "no run of kind under_test")
        return {**out, "fig7": none.as_dict(), "fig8": none.as_dict(), "fig8_late": none.as_dict()}
    fig7 = verdicts.combine({
        "drifts apart": verdicts.Verdict(**flash["grows"]),
        "only grows": verdicts.monotone_verdict(flash["steps"], flash["values"], "increasing", what=f"Flash vs Baseline {metric}"),
    })
    init_role, low = paper_roles(summary)
    init_saturated = None
    if curves is not None and init_role in curves and EARLY_METRIC in metric_set(curves[init_role]):
        init_saturated = early.saturation_verdict(curves[init_role], f"{init_role} vs the reference")
    early_parts = {}
    if init_saturated is not None:
        early_parts["below another initialisation"] = init_saturated
    calib = summary.get("calibration") or {}
    if "equivalent" in calib:
        ratio = early.equivalent_ratio(calib, low, under_test)
        what = f"eps*({low}) / eps*({under_test})"
        rule = f"{what}'s 95% interval over replicates lies within [{PAPER_LOW_PRECISION_RANGE[0]:g}, {PAPER_LOW_PRECISION_RANGE[1]:g}]"
        early_parts["2-5x below low precision"] = (
            verdicts.range_verdict(stats.Estimate(**ratio["estimate"]), *PAPER_LOW_PRECISION_RANGE, what=what)
            if ratio["status"] == "measured" else verdicts.Verdict(verdicts.NOT_MEASURABLE, rule, ratio["text"])
        )
    late = _late_fig8(summary, metric, under_test, init_saturated)
    fig8 = verdicts.combine(early_parts) if early_parts else verdicts.Verdict(
        verdicts.NOT_MEASURABLE, "needs the calibration ladder (experiment=flash_stability_early)", "no equivalent sizes in this study")
    return {**out, "fig7": fig7.as_dict(), "fig8": fig8.as_dict(), "fig8_late": late.as_dict()}


def rejudge(summary: dict) -> dict:
    """The summary with its verdicts made again, by the rules as they are now, from the numbers it
    keeps: each curve's growth (its per-replicate slopes' mean and spread), each slope ratio (from
    the per-replicate slopes, paired), Figs. 7 and 8 (the curves' values, the equivalent sizes) and
    the captions that quote them. Every number stays as it was. For a summary whose runs are not at
    hand (docs/results/*_summary.json); numdev-study makes the same verdicts from the runs."""
    out = copy.deepcopy(summary)
    for by_role in out["pairs"].values():
        for pair in by_role.values():
            for metric in out["metrics"]:
                if pair.get(metric):
                    pair[metric]["grows"] = grows_verdict(stats.Estimate(**pair[metric]["slope"])).as_dict()
    under_test = out["under_test"]
    for key, by_metric in out["ratios"].items():
        role = key.removesuffix(f"/{under_test}")
        for metric, entry in by_metric.items():
            if entry:
                by_metric[metric] = ratio_of_growths(out["pairs"]["reference"][role][metric],
                                                     out["pairs"]["reference"][under_test][metric], f"{key} slope ratio")
    curves = {}  # role -> replicate -> (steps, metric -> values) against the reference, as analyse reads them
    for role, pair in out["pairs"]["reference"].items():
        present = [m for m in out["metrics"] if pair.get(m)]
        if present:
            steps, replicates = pair[present[0]]["steps"], pair[present[0]]["values"]
            curves[role] = {int(r): (steps, {m: pair[m]["values"][r] for m in present if r in pair[m]["values"]}) for r in replicates}
    out["verdicts"] = claim_verdicts(out, curves)
    out["captions"] = captions(out)
    return out


def metric_set(by_rep: dict) -> set:
    return {m for _, values in by_rep.values() for m in values}


def _late_fig8(summary: dict, metric: str, under_test: str, init_saturated) -> verdicts.Verdict:
    """The paper's Fig. 8 on OLS slopes over the whole run: the late regime every same-start role shares."""
    parts = {}
    init_role, low = paper_roles(summary)
    init = summary["ratios"].get(f"{init_role}/{under_test}", {}).get(metric)
    lowp = summary["ratios"].get(f"{low}/{under_test}", {}).get(metric)
    if init_saturated is not None:
        parts["below another initialisation"] = init_saturated
    elif init:
        parts["below another initialisation"] = verdicts.Verdict(**init["verdict"])
    if lowp:
        if lowp["verdict"]["status"] == verdicts.NOT_MEASURABLE and "does not grow" in lowp["verdict"]["detail"]:
            parts["2-5x below low precision"] = verdicts.Verdict(**lowp["verdict"])
        else:
            parts["2-5x below low precision"] = verdicts.range_verdict(
                stats.Estimate(**lowp["estimate"]), *PAPER_LOW_PRECISION_RANGE, what=f"{low}/{under_test} slope ratio"
            )
    return verdicts.combine(parts) if parts else verdicts.Verdict(verdicts.NOT_MEASURABLE, "needs the init and fp32 roles", "")


def captions(summary: dict) -> dict:
    metric, under_test = summary["primary_metric"], summary["under_test"]
    label = LABELS.get(metric, metric)
    replicates = len(summary["replicates"])
    lines = {}
    flash = (summary["pairs"]["reference"].get(under_test) or {}).get(metric) if under_test else None
    if flash:
        lines["fig7"] = (
            f"Flash vs Baseline, {label}, {replicates} replicate(s): slope {stats.Estimate(**flash['slope']).text('.2e')}/step, "
            f"at step {flash['steps'][-1]} {stats.Estimate(**flash['final']).text('.2e')}. "
            f"Verdict: {verdicts.Verdict(**summary['verdicts']['fig7']).text()}"
        )
    # In the study's role order (summary.json is written with sorted keys; a summary read back gives the same lines).
    order = {role: i for i, role in enumerate(summary.get("role_order") or [])}
    ranked = lambda items, role_of: sorted(items, key=lambda item: order.get(role_of(item[0]), len(order)))  # noqa: E731
    parts = []
    for key, ratio in ranked(summary["ratios"].items(), lambda key: key.removesuffix(f"/{under_test}")):
        entry = ratio.get(metric)
        if entry:
            parts.append(f"{key} {stats.Estimate(**entry['estimate']).text('.2g', 'x')}{' (excludes 1)' if entry['excludes_one'] else ''}")
    lines["fig8_late"] = (
        f"Growth-rate ratios, the late shared regime ({label}, OLS slope per step over the whole run, {replicates} replicate(s)): "
        + "; ".join(parts) + f". Verdict: {verdicts.Verdict(**summary['verdicts']['fig8_late']).text()}"
    )
    lines["fig8"] = (
        f"Early phase, equivalent perturbation sizes ({replicates} replicate(s)): {summary['headline']['text']}. "
        f"Verdict: {verdicts.Verdict(**summary['verdicts']['fig8']).text()}"
    )
    parts = []
    for outcome in ("heldout_loss", "colour_accuracy", "shape_accuracy", "position_accuracy"):
        entry = summary["downstream"].get(outcome)
        if not entry:
            continue
        # How far each sibling moves the outcome from its reference, beside the seed-to-seed spread.
        moves = [
            f"{role} {stats.Estimate(**row['difference_to_reference']).text('+.2g')}"
            for role, row in ranked(entry["roles"].items(), str) if "difference_to_reference" in row
        ]
        spread = entry.get("seed_spread")
        parts.append(
            f"{entry['label']} Δ to the reference: " + ", ".join(moves)
            + (f" (seed-to-seed spread: std {spread:.2g})" if spread is not None else " (one replicate: no spread)")
        )
    if parts:
        lines["downstream"] = "Downstream, each role minus its replicate's reference (mean [interval: 95% from 5 replicates, else the range of n]): " + "; ".join(parts)
    return {key: _no_interval_once(line) for key, line in lines.items()}


NO_INTERVAL = re.compile(r" \[n/a: (\d+) seed\(s\)\]")


def _no_interval_once(line: str) -> str:
    """A line whose numbers have no interval (fewer seeds than an interval needs, numdev.stats.intervals) says so
    once, at its end, instead of "[n/a: 1 seed(s)]" after every number."""
    counts = sorted({int(n) for n in NO_INTERVAL.findall(line)})
    if not counts:
        return line
    seeds = "/".join(str(n) for n in counts)
    return f"{NO_INTERVAL.sub('', line)} [no intervals: {seeds} seed(s), fewer than an interval needs]"


def _metrics_present(curves: dict) -> list[str]:
    for by_role in curves.values():
        for by_rep in by_role.values():
            for _, values in by_rep.values():
                if values:
                    return [m for m in PREFERENCE if m in values]
    raise ValueError("the study has no weight-distance curves: no role besides the reference and truth")


def _parameters(run_dir: Path) -> int:
    from numdev.weights.store import load_snapshot

    return int(sum(t.numel() for t in load_snapshot(run_dir, 0).values()))


def _samples(run: dict) -> dict:
    scores = run["record"].get("eval") or {}
    return {"path": str(run["dir"] / SAMPLES), "replicate": run["replicate"], "scores": scores}


def loss_curve(run_dir: Path) -> dict | None:
    """The training loss from the run's TensorBoard events: in the run directory (a study), a
    directory of its own below it (numdev.train.tensorboard) or tensorboard/ (older runs); its tag
    is loss/train (train/loss in older runs)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # Its directory watcher logs "No path found after <event file>" (INFO) at the end of every file it reads.
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    where = RunDir(run_dir).events()
    if where is None:
        return None
    events = EventAccumulator(str(where), size_guidance={"scalars": 0})
    events.Reload()
    for tag in ("loss/train", "train/loss"):
        if tag in events.Tags().get("scalars", []):
            points = events.Scalars(tag)
            return {"steps": [p.step for p in points], "loss": [p.value for p in points]}
    return None


def _shadow_summary(run: RunDir) -> dict | None:
    if not run.shadow_csv.is_file():
        return None
    rows = run.read_shadow()
    out = {}
    for quantity in ("out", "dq", "dk", "dv"):
        chosen = [r for r in rows if r["quantity"] == quantity]
        if chosen:
            worst = max(chosen, key=lambda r: r["max_abs"])
            relative = [r["max_abs"] / r["ref_max_abs"] for r in chosen if r["ref_max_abs"] > 0]
            out[quantity] = {
                "max_abs": worst["max_abs"], "max_abs_layer": worst["layer"], "max_abs_step": worst["step"],
                "mean_abs": sum(r["mean_abs"] for r in chosen) / len(chosen),
                "relative_max": max(relative) if relative else None, "calls": len(chosen),
            }
    return out


def log_step(message: str) -> None:
    """The analysis's progress lines: per-run steps in the log (and on the console with -v), the rest shown."""
    if message.startswith("[study]"):
        log.debug(message)
    elif message.startswith("warning"):
        log.warning(message)
    else:
        log.info(message)


def main(argv: list[str] | None = None) -> None:
    script_entry.loaded()  # the imports are done: from here Ctrl-C is KeyboardInterrupt, caught below
    parser = argparse.ArgumentParser(prog="numdev-study", description="(Re)analyse a finished flash-stability study: summary.json and its figures")
    parser.add_argument("study_dir", help="the multirun directory of numdev-train experiment=flash_stability")
    parser.add_argument("--no-truth", action="store_true", help="compare only the reference with the truth run (as experiment=flash_stability_early does)")
    parser.add_argument("--partial", action="store_true", help="analyse a study some of whose jobs have no run (the summary lists them)")
    parser.add_argument("--keep-snapshots", choices=("all", "ends"), default="all",
                        help="ends: after the analysis, keep each run's first and last snapshot only (the distances are in "
                             "sibling/*.csv; a re-analysis gives the same summary): most of a study's disk")
    parser.add_argument("-v", "--verbose", action="store_true", help="also show each run's progress and the libraries' messages")
    args = parser.parse_args(argv)
    logs.console(args.verbose)
    try:
        if args.keep_snapshots == "ends":
            from numdev.analysis.study_runs import prunable, prune_study

            prunable(Path(args.study_dir))  # before the analysis: a study that needs its snapshots is refused at once
        analyse(args.study_dir, log=log_step, against_truth=not args.no_truth, partial=args.partial)
        if args.keep_snapshots == "ends":
            prune_study(Path(args.study_dir), log_step)
    except (FileNotFoundError, ValueError, WriteError) as error:
        fail("numdev-study", error)
    except KeyboardInterrupt:
        interrupted("numdev-study")


if __name__ == "__main__":
    main()
