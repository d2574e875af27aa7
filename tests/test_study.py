"""The flash-stability study: its roles, its controls, its statistics, and the whole study through
the real command line (experiment=flash_stability_smoke: every role, two replicates, a micro model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import REPO, compose_train, console_noise, flat_config, run_cli

from numdev.analysis.study import analyse, ratio_of_growths
from numdev.analysis.study_runs import KIND_ORDER
from numdev.models.perturb import perturb_one_ulp
from numdev.report.app import build_report
from numdev.stats.verdicts import FAILS, HOLDS, NOT_MEASURABLE
from numdev.weights.metrics import read_distances_csv as read_csv
from numdev.weights.store import load_snapshot

ROLE_FILES = sorted((REPO / "conf" / "train" / "study").glob("*.yaml"))


# ----------------------------------------------------------------------------- fast: roles, controls, rules


def _sweep(experiment: str) -> list[str]:
    return yaml.safe_load((REPO / "conf" / "train" / "experiment" / f"{experiment}.yaml").read_text())["hydra"]["sweeper"]["params"]["study"].split(",")


def test_every_role_is_one_file_and_the_study_sweeps_each_once():
    """The early study sweeps every flash-stability role file once (the ladder included); the full study a subset, in
    the same order; the harm study sweeps its own roles and names the ones that extend it (study.more_roles)."""
    order, low_floor, full = _sweep("flash_stability_early"), _sweep("flash_stability_lowfloor"), _sweep("flash_stability")
    catalogue = _sweep("optimizations")  # experiment=optimizations (docs/optimizations.md)
    torchao = _sweep("optimizations_torchao")  # torchao's own linears beside numdev's emulations
    harm_config = yaml.safe_load((REPO / "conf" / "train" / "experiment" / "harm.yaml").read_text())
    harm = _sweep("harm") + list(harm_config["study"]["more_roles"])
    assert set(order) | set(low_floor) | set(catalogue) | set(torchao) | set(harm) == {p.stem for p in ROLE_FILES}, \
        "a role file no study sweeps, or a sweep naming no file"
    for sweep in (order, low_floor, full, catalogue):
        assert len(set(sweep)) == len(sweep) and sweep[:2] == ["truth", "reference"]
    assert len(set(harm)) == len(harm) and harm[0] == "reference"
    assert full == [r for r in order if r in full]
    assert not {r for r in full if yaml.safe_load((REPO / "conf" / "train" / "study" / f"{r}.yaml").read_text())["study"]["kind"] == "ladder"}
    kinds = {}
    for path in ROLE_FILES:
        block = yaml.safe_load(path.read_text())["study"]
        assert block["role"] == path.stem and block["kind"] in KIND_ORDER and block["label"]
        kinds[path.stem] = block["kind"]
    assert list(kinds.values()).count("reference") == 1
    assert [r for r in order if kinds[r] == "under_test"] == ["flash"]  # the flash-stability study judges one role


@pytest.mark.parametrize("role, changed", [
    ("data", {"seed.data": 1001, "data.seed": 1001}), ("noise", {"seed.noise": 1001}), ("init", {"seed.init": 1001}),
    ("ulp", {"init_perturbation": "ulp"}), ("fp32", {"precision.name": "fp32"}), ("flash", {"attention._target_": "numdev.attention.SdpaFlash"}),
    ("truth", {"attention.dtype": "fp32"}),
    ("eps_1e-4", {"init_perturbation.kind": "relative", "init_perturbation.eps": 1e-4}),
    ("delta_3e-2", {"attention._target_": "numdev.attention.OutputNoise", "attention.delta": 3e-2}),
])
def test_each_role_changes_only_what_it_says(role, changed):
    """Against the reference of the same replicate, a role differs in its own keys and nothing that trains."""
    def flat(role_name):
        return flat_config("experiment=flash_stability", f"study={role_name}", "study.replicate=1", smoke=False)

    reference, other = flat("reference"), flat(role)
    assert reference["seed.init"] == reference["seed.data"] == reference["seed.noise"] == 1
    ignored = ("study.", "sibling.", "shadow", "callbacks.sibling.", "callbacks.shadow.")
    # The reference also writes its sorted values beside its snapshots, for the others to read: not training.
    speed_only = {"snapshot.sorted_values", "callbacks.snapshots.sorted_values"}
    differ = {k for k in set(reference) | set(other)
              if reference.get(k) != other.get(k) and not k.startswith(ignored) and k not in speed_only}
    expected = set(changed)
    if role == "fp32":  # the precision group: its name, compute dtype and plugin, and the attention that reads it
        expected |= {k for k in differ if k.startswith(("precision.", "attention.precision"))}
    if role in ("flash", "delta_3e-2"):  # another backend: its own keys replace Eager's
        expected |= {k for k in differ if k.startswith("attention.")}
    assert differ == expected
    for key, value in changed.items():
        assert other[key] == value


def test_one_ulp_moves_every_weight_by_exactly_its_spacing():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.LayerNorm(32))
    torch.nn.init.zeros_(model[0].bias)  # zeros go to the smallest subnormal
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    perturb_one_ulp(model)
    for name, p in model.named_parameters():
        w = before[name].numpy()
        assert np.array_equal(np.abs(p.detach().numpy() - w), np.spacing(np.abs(w)))


def _growth(slopes, grows=HOLDS):
    return {"replicates": list(range(len(slopes))), "per_replicate": {str(i): {"slope": s} for i, s in enumerate(slopes)},
            "grows": {"status": grows, "rule": "r", "detail": ""}}


def test_a_ratio_to_a_flat_curve_is_not_measurable_whatever_its_value():
    """The old report's 'init/Flash = -0.2x' of a flat curve."""
    flat = _growth([-2e-8, 1e-8, -1.5e-8], grows=NOT_MEASURABLE)
    ratio = ratio_of_growths(flat, _growth([8e-8, 9e-8, 7e-8]), "init/flash")
    assert ratio["verdict"]["status"] == NOT_MEASURABLE and "does not grow" in ratio["verdict"]["detail"]
    assert ratio["estimate"]["value"] == pytest.approx(-0.104, rel=0.05)


def test_a_ratio_is_judged_on_its_interval():
    flash = _growth([1.0e-7, 1.1e-7, 0.9e-7, 1.05e-7, 0.95e-7])
    above = ratio_of_growths(_growth([3e-7, 3.2e-7, 2.9e-7, 3.1e-7, 3.05e-7]), flash, "fp32/flash")
    assert above["verdict"]["status"] == HOLDS and above["excludes_one"]
    below = ratio_of_growths(_growth([0.3e-7, 0.35e-7, 0.28e-7, 0.31e-7, 0.29e-7]), flash, "ulp/flash")
    assert below["verdict"]["status"] == FAILS and below["excludes_one"]
    straddles = ratio_of_growths(_growth([0.5e-7, 1.6e-7, 0.7e-7, 1.5e-7, 1.0e-7]), flash, "data/flash")
    assert straddles["verdict"]["status"] == NOT_MEASURABLE and not straddles["excludes_one"]
    one = ratio_of_growths(_growth([3e-7]), _growth([1e-7]), "fp32/flash")
    assert one["verdict"]["status"] == NOT_MEASURABLE and not one["excludes_one"]


@pytest.mark.parametrize("n", [3, 4])
def test_a_ratio_from_3_or_4_replicates_shows_its_range_and_carries_no_verdict(n):
    """The ratios above, on their first 3 or 4 replicates: a range, no verdict, no 'excludes 1'; and a
    curve whose growth is unjudged only because its slope's spread is a range is not called flat."""
    from numdev.analysis.study import growth_of
    from numdev.stats.verdicts import RANGE_NO_VERDICT

    flash = _growth([1.0e-7, 1.1e-7, 0.9e-7, 1.05e-7][:n])
    for top in ([3e-7, 3.2e-7, 2.9e-7, 3.1e-7], [0.3e-7, 0.35e-7, 0.28e-7, 0.31e-7]):
        ratio = ratio_of_growths(_growth(top[:n]), flash, "r/flash")
        assert ratio["verdict"]["status"] == NOT_MEASURABLE and not ratio["excludes_one"], ratio
        assert f"[range of {n}: " in ratio["verdict"]["detail"] and RANGE_NO_VERDICT in ratio["verdict"]["detail"]
    # Real growth fits: the slopes' spread is a range, so "grows" is not measurable, but not "does not grow".
    steps = list(range(0, 60, 6))
    rising = {r: (steps, {"m": [s * (1 + 0.1 * r) * 1e-7 for s in steps]}) for r in range(n)}
    faster = {r: (steps, {"m": [s * (3 + 0.1 * r) * 1e-7 for s in steps]}) for r in range(n)}
    a, b = growth_of(faster, "m"), growth_of(rising, "m")
    assert a["grows"]["status"] == NOT_MEASURABLE and RANGE_NO_VERDICT in a["grows"]["detail"]
    ratio = ratio_of_growths(a, b, "fast/flash")
    assert RANGE_NO_VERDICT in ratio["verdict"]["detail"] and "does not grow" not in ratio["verdict"]["detail"]
    from numdev.report.study import _side_of_one
    from numdev.stats.verdicts import Verdict

    assert _side_of_one(Verdict(**ratio["verdict"])) == "not measurable: a range from fewer than 5 replicates"


def test_a_summarys_verdicts_are_made_again_from_its_own_numbers():
    """numdev.analysis.study.rejudge (for the committed summaries, whose runs are not committed): on the
    10-replicate early study it gives back what analyse wrote; on the 3-replicate full study, ranges
    and no verdicts, every number as it was."""
    from numdev.analysis.study import rejudge
    from numdev.stats.verdicts import RANGE_NO_VERDICT

    results = REPO / "docs" / "results"
    early = json.loads((results / "flash_stability_early_summary.json").read_text(encoding="utf-8"))
    assert len(early["replicates"]) == 10 and rejudge(early) == early
    full = json.loads((results / "flash_stability_summary.json").read_text(encoding="utf-8"))
    again = rejudge(full)
    assert len(full["replicates"]) == 3
    fig7 = again["verdicts"]["fig7"]
    assert fig7["status"] == NOT_MEASURABLE and fig7["detail"].count(RANGE_NO_VERDICT) == 2 and "[range of 3: " in fig7["detail"]
    assert again["verdicts"]["fig8_late"]["status"] == NOT_MEASURABLE
    for key, by_metric in again["ratios"].items():
        for metric, entry in by_metric.items():
            assert entry["verdict"]["status"] == NOT_MEASURABLE and not entry["excludes_one"], (key, metric)
            assert entry["estimate"] == full["ratios"][key][metric]["estimate"]
    for role, pair in again["pairs"]["reference"].items():
        for metric in again["metrics"]:
            assert pair[metric]["grows"]["status"] == NOT_MEASURABLE and pair[metric]["slope"] == full["pairs"]["reference"][role][metric]["slope"]
    assert "✓" not in " ".join(again["captions"].values()) and "✗" not in " ".join(again["captions"].values())


def test_the_jobs_a_study_lacks_are_named_from_its_sweep_and_its_replicates(tmp_path):
    """A role missing at one replicate, a role the sweep lists that never ran, a replicate given on the
    command line (range() and lists in Hydra's own grammar)."""
    from numdev.analysis.study_runs import missing_jobs

    runs = {"reference": {0: {}, 1: {}}, "flash": {0: {}, 1: {}}, "data": {0: {}}}
    assert missing_jobs(tmp_path, runs) == ["r1/data"]  # no multirun.yaml: the replicates the other roles have
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {
        "sweeper": {"params": {"study": "reference,flash,data,ulp", "study.replicate": "range(0,5)"}},
        "overrides": {"task": ["experiment=flash_stability", "study.replicate=0,1,2"]}}}))
    assert missing_jobs(tmp_path, runs) == ["r0/ulp", "r1/data", "r1/ulp", "r2/data", "r2/flash", "r2/reference", "r2/ulp"]
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"sweeper": {"params": {"study": "reference,(flash"}}}}))
    with pytest.raises(ValueError, match=r"multirun.yaml: its sweep of study .* cannot be read"):
        missing_jobs(tmp_path, runs)


# ----------------------------------------------------------------------------- the whole study (minutes: slow)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    result = run_cli("numdev.train.app", "experiment=flash_stability_smoke", f"hydra.sweep.dir={root / 'study'}", cwd=root, timeout=900)
    return root / "study", result


ROLES = _sweep("flash_stability")  # the roles experiment=flash_stability(_smoke) runs (the ladder runs in the early study)


@pytest.mark.slow
def test_the_smoke_study_runs_every_role_twice_and_writes_intervals(study):
    study_dir, result = study
    for replicate in (0, 1):
        for role in ROLES:
            record = json.loads((study_dir / f"r{replicate}" / role / "run.json").read_text())
            assert record["status"] == "finished" and record["final_step"] == 6
            assert record["seeds"]["init"] == (1000 + replicate if role == "init" else replicate)
    summary = json.loads((study_dir / "summary.json").read_text())
    assert summary["replicates"] == [0, 1] and set(summary["roles"]) == set(ROLES)
    assert summary["provenance"]["machine"]["cpu"] and summary["provenance"]["git"]["commit"]
    assert summary["reference_backend"] == "eager" and summary["under_test_backend"] == "sdpa_flash"
    metric = summary["primary_metric"]
    assert set(summary["pairs"]["reference"]) == set(ROLES) - {"reference", "truth"}
    assert set(summary["pairs"]["truth"]) == set(ROLES) - {"truth"}
    for role, pair in summary["pairs"]["reference"].items():
        slope = pair[metric]["slope"]
        assert slope["n"] == 2 and slope["low"] is None and slope["high"] is None, role  # R=2: no interval (numdev.stats.intervals.MIN_SEEDS)
    for name, ratio in summary["ratios"].items():
        entry = ratio[metric]
        assert isinstance(entry["excludes_one"], bool) and entry["verdict"]["status"] in (HOLDS, FAILS, NOT_MEASURABLE), name
    assert summary["verdicts"]["fig7"]["status"] and summary["verdicts"]["fig8"]["rule"]
    assert set(summary["downstream"]["heldout_loss"]["roles"]) == set(ROLES)
    for figure in ("fig7.png", "fig8.png", "loss_curves.png", "downstream.png"):
        assert (study_dir / figure).stat().st_size > 20_000
    assert "Growth-rate ratios" in result.stdout and " --logdir " in result.stdout


@pytest.mark.slow
def test_the_study_says_only_what_numdev_means_and_each_role_logs_its_story(study):
    study_dir, result = study
    # No library noise (Hydra's deprecation, Lightning's hints, TensorBoard's directory watcher, loky's
    # leaked folder) and no "[n/a: ...]" after every number of a summary line.
    assert console_noise(result.stdout, result.stderr) == [], result.stdout + result.stderr
    assert result.stderr == ""
    assert result.stdout.count("finished at step 6 -> ") == len(ROLES) * 2
    named = [line.split("-> ", 1)[1] for line in result.stdout.splitlines() if line.startswith("-> ") and "summary.json" in line]
    assert named, result.stdout
    files = named[-1].split(", ")
    assert all((study_dir / Path(name).name).is_file() for name in files), files  # the console names only files that exist
    story = (study_dir / "r0" / "reference" / "app.log").read_text()
    assert f"[numdev.train.run][DEBUG] - training {study_dir / 'r0' / 'reference'}: " in story
    assert "[numdev.train.app][INFO] - finished at step 6" in story and "`Trainer.fit` stopped" in story


@pytest.mark.slow
def test_the_controls_start_where_they_should(study):
    study_dir, _ = study
    reference = load_snapshot(study_dir / "r0" / "reference", 0)
    for role in ("flash", "data", "noise", "fp32"):  # the same start, bit for bit
        other = load_snapshot(study_dir / "r0" / role, 0)
        assert all(torch.equal(reference[n], other[n]) for n in reference), role
    ulp = load_snapshot(study_dir / "r0" / "ulp", 0)
    for name, w in reference.items():  # exactly one ulp per element
        assert np.array_equal(np.abs(ulp[name].numpy() - w.numpy()), np.spacing(np.abs(w.numpy()))), name
    init = load_snapshot(study_dir / "r0" / "init", 0)
    assert any(not torch.equal(reference[n], init[n]) for n in reference)
    rows = read_csv(study_dir / "r0" / "data" / "sibling" / "reference.csv")
    assert [r["max_abs"] for r in rows if r["step"] == 0 and r["tensor"] == "__model__"] == [0.0]


@pytest.mark.slow
def test_the_analysis_falls_back_to_snapshots_and_agrees(study, tmp_path):
    study_dir, _ = study
    live = json.loads((study_dir / "summary.json").read_text())
    moved = []
    for csv in study_dir.glob("r*/*/sibling/reference.csv"):
        target = tmp_path / f"{csv.parent.parent.parent.name}_{csv.parent.parent.name}.csv"
        csv.rename(target)
        moved.append((target, csv))
    try:
        offline = analyse(study_dir, log=lambda m: None)
    finally:
        for target, csv in moved:
            target.rename(csv)
    metric = live["primary_metric"]
    for role, pair in live["pairs"]["reference"].items():
        assert offline["pairs"]["reference"][role][metric]["values"] == pair[metric]["values"], role


@pytest.mark.slow
def test_the_report_shows_verdicts_loss_curves_samples_and_the_terminals_scores(study, tmp_path):
    study_dir, result = study
    page = build_report([], study_dir, tmp_path / "report").read_text()
    assert "Fig. 7" in page and "Fig. 8" in page and "Downstream" in page
    assert "loss_curves.png" in page and page.count("samples at step 6 with their captions") == len(ROLES)
    assert "not measurable" in page or "holds" in page or "fails" in page
    assert "numdev-train experiment=flash_stability_smoke" in page
    # The terminal and the report give the same agreement scores for the same run.
    record = json.loads((study_dir / "r0" / "reference" / "run.json").read_text())["eval"]
    line = (f"colour {record['colour_accuracy']:.0%} (chance 17%), shape {record['shape_accuracy']:.0%} (chance 33%), "
            f"position {record['position_accuracy']:.0%} (chance 11%)")  # each beside what a guess scores
    assert line in result.stdout and line in page


@pytest.mark.slow
def test_the_report_renders_in_a_real_browser(study, tmp_path):
    import shutil
    import subprocess
    import sys

    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")):
        pytest.skip("no headless Chromium on this machine (apt install chromium)")
    index = build_report([], study[0], tmp_path / "report")
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "screenshot_report.py"), str(index)],
        capture_output=True, text=True, timeout=300, check=True,
    )
    shot = json.loads(result.stdout)
    sections = index.read_text().count("<section")  # Figs. 7 and 8, loss curves, samples, downstream
    assert sections >= 4 and shot["sections_in_dom"] == sections and shot["images_in_dom"] >= 4 + len(ROLES)
    assert shot["non_background_fraction"] > 0.05


def test_held_out_loss_is_reproducible_and_sees_other_weights(tmp_path):
    from numdev.data.shapes import ShapesDataModule
    from numdev.train.run import train

    losses = {}
    for name, extra in (("a", []), ("b", []), ("init", ["seed.init=1"])):
        train(compose_train("attention=eager", *extra, run_dir=tmp_path / name))
        record = json.loads((tmp_path / name / "heldout.json").read_text())
        assert record["images"] == 256 and 0 < record["heldout_loss"] < 10
        losses[name] = record["heldout_loss"]
    assert losses["a"] == losses["b"] and losses["init"] != losses["a"]
    data = ShapesDataModule(resolution=16)
    data.setup()
    heldout = data.heldout_dataset(8)
    assert all(not torch.equal(heldout[i]["image"], data.dataset[i]["image"]) for i in range(8))


@pytest.mark.slow
def test_a_study_missing_a_job_is_refused_by_name_and_analysed_with_partial(study, tmp_path):
    """numdev-study on a study one of whose jobs has no run: one line naming r<replicate>/<role>;
    with --partial the summary and the report list it."""
    study_dir, _ = study
    copy = tmp_path / "copy"
    shutil.copytree(study_dir, copy, ignore=shutil.ignore_patterns("summary.json", "*.png"))
    victim = sorted(copy.glob("r*/flash"))[-1]
    shutil.rmtree(victim)
    name = f"{victim.parent.name}/flash"
    refused = run_cli("numdev.analysis.study", str(copy), cwd=tmp_path, check=False)
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0, refused.stderr
    assert f"1 job(s) of the study have no run: {name}" in refused.stderr and not (copy / "summary.json").exists()
    run_cli("numdev.analysis.study", str(copy), "--partial", cwd=tmp_path)
    assert json.loads((copy / "summary.json").read_text())["missing"] == [name]
    assert f"Analysed without 1 job(s) of the study (numdev-study --partial): {name}" in build_report([], copy, tmp_path / "r").read_text()
