"""The harm study's analysis (numdev.analysis.harm): calibration over steps, the threshold, the claims,
the gate of the headline, the consistency checks and the typed summary, on numbers built by hand.

The rules must be able to fail: a positive control built to harm is called "harms", one built not
to is not, and a study whose positive control fails gets no headline.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import compose_train
from hydra.utils import instantiate

from numdev.analysis.harm import calibration, consistency, effects, headline, threshold
from numdev.numerics.formats import parse_format
from numdev.runs import harm_summary
from numdev.stats import verdicts

RUNGS = [("delta_1e-3", 1e-3), ("delta_1e-2", 1e-2), ("delta_1e-1", 1e-1)]


# -- placing a distance on one replicate's ladder -------------------------------------------------------------
@pytest.mark.parametrize("ladder, value, where, expected", [
    ([1e-4, 1e-3, 1e-2], 3e-4, calibration.INSIDE, 1e-3 * 10 ** (math.log10(3))),
    ([1e-4, 1e-3, 1e-2], 5e-5, calibration.BELOW, None),
    ([1e-4, 1e-3, 1e-2], 1e-2, calibration.ABOVE, None),
    ([1e-4, 3e-3, 2e-3], 2.5e-3, calibration.NON_MONOTONE, None),  # the ladder folds back over the value
    ([1e-3, 5e-4, 2e-3], 7e-4, calibration.NON_MONOTONE, None),
])
def test_a_distance_is_placed_only_inside_an_increasing_bracket(ladder, value, where, expected):
    placed = calibration.place([1e-3, 1e-2, 1e-1], ladder, value)
    assert placed.where == where
    if expected is None:
        assert placed.value is None
    else:
        assert placed.value == pytest.approx(expected, rel=1e-12)  # linear in log-log: D = 0.1 delta


def _curves(roles: dict[str, list[float]], replicates=range(5), steps=(0, 2, 4, 8), jitter=0.05, seed=0) -> dict:
    """role -> replicate -> (steps, {rel_frobenius: values}); each role's distance at every step > 0 is its
    value times a per-replicate factor exp(jitter z) (0 at step 0)."""
    rng = np.random.default_rng(seed)
    out = {}
    for role, per_step in roles.items():
        out[role] = {}
        for r in replicates:
            factor = math.exp(jitter * rng.standard_normal())
            values = [0.0] + [v * factor for v in per_step]
            out[role][r] = (list(steps), {"rel_frobenius": values})
    return out


def _info(extra=()) -> dict:
    info = {name: {"ladder": {"name": "attention_noise", "size": size}} for name, size in RUNGS}
    info["ulp"] = {"ladder": {"name": "init", "size": "ulp"}}
    for name in extra:
        info[name] = {}
    return info


def test_a_role_is_measured_inside_the_ladder_stable_over_steps():
    ladder = {name: [0.1 * size] * 3 for name, size in RUNGS}  # D = 0.1 delta at every step
    curves = _curves({**ladder, "ulp": [1e-6] * 3, "flash": [3e-4] * 3})
    result = calibration.calibrate(curves, _info(["flash"]))
    flash = result["roles"]["flash"]
    assert all(e["status"] == calibration.MEASURED for e in flash["steps"].values())
    assert flash["stability"]["stable"] and flash["stability"]["from_step"] == 2
    assert flash["value"]["estimate"]["value"] == pytest.approx(3e-3, rel=0.1)


def test_below_the_floor_as_small_as_one_ulp_and_below_the_ladder_are_told_apart():
    ladder = {name: [0.1 * size] * 3 for name, size in RUNGS}
    curves = _curves({**ladder, "ulp": [1e-6] * 3, "tiny": [1.1e-6] * 3, "small": [2e-5] * 3}, jitter=0.01)
    result = calibration.calibrate(curves, _info(["tiny", "small"]))
    assert result["roles"]["tiny"]["steps"]["2"]["status"] == calibration.AS_ULP
    assert result["roles"]["small"]["steps"]["2"]["status"] == calibration.BELOW
    # with 3 replicates the same data give no affirmative "as small as one ulp": a range is not an interval
    few = calibration.calibrate(_curves({**ladder, "ulp": [1e-6] * 3, "tiny": [1.1e-6] * 3}, replicates=range(3), jitter=0.01),
                                _info(["tiny"]))
    assert few["roles"]["tiny"]["steps"]["2"]["status"] != calibration.AS_ULP
    same = calibration.calibrate(_curves({**ladder, "ulp": [1e-6] * 3, "same": [1e-6] * 3}, jitter=0.8), _info(["same"]))
    assert same["roles"]["same"]["steps"]["2"]["status"] == calibration.BELOW_FLOOR  # not told apart, too scattered to be "as small"


def test_a_non_monotone_bracket_is_reported_not_measured():
    ladder = {"delta_1e-3": [1e-4] * 3, "delta_1e-2": [3e-3] * 3, "delta_1e-1": [2e-3] * 3}  # folds back
    curves = _curves({**ladder, "ulp": [1e-6] * 3, "flash": [2.5e-3] * 3}, jitter=0.0)
    result = calibration.calibrate(curves, _info(["flash"]))
    entry = result["roles"]["flash"]["steps"]["4"]
    assert entry["status"] == calibration.NOT_MEASURED and "non-monotone" in entry["text"]
    assert result["non_monotone_replicates"]["4"] == [0, 1, 2, 3, 4]
    assert not result["roles"]["flash"]["stability"]["stable"]


def test_a_drifting_equivalent_size_is_not_stable():
    ladder = {name: [0.1 * size] * 4 for name, size in RUNGS}
    curves = _curves({**ladder, "ulp": [1e-6] * 4, "flash": [2e-4, 6e-4, 2e-3, 6e-3]}, steps=(0, 2, 4, 8, 16), jitter=0.01)
    result = calibration.calibrate(curves, _info(["flash"]))
    assert not result["roles"]["flash"]["stability"]["stable"] and result["roles"]["flash"]["value"] is None


# -- the threshold -----------------------------------------------------------------------------------------
def test_delta_harm_is_where_the_made_monotone_effect_reaches_the_margin():
    kind, value = threshold.crossing([1e-2, 1e-1, 1.0], [0.0, 0.01, 0.07], 0.03)
    assert kind == "inside" and value == pytest.approx(10 ** (-1 + (0.03 - 0.01) / 0.06), rel=1e-12)
    assert threshold.crossing([1e-2, 1e-1], [0.0, 0.01], 0.03) == ("above", None)
    assert threshold.crossing([1e-2, 1e-1], [0.05, 0.06], 0.03) == ("at_or_below", 1e-2)
    # a dip is pooled, not read as a crossing: more noise does not help
    assert threshold.crossing([1e-3, 1e-2, 1e-1, 1.0], [0.0, 0.04, 0.0, 0.08], 0.03)[0] == "inside"


def test_delta_harm_over_replicates_and_the_margin_to_it():
    effects_by_rung = {"delta_1e-3": {str(r): 0.0 for r in range(5)}, "delta_1e-2": {str(r): 0.01 for r in range(5)},
                       "delta_1e-1": {str(r): 0.05 + 0.001 * r for r in range(5)}}
    harm = threshold.delta_harm(RUNGS, effects_by_rung, 0.03, {"delta_1e-1": True})
    assert harm["status"] == "measured" and harm["smallest_rung_exceeding"] == 1e-1
    assert 1e-2 < harm["estimate"]["value"] < 1e-1
    equivalent = {"per_replicate": {str(r): 1e-3 for r in range(5)}, "estimate": {"value": 1e-3}}
    margin = threshold.margin_to_harm(harm, equivalent, 1e-3)
    assert margin["estimate"]["value"] == pytest.approx(harm["estimate"]["value"] / 1e-3, rel=1e-9)
    censored = threshold.delta_harm(RUNGS, {k: {str(r): 0.0 for r in range(5)} for k in effects_by_rung}, 0.03, {})
    assert censored["status"] == "above the ladder"
    assert threshold.margin_to_harm(censored, equivalent, 1e-3)["status"] == "not measured"


def test_the_per_call_margin_is_delta_harm_over_the_shadows_deviation_paired_by_replicate():
    harm = {"status": "measured", "per_replicate": {"0": 0.4, "1": 0.5, "2": 0.6, "3": 0.3, "4": 0.45}}
    rms = {"0": 0.004, "1": 0.005, "2": 0.003, "3": 0.003, "4": 0.0045, "9": 0.001}  # 9: no delta_harm, left out
    margin = threshold.margin_per_call(harm, rms)
    ratios = [100.0, 100.0, 200.0, 100.0, 100.0]
    assert margin["status"] == "measured" and sorted(margin["per_replicate"]) == ["0", "1", "2", "3", "4"]
    assert margin["estimate"]["value"] == pytest.approx(float(np.exp(np.mean(np.log(ratios)))), rel=1e-12)
    assert margin["estimate"]["low"] < margin["estimate"]["value"] < margin["estimate"]["high"]
    assert threshold.margin_per_call(harm, {"0": None, "1": float("nan"), "2": 0.0}) is None  # nothing measured: no entry
    assert threshold.margin_per_call({"status": "not measured", "text": "not measured: x"}, rms)["status"] == "not measured"
    assert threshold.margin_per_call(harm, {"7": 0.01})["status"] == "not measured"


# -- the claims and the gate -------------------------------------------------------------------------------
def _effect(values, margin=0.03):
    return effects.judged({str(r): v for r, v in enumerate(values)}, margin)


@pytest.mark.parametrize("claim, values, status", [
    ("harms", [0.09, 0.11, 0.10, 0.12, 0.08], verdicts.HOLDS),  # built to harm: 3x the margin, small spread
    ("harms", [0.001, -0.002, 0.0, 0.002, -0.001], verdicts.FAILS),  # built not to: shown below the margin
    ("harms", [0.09, 0.11, 0.10], verdicts.NOT_MEASURABLE),  # 3 replicates: a range, no verdict
    ("no_harm", [0.001, -0.002, 0.0, 0.002, -0.001], verdicts.HOLDS),
    ("no_harm", [0.09, 0.11, 0.10, 0.12, 0.08], verdicts.FAILS),
])
@pytest.mark.parametrize("test", ["sign", "t"])
def test_a_claim_holds_or_fails_by_its_rule(claim, values, status, test):
    verdict = effects.claim_verdict({"role": "x", "claim": claim}, {"x": {effects.PRIMARY: _effect(values)}}, 0.03, test)
    assert verdict["status"] == status and verdict["rule"] == effects.CLAIM_RULES[claim] and verdict["test"] == test


def test_a_no_harm_claim_states_the_smallest_margin_the_design_could_certify():
    """The one-ulp control in the dit_tiny pilot study moved held-out loss by -6.8%, +5.3%, +3.0%: at n = 5 the sign test
    needs all five inside the margin, so 3% could not hold whatever the other two did."""
    values = _effect([-0.068, 0.053, 0.030, 0.01, -0.02])
    verdict = effects.claim_verdict({"role": "ulp", "claim": "no_harm"}, {"ulp": {effects.PRIMARY: values}}, 0.03, "sign")
    assert verdict["status"] == verdicts.NOT_MEASURABLE
    assert verdict["resolution"]["largest_abs_effect"] == pytest.approx(0.068)
    assert verdict["resolution"]["mde_equivalence"] == pytest.approx(values["mde_equivalence"])
    wide = effects.claim_verdict({"role": "ulp", "claim": "no_harm"}, {"ulp": {effects.PRIMARY: _effect([-0.068, 0.053, 0.030, 0.01, -0.02], 0.07)}}, 0.07, "sign")
    assert wide["status"] == verdicts.HOLDS  # a margin above the largest |effect|: all five inside


def test_the_registered_test_decides_a_heavy_tailed_control():
    """lr x10's effects in the committed 1500-step study: the sign test calls it, the t test cannot."""
    values = _effect([1.64, 8701654.5, 5066070.0, 651807.8, 661472.3])
    role = {"role": "x", "claim": "harms"}
    assert effects.claim_verdict(role, {"x": {effects.PRIMARY: values}}, 0.03, "sign")["status"] == verdicts.HOLDS
    assert effects.claim_verdict(role, {"x": {effects.PRIMARY: values}}, 0.03, "t")["status"] == verdicts.NOT_MEASURABLE
    assert effects.exceeds(values, "sign") and not effects.exceeds(values, "t")


def test_more_harm_than_is_paired_against_the_named_role():
    mine, theirs = _effect([0.05, 0.06, 0.055, 0.052, 0.058]), _effect([0.01, 0.012, 0.011, 0.009, 0.01])
    role = {"role": "biased", "claim": "more_harm_than", "claim_than": "unbiased"}
    assert effects.claim_verdict(role, {"biased": {effects.PRIMARY: mine}, "unbiased": {effects.PRIMARY: theirs}}, 0.03)["status"] == verdicts.HOLDS
    assert effects.claim_verdict(role, {"biased": {effects.PRIMARY: theirs}, "unbiased": {effects.PRIMARY: mine}}, 0.03)["status"] == verdicts.FAILS
    with pytest.raises(ValueError, match="study.claim='helps'"):
        effects.claim_verdict({"role": "x", "claim": "helps"}, {}, 0.03)


def test_the_headline_is_withheld_naming_the_control_that_failed():
    harm = {"margin": 0.03, "text": "0.2 [0.15, 0.3]", "status": "measured"}
    holds = {"status": verdicts.HOLDS, "claim": "harms", "text": "t"}
    failed = {"status": verdicts.FAILS, "claim": "harms", "text": "Δ +0.001"}
    flash = {"label": "Flash", "margin_to_harm": {"status": "measured", "estimate": {"value": 20.0, "low": 10.0, "high": 40.0, "n": 5, "method": "t"}}}
    open_gate = headline.gate({"lr_x10": {"control": holds}, "ulp": {"control": {**holds, "claim": "no_harm"}}, "flash": flash})
    shown = headline.sentence({"flash": flash}, ["flash"], harm, open_gate)
    assert shown["shown"] and "1/20 of it [1/40, 1/10]" in shown["text"]
    per_call = {"status": "measured", "estimate": {"value": 370.0, "low": 300.0, "high": 450.0, "n": 5, "method": "t"}}
    both = headline.sentence({"flash": {**flash, "margin_per_call": per_call}}, ["flash"], harm, open_gate)["text"]
    assert "1/20 of it [1/40, 1/10] by its weights; per call 1/3.7e+02 of it [1/4.5e+02, 1/3e+02]" in both
    closed = headline.gate({"lr_x10": {"control": failed}, "ulp": {"control": holds}, "flash": flash})
    withheld = headline.sentence({"flash": flash}, ["flash"], harm, closed)
    assert not withheld["shown"] and "lr_x10: claim 'harms' fails" in withheld["why"]
    assert not headline.sentence({"flash": flash}, ["flash"], harm, headline.gate({"flash": flash}))["shown"]
    # the committed 1500-step study's reference: replicate 3 had not learned position (31%): withheld, whatever the claims
    reference = {str(r): {"colour_accuracy": 1.0, "position_accuracy": p} for r, p in enumerate([0.96, 0.75, 0.97, 0.31, 1.0])}
    unlearned = headline.gate({"lr_x10": {"control": holds}, "ulp": {"control": holds}, "flash": flash}, headline.learned(reference))
    assert not unlearned["open"] and "replicate 1 position 75%, replicate 3 position 31%" in unlearned["why"]
    reference = {r: {**run, "position_accuracy": 0.95} for r, run in reference.items()}
    assert headline.gate({"lr_x10": {"control": holds}, "ulp": {"control": holds}}, headline.learned(reference))["open"]


def test_the_table_judges_each_ratio_against_the_papers_range_only_from_five_replicates():
    def role(values):
        return {"calibration": {"attention_noise": {"value": {"per_replicate": values}}}, "function_level": {}, "effects": {}}

    roles = {"flash": role({str(r): 1e-3 * (1 + 0.01 * r) for r in range(5)}), "fp32": role({str(r): 3e-3 for r in range(5)})}
    row = next(r for r in headline.table(roles, ["flash", "fp32"], "flash", "fp32") if r["measure"] == "delta_star")
    assert row["ratio"]["verdict"]["status"] == verdicts.HOLDS and 2.8 < row["ratio"]["estimate"]["value"] < 3.1
    few = {k: role(dict(list(v["calibration"]["attention_noise"]["value"]["per_replicate"].items())[:3])) for k, v in roles.items()}
    row = next(r for r in headline.table(few, ["flash", "fp32"], "flash", "fp32") if r["measure"] == "delta_star")
    assert row["ratio"]["verdict"]["status"] == verdicts.NOT_MEASURABLE and "range of 3" in row["ratio"]["text"]


# -- the runs checked against each other -------------------------------------------------------------------
def _run(tmp: Path, role: str, replicate: int, kind="under_test", **config) -> dict:
    base = {"name": "harm", "model": {"name": "m"}, "data": {"resolution": 32, "batch_size": 32}, "trainer": {"max_steps": 10},
            "snapshot": {"every_n_steps": 5, "schedule": "log"}, "optim": {"warmup_steps": 1, "optimizer": {"lr": 1e-3}},
            "diffusion": {"p": 1}, "study": {"harm": {"margin": 0.03}}, "precision": {"name": "bf16-mixed"}}
    for key, value in config.items():
        node = base
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return {"dir": tmp / f"r{replicate}" / role, "role": role, "replicate": replicate, "kind": kind, "config": base,
            "record": {"precision_gemm": {"route": "fp32"}}, "ladder": config.get("ladder")}


def test_runs_that_did_not_train_the_same_workload_are_refused(tmp_path):
    good = {"reference": {0: _run(tmp_path, "reference", 0, "reference")}, "flash": {0: _run(tmp_path, "flash", 0)}}
    consistency.check(good)
    lr = {**good, "flash": {0: _run(tmp_path, "flash", 0, **{"optim.optimizer.lr": 3e-3})}}
    with pytest.raises(ValueError, match="optim.optimizer.lr = 0.003.*a run copied in"):
        consistency.check(lr)
    positive = {**good, "lr_x10": {0: _run(tmp_path, "lr_x10", 0, "positive_control", **{"optim.optimizer.lr": 1e-2})}}
    consistency.check(positive)  # a positive control may change the learning rate
    margin = {**good, "flash": {0: _run(tmp_path, "flash", 0, **{"study.harm.margin": 0.05})}}
    with pytest.raises(ValueError, match="study.harm"):
        consistency.check(margin)
    test = {**good, "flash": {0: _run(tmp_path, "flash", 0, **{"study.harm.test": "t"})}}
    with pytest.raises(ValueError, match="study.harm"):
        consistency.check(test)  # the registered test is one test, in every run
    cooldown = {**good, "flash": {0: _run(tmp_path, "flash", 0, **{"optim.cooldown_steps": 3})}}
    with pytest.raises(ValueError, match="optim.cooldown_steps"):
        consistency.check(cooldown)
    moved = {**good, "flash": {0: {**_run(tmp_path, "flash", 0), "dir": tmp_path / "r1" / "flash"}}}
    with pytest.raises(ValueError, match="sits in r1/flash"):
        consistency.check(moved)
    rung = _run(tmp_path, "delta_1e-2", 0, "ladder", **{"attention.delta": 1e-3})
    rung["ladder"] = {"name": "attention_noise", "size": 1e-2}
    with pytest.raises(ValueError, match="study.ladder.size = 0.01 but it ran with attention.delta = 0.001"):
        consistency.check({**good, "delta_1e-2": {0: rung}})
    other_route = _run(tmp_path, "flash", 0)
    other_route["record"] = {"precision_gemm": {"route": "native"}}
    with pytest.raises(ValueError, match="products ran by the 'native' route"):
        consistency.check({**good, "flash": {0: other_route}})


def test_a_run_saved_before_the_objective_group_is_the_diffusion_objective_it_trained(tmp_path):
    """An older reference (no `objective`) beside a newer role that records the diffusion objective of the same
    `diffusion` block: one workload; a role with another objective is refused."""
    diffusion = {"schedule": {"num_steps": 1000}, "sampler": {"kind": "ddim"}, "p_uncond": 0.1, "prediction": "v"}
    objective = {"_target_": "numdev.train.module.DiffusionModule", "_partial_": True, **diffusion}
    old = {"reference": {0: _run(tmp_path, "reference", 0, "reference", diffusion=diffusion)}}
    consistency.check({**old, "acc": {0: _run(tmp_path, "acc", 0, diffusion=diffusion, objective=objective)}})
    newer = _run(tmp_path, "acc", 0, diffusion=diffusion, objective=objective, **{"study.harm.learned_below": None})
    consistency.check({**old, "acc": {0: newer}})  # a setting added later with a null default: what the older run ran
    with pytest.raises(ValueError, match=r"study.harm.learned_below = 1.0, but .* has None"):
        consistency.check({**old, "acc": {0: _run(tmp_path, "acc", 0, diffusion=diffusion, **{"study.harm.learned_below": 1.0})}})
    other = {**objective, "prediction": "eps"}
    with pytest.raises(ValueError, match="objective.prediction = 'eps', but .* has 'v': its runs must train the same workload"):
        consistency.check({**old, "acc": {0: _run(tmp_path, "acc", 0, diffusion=diffusion, objective=other)}})


# -- the summary as a typed, versioned file ---------------------------------------------------------------
def _summary() -> harm_summary.HarmSummary:
    role = harm_summary.RoleSummary(role="flash", kind="under_test", label="Flash", replicates=[0, 1])
    return harm_summary.HarmSummary(study_dir="d", command="c", provenance={}, workload={}, margin={"margin": 0.03},
                                    replicates=[0, 1], roles={"flash": role}, calibration={}, harm={}, headline={},
                                    table=[], rules={})


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(version=99), "version 99"),
    (lambda d: d.update(version=True), "version True"),
    (lambda d: d["roles"]["flash"].update(margin_per_call=[1]), "field 'margin_per_call' is a list"),
    (lambda d: d.update(schema="numdev.study"), "not a harm study summary"),
    (lambda d: d["roles"]["flash"].update(replicates="0,1"), "field 'replicates' is a str"),
    (lambda d: d.pop("headline"), "field 'headline' is missing"),
    (lambda d: d["roles"]["flash"].update(role="other"), "says it is role 'other'"),
    (lambda d: d.update(extra=1), "unknown field"),
    # deep inside, what the tables format and compare (scripts/harm_table.py crashed on these with a traceback)
    (lambda d: d["roles"]["flash"].update(outcomes={"heldout_loss": {"0": "a"}}), r"roles.flash.outcomes.heldout_loss must map"),
    (lambda d: d["roles"]["flash"].update(outcomes={"heldout_loss": [0.1]}), r"roles.flash.outcomes.heldout_loss must map"),
    (lambda d: d["roles"]["flash"].update(margin_per_call={"estimate": {"low": "x"}}), r"margin_per_call.estimate.low is 'x', not a number"),
    (lambda d: d["roles"]["flash"].update(effects={"heldout_loss": {"sign": {"counts": {}}}}), r"sign.counts lacks above, below, inside"),
    (lambda d: d["roles"]["flash"].update(effects={"heldout_loss": {"per_replicate": {"0": True}}}), r"per_replicate must map to numbers"),
    (lambda d: d["roles"]["flash"].update(effects={"heldout_loss": {"text": 3}}), r"heldout_loss.text is a int, not a text"),
    (lambda d: d.update(harm={"estimate": {"value": [1]}}), r"harm.estimate.value is \[1\], not a number"),
    (lambda d: d.update(table=[{"cells": {"flash": {"text": None}}}]), r"table\[0\].cells.flash.text is a NoneType"),
])
def test_the_summary_is_read_back_checked(edit, message, tmp_path):
    data = json.loads(json.dumps(_summary().to_json()))
    assert harm_summary.from_json(data).roles["flash"].replicates == [0, 1]
    edit(data)
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        harm_summary.read_harm_summary(path)
    path.write_text(json.dumps(_summary().to_json())[:50])
    with pytest.raises(ValueError, match="not valid JSON"):
        harm_summary.read_harm_summary(path)


def test_a_version_1_summary_reads_without_the_per_call_margin():
    data = json.loads(json.dumps(_summary().to_json()))
    data["version"] = 1
    del data["roles"]["flash"]["margin_per_call"]
    assert harm_summary.from_json(data).roles["flash"].margin_per_call is None


def test_a_runs_own_records_fit_the_summarys_fields(tmp_path):
    """What run.json records (attention_tiling {"layers": [...]}, precision_gemm {route, setting, why})
    becomes the summary's typed fields (a list of layers, the route), and the summary reads back."""
    from numdev.analysis.harm.outcomes import run_outcomes

    layers = [{"layer": "blocks.0.attn", "backend": "flash_emulated", "kv_block": 8, "kv_blocks": 8}]
    (tmp_path / "run.json").write_text(json.dumps({"status": "finished", "attention_tiling": {"layers": layers},
                                                   "precision_gemm": {"setting": "auto", "route": "fp32", "why": "no avx512_bf16"}}))
    record = run_outcomes(tmp_path)
    assert record["attention_tiling"] == layers and record["precision_gemm"] == "fp32"
    summary = _summary()
    summary.roles["flash"].tiling, summary.roles["flash"].gemm_route = record["attention_tiling"], record["precision_gemm"]
    (tmp_path / "summary.json").write_text(json.dumps(summary.to_json()))
    assert harm_summary.read_harm_summary(tmp_path / "summary.json").roles["flash"].tiling == layers


# -- the experiment itself ---------------------------------------------------------------------------------
def test_the_learning_rate_control_is_ten_times_the_studys():
    reference = compose_train("experiment=harm", "study=reference", "run_dir=/tmp/x", smoke=False)
    lr_x10 = compose_train("experiment=harm", "study=lr_x10", "run_dir=/tmp/x", smoke=False)
    assert lr_x10.optim.optimizer.lr == pytest.approx(10 * reference.optim.optimizer.lr, rel=1e-12)


def test_every_claimed_role_states_a_known_claim_and_flash_tiles():
    for role in ("acc_e5m2", "acc_e4m3", "acc_e5m1", "acc_e5m0", "bf16_true", "bf16_kahan", "bf16_sr", "biased_1e-1", "lr_x10", "ulp",
                 "opt_compile"):
        cfg = compose_train("experiment=harm", f"study={role}", "run_dir=/tmp/x", smoke=False)
        assert cfg.study.claim in effects.CLAIMS, role
    for role, bits in (("acc_e5m1", 1), ("acc_e5m0", 0)):  # the grade's further steps: every stage of the state in that format
        formats = instantiate(compose_train("experiment=harm", f"study={role}", "run_dir=/tmp/x", smoke=False).attention).formats
        assert {parse_format(getattr(formats, stage)).mantissa_bits for stage in ("stats", "rescale", "accum")} == {bits}, role
    flash = compose_train("experiment=harm", "study=flash_fa2", "run_dir=/tmp/x", smoke=False)
    tokens = (flash.data.resolution // flash.model.patch) ** 2
    assert math.ceil(tokens / flash.attention.block_c) >= 8  # every image self-attention call runs >= 8 key/value blocks


# -- the whole study through the real command line (slow: 35 micro runs) -----------------------------------
@pytest.mark.slow
def test_the_smoke_harm_study_runs_end_to_end_and_reads_back(tmp_path):
    from helpers import run_cli

    result = run_cli("numdev.train.app", "experiment=harm_smoke", f"hydra.sweep.dir={tmp_path / 'study'}", cwd=tmp_path, timeout=1800)
    study = tmp_path / "study"
    summary = harm_summary.read_harm_summary(study / "summary.json")
    assert summary.replicates == [0, 1, 2, 3, 4] and set(summary.roles) >= {"reference", "flash_fa2", "ulp", "lr_x10"}
    flash = summary.roles["flash_fa2"]
    assert flash.tiling and any(layer["kv_blocks"] >= 8 for layer in flash.tiling)
    assert flash.per_call and flash.per_call["rel_rms"]["estimate"]["value"] > 0  # the shadow's per-call deviation
    assert {"churn", "prediction_disagreement", "loss_barrier"} <= set(flash.function_level)
    assert flash.effects["heldout_loss"]["n"] == 5 and flash.effects["heldout_loss"]["against_seeds"] is not None
    assert all(str(s) in flash.calibration["attention_noise"]["steps"] for s in (2, 4, 8))
    assert (study / "harm.png").is_file() and (study / "calibration.png").is_file() and (study / "controls.png").is_file()
    from numdev.analysis.harm.headline import short_why

    said = summary.headline["text"] if summary.headline["shown"] else short_why(summary.headline["gate"])
    assert said in result.stdout + result.stderr  # the console's line: the sentence, or the withheld answer's short reason
    again = run_cli("numdev.analysis.study", str(study), cwd=tmp_path)  # numdev-study reproduces the summary
    assert harm_summary.read_harm_summary(study / "summary.json").table == summary.table, again.stdout
    # --keep-snapshots ends: each run keeps its first and last snapshot, and the analysis after it is the same
    before = sum(p.stat().st_size for p in study.rglob("weights/*.safetensors"))
    pruned = run_cli("numdev.analysis.study", str(study), "--keep-snapshots", "ends", cwd=tmp_path)
    kept = sorted({p.name for p in study.rglob("weights/step_*.safetensors")})
    assert kept == ["step_00000000.safetensors", "step_00000008.safetensors"], kept
    left = sum(p.stat().st_size for p in study.rglob("weights/*.safetensors"))  # step 0 holds every row, later steps the trained ones
    assert left < before and f"{(before - left) / 1e9:.2f} GB freed" in pruned.stdout + pruned.stderr, pruned.stdout
    run_cli("numdev.analysis.study", str(study), cwd=tmp_path)
    after = harm_summary.read_harm_summary(study / "summary.json")
    assert after.table == summary.table and after.harm == summary.harm
    assert {n: r.effects for n, r in after.roles.items()} == {n: r.effects for n, r in summary.roles.items()}
    assert {n: r.function_level for n, r in after.roles.items()} == {n: r.function_level for n, r in summary.roles.items()}


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("module, patched, argv", [
    ("numdev.analysis.study", "analyse", ["{tmp}"]),
    ("numdev.report.app", "build_report", ["--bench", "{tmp}", "-o", "{tmp}/report"]),
    ("numdev.analysis.compare", "compare_runs", ["{tmp}/a", "{tmp}/b"]),
    ("numdev.bench.figure", "make_figure", ["fig3", "{tmp}"]),
    ("numdev.bench.gather", "write_table", ["{tmp}"]),
])
def test_ctrl_c_in_a_command_that_reads_runs_is_one_line_and_exit_130(module, patched, argv, tmp_path, monkeypatch, capsys):
    """SIGINT while numdev-study, numdev-report, numdev-compare, numdev-figure or numdev-gather works: one
    line naming the command, exit 130, no traceback (its files are written whole or not at all)."""
    import importlib

    program = importlib.import_module(module)
    monkeypatch.setattr(program, patched, _interrupt)
    with pytest.raises(SystemExit) as exited:
        program.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert exited.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"numdev-{module.rsplit('.', 1)[-1].replace('app', 'report')}: error: interrupted (SIGINT)"), err


def test_the_per_call_deviation_is_read_from_the_shadows_per_layer_rows(tmp_path):
    """numdev.train.callbacks.shadow writes one row per attention layer and step (no "all" row): the per-call
    deviation is their mean over layers and steps, the backward rows left out."""
    from numdev.analysis.harm.outcomes import per_call
    from numdev.runs.layout import RunDir

    header = "step,layer,quantity,max_abs,mean_abs,ref_max_abs,bias,rel_rms,diff_rms,shadow_rms,count\n"
    rows = ["0,blocks.0.attn,out,0.01,0.001,1.0,0.0002,0.002,0.001,0.5,64",
            "0,blocks.1.attn,out,0.03,0.003,1.0,-0.0001,0.004,0.002,0.5,64",
            "100,blocks.0.attn,out,0.02,0.002,1.0,0.0003,0.003,0.0015,0.5,64",
            "100,blocks.0.attn,dq,9.0,9.0,1.0,9.0,9.0,9.0,9.0,64"]  # a gradient row: not the forward output
    (tmp_path / "shadow.csv").write_text(header + "\n".join(rows) + "\n")
    got = per_call(RunDir(tmp_path))
    assert got["rel_rms"] == pytest.approx(0.003) and got["bias"] == pytest.approx(0.0004 / 3)
    assert got["max_abs"] == pytest.approx(0.02) and got["mean_abs"] == pytest.approx(0.002)


@pytest.mark.parametrize("file, key, value, message", [
    ("eval.json", "position_accuracy", 2.0, "is not a share in \\[0, 1\\]"),
    ("eval.json", "colour_accuracy", -0.1, "is not a share in \\[0, 1\\]"),
    ("heldout.json", "heldout_loss", -1.0, "is negative"),
])
def test_a_forged_outcome_is_refused_naming_the_file(tmp_path, file, key, value, message):
    from numdev.runs.layout import RunDir

    (tmp_path / file).write_text(json.dumps({key: value}))
    with pytest.raises(ValueError, match=message) as error:
        RunDir(tmp_path).read_outcome(key)
    assert str(tmp_path / file) in str(error.value)
