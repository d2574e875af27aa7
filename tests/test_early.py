"""The early phase and the calibration ladder (numdev.analysis.early): log-ratio intervals, first
crossings, the common-slope shift, the resolution floor and equivalent sizes; the ladder's
perturbations (numdev.models.perturb, numdev.attention.output_noise); the log-spaced schedule and
trained-only snapshots; and, on a micro model in bf16, the instrument itself: Flash told apart
from the ulp control at step 2, and a planted eps = 1e-4 recovered by the ladder."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from helpers import compose_train, run_cli
from scipy import stats as scipy_stats

from numdev.analysis import early
from numdev.analysis.study import analyse, claim_verdicts
from numdev.attention import Eager, OutputNoise
from numdev.models.perturb import ULP_RELATIVE, apply_init_perturbation
from numdev.runs.layout import TRAINED
from numdev.stats import intervals as stats
from numdev.stats.verdicts import FAILS, HOLDS, NOT_MEASURABLE
from numdev.train.callbacks.snapshots import SnapshotSchedule
from numdev.weights.store import SnapshotWriter, load_snapshot, read_index

# ----------------------------------------------------------------------------- intervals


def test_an_interval_from_three_replicates_is_labelled_a_range():
    estimate = stats.log_ratio_interval([2.0, 8.0, 4.0], [1.0, 1.0, 1.0])
    assert estimate.method == stats.RANGE and (estimate.low, estimate.high) == (2.0, 8.0)
    assert estimate.value == pytest.approx(4.0)  # the geometric mean
    assert "range of 3: 2, 8" in estimate.text(".3g") and estimate.excludes(1.0)


def test_an_interval_from_five_or_more_replicates_is_a_t_interval_on_the_logs():
    values = [1.5, 2.0, 2.5, 3.0, 1.8, 2.2]
    estimate = stats.log_mean_interval(values)
    logs = np.log(values)
    low, high = scipy_stats.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=scipy_stats.sem(logs))
    assert estimate.method == stats.T and "range" not in estimate.text()
    assert (estimate.low, estimate.high) == pytest.approx((math.exp(low), math.exp(high)))
    assert not stats.log_mean_interval([1.0, 2.0]).has_interval  # two replicates: no interval at all


# ----------------------------------------------------------------------------- early measures on planted curves


def _curves(spec: dict[str, list[list[float]]], steps: list[int]) -> dict:
    """role -> replicate -> (steps, {rel_frobenius: values})."""
    return {role: {r: (steps, {early.EARLY_METRIC: list(v)}) for r, v in enumerate(reps)} for role, reps in spec.items()}


def test_the_first_crossing_is_interpolated_on_the_log_scale():
    assert early.crossing_step([0, 2, 4], [0.0, 1e-4, 1e-2], 1e-3) == pytest.approx(3.0)
    assert early.crossing_step([0, 2, 4], [0.0, 1e-4, 1e-2], 1e-4) == 2.0
    assert early.crossing_step([0, 2, 4], [0.0, 1e-4, 1e-3], 1e-2) is None


def test_the_shift_recovers_a_planted_factor_and_stops_at_saturation():
    steps = [0, 1, 2, 4, 8, 16, 32, 64]
    rng = np.random.default_rng(0)

    def curve(size, noise):
        d = size * np.exp(0.3 * np.array(steps, dtype=float)) * np.exp(noise)
        return np.minimum(d, 0.5)  # saturates at 0.5

    flash = [curve(1e-6, rng.normal(0, 0.05, len(steps))) for _ in range(6)]
    bigger = [curve(30e-6, rng.normal(0, 0.05, len(steps))) for _ in range(6)]
    curves = _curves({"flash": flash, "big": bigger}, steps)
    window = early.exponential_window(curves, ("big", "flash"))
    assert window == [1, 2, 4, 8, 16]  # 30e-6 e^(0.3 t) passes 0.05 (0.1 of the 0.5 plateau) between steps 16 and 32
    result = early.shift(curves, "big", "flash")
    estimate = stats.Estimate(**result["estimate"])
    assert estimate.method == stats.T and estimate.low < 30 < estimate.high and 25 < estimate.value < 36
    slope, intercepts = early.common_slope_fit(np.array([1.0, 2.0, 3.0]), np.log([[2, 2 * math.e, 2 * math.e**2], [1, math.e, math.e**2]]))
    assert slope == pytest.approx(1.0) and intercepts == pytest.approx([math.log(2) - 1, -1.0])


def test_a_pair_that_starts_saturated_has_no_exponential_window():
    steps = [0, 1, 2, 4]
    curves = _curves({"flash": [[0, 1e-5, 1e-4, 1e-3]] * 3, "init": [[1.3, 1.3, 1.3, 1.3]] * 3}, steps)
    assert "no exponential window" in early.shift(curves, "init", "flash")["problem"]


def test_isotonic_inversion_places_a_value_between_rungs():
    assert list(early.isotonic([1.0, 3.0, 2.0, 4.0])) == [1.0, 2.5, 2.5, 4.0]
    sizes, values = np.array([1e-7, 1e-6, 1e-5, 1e-4]), np.array([1e-7, 1e-6, 1e-5, 1e-4])
    size, where = early.invert(sizes, values, 3e-6)
    assert where == "inside" and size == pytest.approx(3e-6)
    assert early.invert(sizes, values, 1e-8)[1] == "below" and early.invert(sizes, values, 1e-3)[1] == "above"


LADDER_STEPS = [0, 2, 4]
LADDER = {"ulp": ULP_RELATIVE, "eps_1e-6": 1e-6, "eps_1e-5": 1e-5, "eps_1e-4": 1e-4}


def _ladder_curves(floor: float, roles: dict[str, float], replicates: int = 6, seed: int = 0) -> dict:
    """D(step 2) = sqrt(size^2 + floor^2) x lognormal noise (3x that at step 4): sizes below `floor` cannot be told apart."""
    rng = np.random.default_rng(seed)
    spec = {}
    for role, size in {**LADDER, **roles}.items():
        d2 = math.hypot(size, floor)
        spec[role] = [[size, d2 * math.exp(rng.normal(0, 0.1)), 3 * d2 * math.exp(rng.normal(0, 0.1))] for _ in range(replicates)]
    return _curves(spec, LADDER_STEPS)


def _roles(extra=()):
    info = {role: {"ladder": {"name": "init", "size": "ulp" if role == "ulp" else size}} for role, size in LADDER.items()}
    return {**info, **{role: {"ladder": None} for role in extra}}


def test_the_floor_is_the_smallest_rung_told_apart_from_the_ulp_control():
    low = early.calibration(_ladder_curves(1e-9, {}), _roles(), None)
    assert low["step"] == 2 and low["floor"]["floor"] == 1e-6  # every rung resolved: the smallest one
    high = early.calibration(_ladder_curves(3e-5, {}), _roles(), None)
    assert high["floor"]["floor"] == 1e-4 and high["floor"]["bracket"] == [1e-5, 1e-4]
    none = early.floor_at(_ladder_curves(1e-3, {}), sorted(LADDER.items(), key=lambda x: x[1]), 2)
    assert none["floor"] is None and "no rung told apart" in none["text"]  # the rule can fail


def test_an_equivalent_size_recovers_a_planted_eps_and_says_below_the_floor():
    curves = _ladder_curves(1e-7, {"planted": 3e-5, "tiny": 1e-9}, seed=1)
    calib = early.calibration(curves, _roles(("planted", "tiny")), "planted")
    planted = calib["equivalent"]["init"]["planted"]
    estimate = stats.Estimate(**planted["estimate"])
    assert planted["status"] == "measured" and estimate.low < 3e-5 < estimate.high and estimate.method == stats.T
    tiny = calib["equivalent"]["init"]["tiny"]
    assert tiny["status"] == "below the floor" and tiny["text"].startswith("below the floor (< 1e-06)")


def _calibrated_summary(ratio: float) -> dict:
    """A summary whose flash and fp32 have measured equivalent sizes eps and ratio x eps."""
    curves = _ladder_curves(1e-9, {"flash": 2e-6, "fp32": 2e-6 * ratio}, seed=2)
    roles = _roles(("flash", "fp32"))
    calib = early.calibration(curves, roles, "flash")
    flash = {"steps": LADDER_STEPS, "values": {str(r): v[early.EARLY_METRIC] for r, (_, v) in curves["flash"].items()},
             "grows": {"status": HOLDS, "rule": "r", "detail": ""}}
    return {"primary_metric": early.EARLY_METRIC, "under_test": "flash", "calibration": calib, "ratios": {},
            "pairs": {"reference": {"flash": {early.EARLY_METRIC: flash}}}}, curves


@pytest.mark.parametrize("ratio, status", [(3.0, HOLDS), (1.0, FAILS)])
def test_fig8_on_equivalent_sizes_can_hold_and_can_fail(ratio, status):
    summary, curves = _calibrated_summary(ratio)
    verdict = claim_verdicts(summary, curves)["fig8"]
    assert verdict["status"] == status, verdict["detail"]
    assert "eps*(fp32) / eps*(flash)" in verdict["detail"]


def test_a_proxy_saturated_at_step_0_is_not_comparable_and_one_from_zero_is():
    saturated = _curves({"init": [[1.32, 1.32, 1.33]] * 3}, [0, 2, 4])["init"]
    verdict = early.saturation_verdict(saturated, "init")
    assert verdict.status == NOT_MEASURABLE and "not comparable: saturated at step 0" in verdict.detail
    assert early.saturation_verdict(_curves({"ulp": [[1e-7, 1e-3, 1e-2]] * 3}, [0, 2, 4])["ulp"], "ulp") is None


# ----------------------------------------------------------------------------- the ladder's perturbations


def test_a_relative_perturbation_has_the_size_it_says_and_its_own_seed():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 8))
    torch.nn.init.zeros_(model[0].bias)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    apply_init_perturbation(model, {"kind": "relative", "eps": 1e-4}, seed=7)
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    size = float((after - before).norm() / before.norm())
    assert size == pytest.approx(1e-4, rel=0.05)
    assert torch.all(after[before == 0] == 0)  # zero stays zero: relative to the initialisation's scale
    with pytest.raises(ValueError, match="init_perturbation.eps=2"):
        apply_init_perturbation(model, {"kind": "relative", "eps": 2}, seed=7)


def test_attention_output_noise_has_its_relative_size_and_is_reproducible():
    q = torch.randn(2, 2, 64, 16)
    clean = Eager()(q, q, q)
    first, second = OutputNoise(Eager(), delta=0.01, seed=3), OutputNoise(Eager(), delta=0.01, seed=3)
    noisy = first(q, q, q)
    relative = ((noisy - clean) / clean).flatten()
    assert float(relative.std()) == pytest.approx(0.01, rel=0.05)
    assert torch.equal(noisy, second(q, q, q)) and not torch.equal(first(q, q, q), noisy)  # own stream, advancing


# ----------------------------------------------------------------------------- schedule and snapshots


def test_the_log_schedule_has_its_steps_then_every_n():
    schedule = SnapshotSchedule(50, "log")
    assert schedule.steps(260) == [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 150, 200, 250, 260]
    assert SnapshotSchedule(50).steps(120) == [0, 50, 100, 120]
    with pytest.raises(ValueError, match="snapshot.schedule='cubic'"):
        SnapshotSchedule(50, "cubic")


def test_trained_only_snapshots_store_the_indexed_rows_and_load_whole(tmp_path):
    embedding = torch.randn(1000, 8)
    state0 = {"emb.weight": embedding, "w": torch.randn(4, 4)}
    writer = SnapshotWriter(tmp_path, "m", {k: list(v.shape) for k, v in state0.items()}, trained_only=True)
    rows = {"emb.weight": np.array([3, 10, 500])}
    writer.write(0, state0, trained_rows=rows)
    trained = embedding.clone()
    trained[[3, 10, 500]] += 1.0
    state1 = {"emb.weight": trained, "w": state0["w"] + 1}
    writer.write(1, state1, trained_rows=rows)
    moved = trained.clone()
    moved[7] += 1.0  # a row no caption indexes moved (weight decay): the whole tensor is kept
    writer.write(2, {"emb.weight": moved, "w": state1["w"]}, trained_rows=rows)
    entries = {e["step"]: e for e in read_index(tmp_path)["snapshots"]}
    assert entries[0].get("stored") is None and entries[1]["stored"] == TRAINED and entries[2].get("stored") is None
    sizes = {s: (tmp_path / "weights" / entries[s]["file"]).stat().st_size for s in entries}
    assert sizes[1] < sizes[0] / 20
    assert torch.equal(load_snapshot(tmp_path, 1)["emb.weight"], trained) and torch.equal(load_snapshot(tmp_path, 2)["emb.weight"], moved)
    (tmp_path / "weights" / "index.json").unlink()  # an index rebuilt from the files lists the trained-only one as such
    SnapshotWriter(tmp_path, "m", {k: list(v.shape) for k, v in state0.items()})
    assert {e["step"]: e.get("stored") for e in read_index(tmp_path)["snapshots"]}[1] == TRAINED
    assert torch.equal(load_snapshot(tmp_path, 1)["emb.weight"], trained)


# ----------------------------------------------------------------------------- on a micro model, bf16 (slow)

CALIBRATION_ROLES = "truth,reference,flash,ulp,eps_1e-6,eps_1e-5,eps_1e-4,eps_1e-3,eps_1e-2"
REPLICATES = 5


@pytest.fixture(scope="module")
def ladder_study(tmp_path_factory):
    """The early smoke study's micro model, bf16, 5 replicates of the init ladder, Flash and its
    reference, plus a planted role per replicate: an eps = 1e-4 init perturbation with its own seed."""
    root = tmp_path_factory.mktemp("early")
    study = root / "study"
    run_cli("numdev.train.app", "experiment=flash_stability_early_smoke", f"hydra.sweep.dir={study}",
            f"study={CALIBRATION_ROLES}", f"study.replicate=range(0,{REPLICATES})",
            cwd=root, timeout=1500)
    from numdev.train.run import train

    for r in range(REPLICATES):
        train(compose_train("experiment=flash_stability_early_smoke", "study=eps_1e-4", f"study.replicate={r}", "study.role=planted",
                            "study.ladder=null", f"seed.perturbation={7000 + r}", "trainer.enable_progress_bar=false",
                            run_dir=study / f"r{r}" / "planted", smoke=False))
    return study, analyse(study, log=lambda m: None, against_truth=False)


@pytest.mark.slow
def test_flash_is_told_apart_from_the_ulp_control_at_step_2_in_bf16(ladder_study):
    study, summary = ladder_study
    assert summary["precision"] == "bf16-mixed"
    ratio = stats.Estimate(**summary["early"]["ratios"]["ulp"]["2"]["estimate"])
    assert ratio.n == REPLICATES and ratio.method == stats.T and ratio.excludes(1.0) and ratio.high < 1, ratio.text()
    # The same from 3 replicates: an interval labelled as the range it is.
    three = study.parent / "three"
    for r in range(3):
        shutil.copytree(study / f"r{r}", three / f"r{r}", symlinks=True)
    small = analyse(three, log=lambda m: None, against_truth=False)
    assert "range of 3" in stats.Estimate(**small["early"]["ratios"]["ulp"]["2"]["estimate"]).text()


@pytest.mark.slow
def test_the_ladder_recovers_a_planted_eps(ladder_study):
    _, summary = ladder_study
    calib = summary["calibration"]
    planted = calib["equivalent"]["init"]["planted"]
    assert planted["status"] == "measured", planted["text"]
    estimate = stats.Estimate(**planted["estimate"])
    assert estimate.n == REPLICATES and estimate.low <= 1e-4 <= estimate.high, (calib["step"], planted["text"])
    assert json.loads(json.dumps(summary["headline"]))["text"].startswith(f"at step {calib['step']}")


def test_the_low_floor_study_trains_its_reference_in_fp32_and_flash_as_the_kernel_keeps_bf16():
    def role(name):
        return compose_train("experiment=flash_stability_lowfloor", f"study={name}", "run_dir=/tmp/x", smoke=False)

    reference, flash, bf16, attention = role("reference"), role("flash"), role("bf16"), role("bf16_attention")
    assert reference.precision.name == "fp32" and reference.attention._target_ == "numdev.attention.Eager"
    assert reference.attention.precision == "fp32" and reference.attention.dtype is None  # no autocast: fp32 attention
    assert flash.precision.name == "fp32" and flash.attention._target_ == "numdev.attention.SdpaFlash" and flash.attention.dtype == "bf16"
    assert bf16.precision.name == "bf16-mixed" and bf16.study.paper == "low_precision"
    assert attention.precision.name == "fp32" and attention.attention.precision == "bf16-mixed"


def test_the_claim_verdicts_pass_the_study_summary_schema_the_report_reads():
    """What the analysis writes under `verdicts` (the parts and the metric's name) is what
    numdev-report's validating reader accepts (numdev.runs.schemas.STUDY_SUMMARY)."""
    from numdev.runs import schemas

    summary, curves = _calibrated_summary(3.0)
    verdicts = claim_verdicts(summary, curves)
    assert schemas.STUDY_VERDICTS.check("summary.json", verdicts, "verdicts.", "study summary") == verdicts
    with pytest.raises(ValueError, match="field 'verdicts.fig7' holds a string"):
        schemas.STUDY_VERDICTS.check("summary.json", {**verdicts, "fig7": "holds"}, "verdicts.", "study summary")
