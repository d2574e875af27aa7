"""The harm study's analysis (experiment=harm): from the runs to summary.json, its figures and its answer.

    numdev-study outputs/train/harm/multirun_<time>     (also run when the study's sweep ends)

In order: the runs (numdev.analysis.study_runs) checked against each other (consistency); every
role's distance to the reference at every snapshot step; the calibration over steps (delta* on the
attention-noise ladder, eps* on the init ladder where the study has one: calibration); each run's
outcomes (outcomes) and each role's effects against the reference, paired and against independent
seeds, with the verdicts on the pre-registered claims (effects); function-level agreement with the
reference (churn, prediction disagreement, loss barrier: numdev.analysis.function_level); the harm
threshold and every role's margin to it (threshold); the headline, gated by the claims, and the
table of every measure (headline). The result is a HarmSummary (numdev.runs.harm_summary), written as
summary.json beside the figures (numdev.figures.harm).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from numdev.analysis import function_level
from numdev.analysis.harm import calibration, consistency, effects, headline, threshold
from numdev.analysis.harm.outcomes import OUTCOMES, run_outcomes
from numdev.analysis.study_runs import (
    REFERENCE,
    UNDER_TEST,
    discover,
    first_run,
    kind_of,
    missing_jobs,
    role_of_kind,
    study_curves,
)
from numdev.runs.atomic import write_json
from numdev.runs.harm_summary import HarmSummary, RoleSummary
from numdev.runs.layout import SUMMARY
from numdev.runs.provenance import provenance
from numdev.stats import equivalence
from numdev.stats import intervals as stats
from numdev.stats.growth import fit_growth
from numdev.weights.metrics import EARLY_METRIC, PAPER_METRIC

PROXY = "fp32"  # the low-precision proxy of the headline table (bf16-mixed vs fp32 training)
SEED_CONTROL = "data"  # the independent-seed control (another data order)
EARLY_STEP = 2


def is_harm_study(runs: dict) -> bool:
    return any(run.get("analysis") == "harm" for by_rep in runs.values() for run in by_rep.values())


def analyse(study_dir, log=print, partial: bool = False, function_level_measures: bool = True) -> HarmSummary:
    study_dir = Path(study_dir)
    runs = discover(study_dir)
    consistency.check(runs)  # first: a run in the wrong place would otherwise be reported as a missing job
    missing = missing_jobs(study_dir, runs)
    if missing and not partial:
        raise FileNotFoundError(f"{study_dir}: {len(missing)} job(s) of the study have no finished run: {', '.join(missing)} "
                                f"(resume the sweep with hydra.sweep.dir={study_dir} resume=auto, or numdev-study --partial)")
    reference = role_of_kind(runs, REFERENCE)
    info = {role: {**first_run(by_rep), "kind": kind_of(by_rep)} for role, by_rep in runs.items()}
    harm_cfg = first_run(runs[reference])["config"]["study"]["harm"]
    margin = float(harm_cfg["margin"])
    accuracy_margin = float(harm_cfg.get("accuracy_margin", 0.05))
    test = harm_cfg.get("test", equivalence.T_TEST)  # a study registered before the sign test was judged by t
    if test not in equivalence.TESTS:
        raise ValueError(f"{first_run(runs[reference])['dir']}/config.yaml: study.harm.test={test!r}: numdev judges claims by "
                         f"{' or '.join(equivalence.TESTS)} (an edited config?)")
    log(f"harm study {study_dir}: {len(runs)} roles, margin {margin:g} on {harm_cfg['outcome']}")

    curves = study_curves(study_dir, runs, log, against_truth=False)["reference"]
    calib = {name: calibration.calibrate(curves, info, name) for name in (calibration.NOISE_LADDER, calibration.INIT_LADDER)}
    outcomes = {role: {r: run_outcomes(run["dir"]) for r, run in by_rep.items()} for role, by_rep in runs.items()}

    role_effects, controls, function = {}, {}, {}
    for role in runs:
        if role == reference:
            continue
        role_effects[role] = {}
        for outcome in OUTCOMES:
            values = effects.effect_values(outcomes, role, reference, outcome)
            m = margin if outcome == effects.PRIMARY else accuracy_margin
            entry = effects.judged(values, m)
            if entry is not None:
                entry["against_seeds"] = effects.against_seeds(outcomes, role, reference, outcome, m)
                role_effects[role][outcome] = entry
        if function_level_measures:
            function[role] = _function_level(runs, role, reference, log)
    for role in runs:
        verdict = effects.claim_verdict({"role": role, **info[role]}, role_effects, margin, test)
        if verdict is not None:
            controls[role] = verdict

    noise = calib[calibration.NOISE_LADDER]
    rungs = [(r["role"], r["size"]) for r in noise.get("rungs", [])]
    harm = threshold.delta_harm(rungs, {role: (role_effects.get(role, {}).get(effects.PRIMARY) or {}).get("per_replicate", {})
                                        for role, _ in rungs}, margin,
                                {role: effects.exceeds(role_effects.get(role, {}).get(effects.PRIMARY), test) for role, _ in rungs})

    roles = {}
    for role, by_rep in runs.items():
        first = first_run(by_rep)
        role_calib = {name: {"stability": c["roles"][role]["stability"], "value": c["roles"][role]["value"],
                             "steps": c["roles"][role]["steps"]}
                      for name, c in calib.items() if "roles" in c and role in c["roles"]}
        margin_entry = None
        if role != reference and "roles" in noise and role in noise["roles"]:
            value = noise["roles"][role]["value"]
            last = _last_status(noise["roles"][role])
            if value is not None:
                margin_entry = threshold.margin_to_harm(harm, value, rungs[0][1])
            elif last in (calibration.BELOW, calibration.BELOW_FLOOR, calibration.AS_ULP):
                margin_entry = threshold.margin_bound(harm, rungs[0][1], last)
            else:
                margin_entry = {"status": "not measured", "text": f"not measured: delta* {noise['roles'][role]['stability'].get('why', '')}"}
        reps = sorted(by_rep)
        per_call_rms = {str(r): (outcomes[role][r].get("per_call") or {}).get("rel_rms") for r in reps}
        roles[role] = RoleSummary(
            role=role, kind=kind_of(by_rep), label=first["label"], replicates=reps,
            claim=first.get("claim"), claim_than=first.get("claim_than"),
            tiling=outcomes[role][reps[0]].get("attention_tiling"), gemm_route=outcomes[role][reps[0]].get("precision_gemm"),
            outcomes={**{key: {str(r): outcomes[role][r].get(key) for r in reps}
                         for key in (*OUTCOMES, "skipped_updates", "step_seconds")},
                      "per_call_rel_rms": per_call_rms},
            effects=role_effects.get(role, {}), function_level=function.get(role, {}), calibration=role_calib,
            margin_to_harm=margin_entry, control=controls.get(role), per_call=_per_call(outcomes[role]),
        )
        # set after construction: a study started before summaries had the field ends with it analysed by
        # this code while its process holds the older RoleSummary (which then writes version 1 without it)
        roles[role].margin_per_call = None if role == reference else threshold.margin_per_call(harm, per_call_rms)
    role_dicts = {name: _as_table_input(r, curves.get(name, {})) for name, r in roles.items()}
    under_test = [role for role, by_rep in runs.items() if kind_of(by_rep) == UNDER_TEST]
    gates = headline.gate(role_dicts, headline.learned(outcomes[reference], learned_below=harm_cfg.get("learned_below")))
    flash = next((r for r in under_test if r == "flash_fa2"), under_test[0] if under_test else None)
    columns = [*under_test, *([PROXY] if PROXY in runs else [])]
    summary = HarmSummary(
        study_dir=str(study_dir),
        command=_command(first_run(runs[reference])["config"]),
        provenance=provenance(seeds=sorted({r for by_rep in runs.values() for r in by_rep}),
                              threads=first_run(runs[reference])["record"].get("threads")),
        workload=_workload(first_run(runs[reference])),
        margin={"outcome": harm_cfg["outcome"], "margin": margin, "relative": True, "accuracy_margin": accuracy_margin,
                "test": test,
                "rules": {"effect": effects.EFFECT_RULE, "equivalence": equivalence.EQUIVALENCE_RULE,
                          "harm": equivalence.HARM_RULE, "mde": equivalence.MDE_RULE, "sign": equivalence.SIGN_RULE}},
        replicates=sorted({r for by_rep in runs.values() for r in by_rep}),
        roles=roles,
        calibration={name: {k: v for k, v in c.items() if k != "roles"} for name, c in calib.items()},
        harm=harm,
        headline={**headline.sentence(role_dicts, under_test, harm, gates), "gate": gates},
        table=headline.table(role_dicts, columns, flash, PROXY if PROXY in runs else None),
        rules={"status": calibration.STATUS_RULE, "stability": calibration.STABILITY_RULE, "harm": threshold.HARM_RULE,
               "margin_to_harm": threshold.MARGIN_RULE, "margin_per_call": threshold.PER_CALL_RULE,
               "headline": headline.HEADLINE_RULE, "learned": headline.LEARNED_RULE, "table": headline.TABLE_RULE,
               "claims": effects.CLAIM_RULES, "consistency": consistency.__doc__.strip().splitlines()[0],
               "interval": stats.LOG_RULE, "evaluation_error": function_level.EVALUATION_ERROR_RULE},
        problems=[f"missing job {job}" for job in missing],
    )
    from numdev.figures import harm as harm_figures

    harm_figures.draw_all(summary, study_dir)
    write_json(study_dir / SUMMARY, summary.to_json())
    shown = summary.headline.get("text") or f"no answer: the study withholds it ({headline.short_why(summary.headline['gate'])}; "\
        f"why, in {study_dir / SUMMARY} and the report)"
    log(shown)
    log(f"-> {study_dir / SUMMARY}, {', '.join(harm_figures.FILES)}")
    return summary


def _last_status(role_calib: dict) -> str | None:
    steps = role_calib["steps"]
    return steps[max(steps, key=int)]["status"] if steps else None


def _function_level(runs: dict, role: str, reference: str, log) -> dict:
    """Per replicate against the reference of the same replicate: churn, prediction disagreement, the held-out set's
    own error of the paired effect (function_level.EVALUATION_ERROR_RULE), loss barrier."""
    per: dict[str, dict[str, float]] = {"churn": {}, "prediction_disagreement": {}, "loss_barrier": {}, "evaluation_error": {}}
    for r, run in sorted(runs[role].items()):
        ref = runs[reference].get(r)
        if ref is None:
            continue
        log(f"[study] {run['dir'].parent.name}/{role}: function-level agreement with the reference")
        try:
            per["churn"][str(r)] = function_level.churn(run["dir"], ref["dir"])["any"]
        except (ValueError, FileNotFoundError) as error:
            log(f"warning: {run['dir']}: no churn ({error})")
        try:
            per["prediction_disagreement"][str(r)] = function_level.prediction_disagreement(run["dir"], ref["dir"])["disagreement"]
        except (ValueError, FileNotFoundError) as error:
            log(f"warning: {run['dir']}: no prediction disagreement ({error})")
        try:
            per["evaluation_error"][str(r)] = function_level.evaluation_error(run["dir"], ref["dir"])["se"]
        except (ValueError, FileNotFoundError) as error:
            log(f"warning: {run['dir']}: no evaluation error ({error})")
        try:
            per["loss_barrier"][str(r)] = function_level.loss_barrier(run["dir"], ref["dir"])["barrier"]
        except (ValueError, FileNotFoundError) as error:
            log(f"warning: {run['dir']}: no loss barrier ({error})")
    return {name: effects.summarise(values) for name, values in per.items() if values}


def _per_call(by_rep: dict) -> dict | None:
    keys = {k for run in by_rep.values() if run.get("per_call") for k in run["per_call"]}
    if not keys:
        return None
    out = {}
    for key in sorted(keys):
        values = [run["per_call"][key] for run in by_rep.values() if run.get("per_call") and key in run["per_call"]]
        estimate = stats.mean_interval(values)
        out[key] = {"estimate": estimate.as_dict(), "text": estimate.text(".2g")}
    return out


def _as_table_input(role: RoleSummary, curves: dict) -> dict:
    """The role's summary as the headline module reads it, with its raw distance at EARLY_STEP and its W1 slope."""
    at, slope = {}, {}
    for r, (steps, values) in curves.items():
        if EARLY_STEP in steps and EARLY_METRIC in values:
            at[str(r)] = float(values[EARLY_METRIC][steps.index(EARLY_STEP)])
        if PAPER_METRIC in values and len(steps) >= 2 and np.isfinite(values[PAPER_METRIC]).all():
            slope[str(r)] = fit_growth(steps, values[PAPER_METRIC])["slope"]
    data = {k: getattr(role, k) for k in role.__dataclass_fields__}
    return {**data, "distance_at": {str(EARLY_STEP): at}, "w1_slope": slope}


def _workload(run: dict) -> dict:
    config, record = run["config"], run["record"]
    return {"model": record.get("model"), "resolution": (config.get("data") or {}).get("resolution"),
            "steps": record.get("final_step"), "precision": record.get("precision"),
            "learning_rate": ((config.get("optim") or {}).get("optimizer") or {}).get("lr"),
            "warmup_steps": (config.get("optim") or {}).get("warmup_steps"), "cooldown_steps": (config.get("optim") or {}).get("cooldown_steps"),
            "batch_size": (config.get("data") or {}).get("batch_size")}


def _command(config: dict) -> str:
    return f"numdev-train experiment={config.get('name', 'harm')}"


