"""The flash-stability study through the real command line, on a micro model, and its analysis."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from numdev.analysis.compare import read_csv
from numdev.analysis.study import analyse
from numdev.report.app import build_report

# experiment=train_smoke's micro model, spelled as overrides (one experiment per command line).
MICRO = [
    "model.name=dit_micro", "model.hidden=32", "model.depth=1", "model.heads=2", "model.patch=4",
    "model.text.width=32", "model.text.heads=2", "model.text.layers=1", "model.text.context_length=16",
    "model.text.output_dim=32", "data.resolution=16", "data.batch_size=4", "trainer.max_steps=6",
    "snapshot.every_n_steps=2", "callbacks.shadow.every_n_steps=2", "callbacks.samples.num_samples=4",
    "diffusion.sampler.steps=2", "optim.warmup_steps=0", "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    result = run_cli("numdev.train.app", "experiment=flash_stability", f"hydra.sweep.dir={root / 'study'}", *MICRO, cwd=root)
    return root / "study", result


def test_the_study_runs_four_siblings_and_writes_the_summary(study):
    study_dir, result = study
    assert "low-precision/Flash" in result.stdout and "TensorBoard: " in result.stdout and " --logdir " in result.stdout
    for role in ("reference", "flash", "init", "fp32"):
        record = json.loads((study_dir / role / "run.json").read_text())
        assert record["status"] == "finished" and record["final_step"] == 6
    assert json.loads((study_dir / "flash" / "run.json").read_text())["backend"] == "sdpa_flash"
    assert json.loads((study_dir / "fp32" / "run.json").read_text())["precision"] == "fp32"
    summary = json.loads((study_dir / "summary.json").read_text())
    assert summary["pair_precision"] == "bf16-mixed" and summary["steps"] == 6
    assert set(summary["pairs"]) == {"flash", "init", "low_precision"}
    flash = summary["pairs"]["flash"]
    assert flash["steps"] == [0, 2, 4, 6]
    assert flash["wasserstein"][0] == 0.0 and flash["max_abs"][0] == 0.0  # same start
    assert flash["max_abs"][-1] > 0
    assert summary["pairs"]["init"]["max_abs"][0] > 0  # another start
    assert summary["shadow"]["out"]["max_abs"] > 0 and summary["shadow"]["dq"]["calls"] > 0
    assert "OLS" in summary["fit_method"] or "least-squares" in summary["fit_method"]
    for figure in ("fig7.png", "fig8.png"):
        assert (study_dir / figure).stat().st_size > 20_000


def test_the_analysis_falls_back_to_snapshots_and_agrees(study, tmp_path):
    study_dir, _ = study
    live = json.loads((study_dir / "summary.json").read_text())
    # Without the live CSVs (an offline launcher, or the callback switched off) the snapshots give the same curves.
    for role in ("flash", "init", "fp32"):
        (study_dir / role / "sibling" / "reference.csv").rename(tmp_path / f"{role}.csv")
    try:
        offline = analyse(study_dir, log=lambda m: None)
    finally:
        for role in ("flash", "init", "fp32"):
            (tmp_path / f"{role}.csv").rename(study_dir / role / "sibling" / "reference.csv")
    for pair in ("flash", "init", "low_precision"):
        assert offline["pairs"][pair]["wasserstein"] == live["pairs"][pair]["wasserstein"]
        assert offline["pairs"][pair]["max_abs"] == live["pairs"][pair]["max_abs"]


def test_the_report_shows_the_study(study, tmp_path):
    study_dir, _ = study
    index = build_report([], study_dir, tmp_path / "report")
    page = index.read_text()
    assert "Fig. 7" in page and "Fig. 8" in page and "low precision/Flash" in page
    assert page.count("data:image/png;base64,") == 2
    assert "numdev-train experiment=flash_stability" in page


def test_a_directory_that_is_not_a_study_is_a_one_line_error(tmp_path):
    result = run_cli("numdev.analysis.study", str(tmp_path), cwd=tmp_path, check=False)
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0 and "is not a finished study" in result.stderr


def test_the_report_renders_in_a_real_browser(study, tmp_path):
    import shutil
    import subprocess
    import sys

    from conftest import REPO

    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")):
        pytest.skip("no headless Chromium on this machine (apt install chromium)")
    index = build_report([], study[0], tmp_path / "report")
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "screenshot_report.py"), str(index)],
        capture_output=True, text=True, timeout=300, check=True,
    )
    shot = json.loads(result.stdout)
    assert shot["sections_in_dom"] == 2 and shot["images_in_dom"] == 2
    assert shot["non_background_fraction"] > 0.05  # text and figures, not a blank page


def test_the_study_runs_in_parallel_under_the_joblib_launcher(tmp_path):
    """Siblings launched side by side: the comparing runs wait for the reference's snapshots."""
    study_dir = tmp_path / "parallel"
    run_cli("numdev.train.app", "experiment=flash_stability", "hydra/launcher=joblib", f"hydra.sweep.dir={study_dir}",
            "threads=1", *MICRO, cwd=tmp_path)
    # flash started before the reference had written its last snapshot: they ran at the same time
    flash_started = (study_dir / "flash" / "config.yaml").stat().st_mtime_ns
    reference_done = (study_dir / "reference" / "weights" / "step_00000006.safetensors").stat().st_mtime_ns
    assert flash_started < reference_done
    rows = read_csv(study_dir / "flash" / "sibling" / "reference.csv")
    assert sorted({r["step"] for r in rows}) == [0, 2, 4, 6]
    summary = json.loads((study_dir / "summary.json").read_text())
    assert summary["pairs"]["flash"]["steps"] == [0, 2, 4, 6]
