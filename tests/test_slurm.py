"""SLURM for real: numdev-train sweeps through hydra/launcher=slurm on a single-node cluster
started on this machine (tests/slurm_cluster.py: munged, slurmctld, slurmd from Debian's packages).

On a CPU partition out of the box (no GPU asked for), a requeued job (scontrol requeue, what a
preemption does) resumes from its checkpoint and ends with the snapshots of an uninterrupted run.
CI installs the packages (.ci/run) and runs these tests; elsewhere they skip with the reason.
"""

from __future__ import annotations

import json
import os

import pytest
from helpers import latest_snapshot, run_numdev, run_record, snapshot_hashes, start_numdev, train_run, wait_until
from slurm_cluster import Cluster, missing_programs

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
    # One cluster per module: its tests share one xdist worker (conftest groups a module-scoped fixture's tests).
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_a_sweep_runs_through_slurm_on_a_cpu_partition_without_asking_for_a_gpu(slurm, tmp_path):
    result = run_numdev("numdev-train", "-m", "hydra/launcher=slurm", "attention=baseline,sdpa_flash", *SMOKE, "trainer.max_steps=2",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}", env=slurm.env, cwd=tmp_path, timeout=500)
    assert result.returncode == 0, result.stderr[-3000:] + slurm.logs()
    runs = [run_record(tmp_path / "sweep" / job) for job in ("0", "1")]
    assert [(r["status"], r["final_step"]) for r in runs] == [("finished", 2), ("finished", 2)]
    assert {r["backend"] for r in runs} == {"baseline", "sdpa_flash"}
    scripts = list((tmp_path / "sweep" / ".submitit").rglob("*_submission.sh"))
    assert scripts, "nothing went through sbatch"
    for script in scripts:
        text = script.read_text()
        assert "#SBATCH --cpus-per-task=1" in text  # threads=1
        assert "gpu" not in text.lower()  # a CPU trainer asks for no GPU (no gres on this partition)


def test_a_requeued_job_resumes_and_ends_with_the_snapshots_of_an_uninterrupted_run(slurm, tmp_path):
    sweep = tmp_path / "sweep"
    launcher = start_numdev("numdev-train", "-m", "hydra/launcher=slurm", *SLOW, "resume=auto", f"hydra.sweep.dir={sweep}",
                     env=slurm.env, cwd=tmp_path)
    try:
        wait_until(lambda: latest_snapshot(sweep / "0") >= 6, "the job past its first checkpoint (step 4)", launcher)
        (job,) = [job for job, state in slurm.jobs() if state == "RUNNING"]
        slurm.run("scontrol", "requeue", job)
        _, stderr = launcher.communicate(timeout=500)
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode == 0, stderr[-3000:] + slurm.logs()
    run = run_record(sweep / "0")
    assert run["status"] == "finished" and run["final_step"] == 12
    assert len(run["resumes"]) == 1 and run["resumes"][0]["from_step"] in (4, 8)  # it really was requeued
    # The uninterrupted run of the same config, in this process once the job is done (the cores are not
    # shared with it): the same weights at every step, bit for bit.
    train_run(*SLOW, run_dir=tmp_path / "alone")
    expected = snapshot_hashes(tmp_path / "alone")
    assert sorted(expected) == list(range(13))
    assert snapshot_hashes(sweep / "0") == expected


@pytest.mark.slow
def test_the_smoke_study_runs_through_slurm(slurm, tmp_path):
    result = run_numdev("numdev-train", "experiment=flash_stability_smoke", "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'study'}",
                    env=slurm.env, cwd=tmp_path, timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:] + slurm.logs()
    summary = json.loads((tmp_path / "study" / "summary.json").read_text())
    assert summary["roles"], summary
