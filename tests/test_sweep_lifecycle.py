"""The lifecycle of a parallel sweep and of the study (hydra/launcher=parallel, numdev.cli.launcher): a
failed analysis exits non-zero, SIGTERM / Ctrl-C / a SIGKILLed worker end the sweep with every run.json
final and no process left behind, a value listed twice is found (the refusal itself is the bad-input
catalogue's train-sweep-lists-a-job-twice), and a comparing run stops waiting for a dead reference and
honours SIGTERM while it waits.

Real signals to the real numdev-train command; every wait is on observable state (a snapshot index,
a run lock, a record), with a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import error_lines, kill_session, no_process_left, run_numdev, snapshot_hashes, start_numdev, wait_until
from omegaconf import OmegaConf

from numdev.cli.sweep_jobs import duplicate_values

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

# The study's first roles on the micro model, running until stopped (max_steps far beyond the test).
ENDLESS_STUDY = ["experiment=flash_stability_smoke", "study.replicate=0", "trainer.max_steps=100000",
                 "snapshot.every_n_steps=20", "callbacks.checkpoint.every_n_steps=20"]


def _snapshot_steps(run_dir: Path) -> list[int]:
    return list(snapshot_hashes(run_dir))


def _wait_for(process, reached, what: str, timeout_s: float = 300) -> None:
    try:
        wait_until(reached, what, process, timeout_s)
    except AssertionError:
        kill_session(process)
        raise


def _statuses(sweep: Path) -> dict[str, str]:
    return {str(p.parent.relative_to(sweep)): json.loads(p.read_text())["status"] for p in sorted(sweep.glob("**/run.json"))}


# ----------------------------------------------------------------------------- refused before it starts


def test_a_value_listed_twice_is_found_in_the_command_line_and_in_the_config():
    assert "study.replicate=0,0" in duplicate_values(["study=truth,reference", "study.replicate=0,0"])
    assert "lists 1 more than once" in duplicate_values(["seed.init=0,1,2,1"])
    assert duplicate_values(["study=truth,reference", "study.replicate=0,1", "threads=1"]) is None
    # The command line replaces a key the config's sweeper params set (as Hydra's basic sweeper does).
    assert duplicate_values(["study.replicate=0,0", "study.replicate=0,1"]) is None
    assert duplicate_values(["study.replicate=0,1", "study.replicate=3"]) is None


# ----------------------------------------------------------------------------- the analysis


def test_a_study_whose_analysis_cannot_run_exits_non_zero_with_one_line(tmp_path, capsys):
    from numdev.analysis.sweep_end import SweepEnd

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})  # a study with no finished role
    with pytest.raises(SystemExit) as stopped:
        SweepEnd(study=True).on_multirun_end(config)
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("numdev-train: error: the study's analysis did not run: ")
    assert not (tmp_path / "summary.json").exists()


def test_an_analysis_that_breaks_is_not_swallowed_as_a_warning(tmp_path, capsys, monkeypatch):
    """Hydra only warns about an exception in a callback and exits 0: the study's analysis turns any
    failure into one line and exit 1."""
    from numdev.analysis import sweep_end

    def broken(*args, **kwargs):
        raise KeyError("fig7")

    monkeypatch.setattr(sweep_end, "analyse", broken)
    with pytest.raises(SystemExit) as stopped:
        sweep_end.SweepEnd(study=True).on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert stopped.value.code == 1
    assert capsys.readouterr().err.startswith("numdev-train: error: the study's analysis failed (KeyError: 'fig7')")


# ----------------------------------------------------------------------------- signals to a running study


def _start_study(tmp_path: Path, roles: str, *extra: str) -> tuple[subprocess.Popen, Path]:
    sweep = tmp_path / "study"
    process = start_numdev("numdev-train", *ENDLESS_STUDY, f"study={roles}", f"hydra.sweep.dir={sweep}", *extra, cwd=tmp_path, new_session=True)
    return process, sweep


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_a_stopped_study_leaves_every_record_final_and_no_process_behind(how, tmp_path):
    process, sweep = _start_study(tmp_path, "truth,reference")
    try:
        # Both roles training: the reference has compared a snapshot beyond step 0 with the truth's.
        _wait_for(process, lambda: max(_snapshot_steps(sweep / "r0" / "reference"), default=0) > 0, "both roles training")
        if how == "SIGTERM":
            process.send_signal(signal.SIGTERM)
        else:  # the terminal's Ctrl-C: SIGINT to the whole foreground process group, workers included
            os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=240)
    finally:
        kill_session(process)
    signum = signal.SIGTERM if how == "SIGTERM" else signal.SIGINT
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert error_lines(stderr)[-1] == (
        f"numdev-train: error: the sweep was stopped by {signum.name}; to continue, rerun the same command with hydra.sweep.dir={sweep} resume=auto")
    assert _statuses(sweep) == {"r0/truth": "failed", "r0/reference": "failed"}
    for role in ("truth", "reference"):  # each stopped by the SIGTERM the launcher forwarded, and resumable
        assert json.loads((sweep / "r0" / role / "run.json").read_text())["error"].startswith("interrupted by SIGTERM at step ")
    assert no_process_left(process.pid) == []


@pytest.mark.slow
def test_a_killed_worker_is_one_line_naming_its_job_and_every_record_is_final(tmp_path):
    process, sweep = _start_study(tmp_path, "truth,reference,flash", "hydra.launcher.n_jobs=3")
    try:
        _wait_for(process, lambda: _snapshot_steps(sweep / "r0" / "flash") != [], "all three roles training")
        worker = int((sweep / "r0" / "reference" / ".lock").read_text())  # the run lock names its process
        os.kill(worker, signal.SIGKILL)
        _, stderr = process.communicate(timeout=240)
    finally:
        kill_session(process)
    assert process.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr and "TerminatedWorkerError" not in stderr, stderr[-3000:]
    last = error_lines(stderr)[-1]
    assert last.startswith("numdev-train: error: job #1 (study=reference study.replicate=0 ") and "was killed (SIGKILL" in last
    assert last.endswith(f"to continue, rerun the same command with hydra.sweep.dir={sweep} resume=auto")
    assert set(_statuses(sweep).values()) == {"failed"} and len(_statuses(sweep)) == 3
    killed = json.loads((sweep / "r0" / "reference" / "run.json").read_text())
    assert killed["error"].startswith("interrupted: its process ended without recording it")
    assert no_process_left(process.pid) == []


# ----------------------------------------------------------------------------- a run waiting for its reference


def _comparing_run(tmp_path: Path, reference: Path) -> list[str]:
    return ["experiment=train_smoke", "trainer.max_steps=4", f"sibling.reference={reference}", "sibling.timeout_s=600",
            "callbacks.samples.num_samples=2", "threads=1", f"hydra.run.dir={tmp_path / 'run'}"]


def test_a_run_stops_waiting_for_a_dead_reference(tmp_path):
    reference = tmp_path / "reference"
    reference.mkdir()
    # What a SIGKILLed run leaves: run.json "running", its run lock held by no process.
    (reference / "run.json").write_text(json.dumps({"status": "running"}))
    (reference / ".lock").write_text("12345\n")
    result = run_numdev("numdev-train", *_comparing_run(tmp_path, reference), cwd=tmp_path)  # its timeout: half of sibling.timeout_s
    assert result.returncode == 2, result.stderr[-3000:]  # a sibling that cannot be compared with: exit 2
    (line,) = error_lines(result.stderr)  # not "no snapshot at step 0 after waiting 600 s": it did not wait
    assert f"sibling {reference} is dead: its run.json says running but no process holds its run lock" in line
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "failed"


def test_a_run_waiting_for_its_reference_honours_sigterm(tmp_path):
    from numdev.runs.lock import RunLock

    reference = tmp_path / "reference"  # a live run with no snapshot yet: the run waits for its snapshot of step 0
    reference.mkdir()
    (reference / "run.json").write_text(json.dumps({"status": "running"}))
    lock = RunLock(reference).acquire()  # (a reference that does not exist is refused at once: test_reliability_3.py)
    process = start_numdev("numdev-train", *_comparing_run(tmp_path, reference), cwd=tmp_path, new_session=True)
    run_dir = tmp_path / "run"
    try:
        _wait_for(process, lambda: _snapshot_steps(run_dir) == [0], "waiting at step 0")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        kill_session(process)
        lock.release()
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "failed" and run["error"] == "interrupted by SIGTERM at step 0"


@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=parallel", "hydra.launcher.n_jobs=2"]], ids=["basic", "parallel"])
def test_a_stopped_run_is_one_result_of_its_sweep_the_others_run_and_the_command_exits_1(launcher, tmp_path):
    """A learning-rate sweep's diverged run (callbacks.instability.policy=stop) once ended the whole sweep: Hydra's
    basic launcher stops at the first job that exits non-zero, so every job after it was lost."""
    sweep = tmp_path / "sweep"
    result = run_numdev("numdev-train", "-m", "experiment=train_smoke", *launcher, "callbacks.instability.policy=stop",
                        "optim.optimizer.lr=1e30,1e-3", "trainer.max_steps=4", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    records = {job: json.loads((sweep / job / "run.json").read_text()) for job in ("0", "1")}
    assert records["0"]["status"] == "stopped" and records["0"]["stop_reason"].startswith("nonfinite_")
    assert records["1"]["status"] == "finished" and records["1"]["final_step"] == 4
    assert result.returncode == 1, result.stderr
    assert error_lines(result.stderr) == [f"numdev-train: error: 1 run(s) of the sweep stopped (callbacks.instability.policy=stop), "
                                          f"every other job ran: {sweep / '0'} (their run.json say why)"], result.stderr
    assert f"{sweep / '0'}/run.json says stopped; the sweep goes on" in result.stdout + result.stderr
