"""SLURM for real: numdev-train sweeps through hydra/launcher=slurm on a single-node cluster
started on this machine (tests/slurm_cluster.py: munged, slurmctld, slurmd from Debian's packages).

On a CPU partition out of the box (no GPU asked for), a requeued job (scontrol requeue, what a
preemption does) resumes from its checkpoint and ends with the snapshots of an uninterrupted run.
CI installs the packages (.ci/run) and runs these tests; elsewhere they skip with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from slurm_cluster import Cluster, missing_programs

from numdev.cli.commands import argv

SMOKE = ["experiment=train_smoke", "callbacks.samples.num_samples=2", "threads=1"]
# Sampling every step slows the steps down so that the requeue lands mid-training.
SLOW = [*SMOKE, "trainer.max_steps=12", "snapshot.every_n_steps=1", "callbacks.checkpoint.every_n_steps=4",
        "callbacks.samples.every_n_steps=1"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = missing_programs()
    if missing or os.geteuid() != 0:
        why = (f"needs {', '.join(missing)} (apt-get install slurm-wlm munge; .ci/run does)" if missing
               else "starts slurmd, which must run as root")
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the SLURM tests: {why}")
        pytest.skip(why)
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _train(*args: str) -> list[str]:
    return [*argv("numdev-train"), *args]


def _snapshots(run_dir: Path) -> dict[int, str]:
    try:
        return {e["step"]: e["sha256"] for e in json.loads((run_dir / "weights" / "index.json").read_text())["snapshots"]}
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def test_a_sweep_runs_through_slurm_on_a_cpu_partition_without_asking_for_a_gpu(slurm, tmp_path):
    result = subprocess.run(_train("-m", "hydra/launcher=slurm", "attention=baseline,sdpa_flash", *SMOKE,
                                   "trainer.max_steps=2", f"hydra.sweep.dir={tmp_path / 'sweep'}"),
                            env=slurm.env, cwd=tmp_path, capture_output=True, text=True, timeout=500)
    assert result.returncode == 0, result.stderr[-3000:] + slurm.logs()
    runs = [json.loads((tmp_path / "sweep" / job / "run.json").read_text()) for job in ("0", "1")]
    assert [(r["status"], r["final_step"]) for r in runs] == [("finished", 2), ("finished", 2)]
    assert {r["backend"] for r in runs} == {"baseline", "sdpa_flash"}
    scripts = list((tmp_path / "sweep" / ".submitit").rglob("*_submission.sh"))
    assert scripts, "nothing went through sbatch"
    for script in scripts:
        text = script.read_text()
        assert "#SBATCH --cpus-per-task=1" in text  # threads=1
        assert "gpu" not in text.lower()  # a CPU trainer asks for no GPU (no gres on this partition)


def test_a_requeued_job_resumes_and_ends_with_the_snapshots_of_an_uninterrupted_run(slurm, tmp_path):
    sweep, alone = tmp_path / "sweep", tmp_path / "alone"
    # The uninterrupted run, beside it (one thread each: two cores).
    reference = subprocess.Popen(_train(*SLOW, f"hydra.run.dir={alone}"), cwd=tmp_path, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
    launcher = subprocess.Popen(_train("-m", "hydra/launcher=slurm", *SLOW, "resume=auto", f"hydra.sweep.dir={sweep}"),
                                env=slurm.env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while max(_snapshots(sweep / "0"), default=-1) < 6:  # past its first checkpoint (step 4)
            assert launcher.poll() is None, launcher.stderr.read()[-3000:] + slurm.logs()
            assert time.monotonic() < deadline, "the job did not reach step 6"
            time.sleep(0.05)
        (job,) = [job for job, state in slurm.jobs() if state == "RUNNING"]
        slurm.run("scontrol", "requeue", job)
        _, stderr = launcher.communicate(timeout=500)
        assert reference.wait(timeout=500) == 0, reference.stderr.read()[-3000:]
    finally:
        for process in (launcher, reference):
            process.kill()
            process.wait()
    assert launcher.returncode == 0, stderr[-3000:] + slurm.logs()
    run = json.loads((sweep / "0" / "run.json").read_text())
    assert run["status"] == "finished" and run["final_step"] == 12
    assert len(run["resumes"]) == 1 and run["resumes"][0]["from_step"] in (4, 8)  # it really was requeued
    expected = _snapshots(alone)
    assert sorted(expected) == list(range(13))
    assert _snapshots(sweep / "0") == expected  # bit for bit: same weights at every step


@pytest.mark.slow
def test_the_smoke_study_runs_through_slurm(slurm, tmp_path):
    result = subprocess.run(_train("experiment=flash_stability_smoke", "hydra/launcher=slurm",
                                   f"hydra.sweep.dir={tmp_path / 'study'}"),
                            env=slurm.env, cwd=tmp_path, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:] + slurm.logs()
    summary = json.loads((tmp_path / "study" / "summary.json").read_text())
    assert summary["roles"], summary
