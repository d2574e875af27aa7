"""Hydra launchers through the real numdev-train command: parallel jobs with numdev's own launcher
(hydra/launcher=parallel: no process left behind; and submitit's local executor, slow), each job a
complete run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import console_noise, kill_session, no_process_left, run_numdev

from numdev.cli.commands import argv

SMOKE = ["experiment=train_smoke", "trainer.max_steps=2", "callbacks.samples.num_samples=2", "threads=1"]


def _check_sweep(tmp_path: Path, result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "train_smoke").glob("multirun_*")
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in jobs] == ["0", "1"]
    runs = []
    for job in jobs:
        run = json.loads((job / "run.json").read_text())
        assert run["status"] == "finished" and run["final_step"] == 2
        index = json.loads((job / "weights" / "index.json").read_text())
        assert [e["step"] for e in index["snapshots"]] == [0, 2]
        # config.yaml is written when training starts, run.json last when it ends (ns mtimes).
        span = ((job / "config.yaml").stat().st_mtime_ns, (job / "run.json").stat().st_mtime_ns)
        runs.append({**run, "initial": index["snapshots"][0]["sha256"], "span": span})
    assert {r["backend"] for r in runs} == {"baseline", "sdpa_flash"}
    assert runs[0]["initial"] == runs[1]["initial"]  # same init seed: same initial weights in any process
    return runs


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_sweep_runs_its_jobs_in_parallel_with_the_parallel_launcher_and_leaves_no_process_behind(tmp_path):
    pytest.importorskip("joblib")
    # Its own session, so that everything it starts (workers, their trackers) can be found afterwards.
    process = subprocess.Popen([*argv("numdev-train"), "-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2",
                                "attention=baseline,sdpa_flash", *SMOKE, f"output_root={tmp_path}"],
                               cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=500)
        # Every worker was joined before the command returned; loky's resource tracker exits when the
        # command does (its pipe closes): polled, not raced.
        left = no_process_left(process.pid)
    finally:
        kill_session(process)
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    runs = _check_sweep(tmp_path, result)
    assert left == []
    # In parallel: each job started training before the other one finished (one after the other
    # would give max(start) > min(end)).
    assert max(r["span"][0] for r in runs) < min(r["span"][1] for r in runs), [r["span"] for r in runs]
    # Quiet by default: numdev's lines only; each job's app.log holds its run's story, the libraries' lines included.
    assert console_noise(result.stdout, result.stderr) == [], result.stdout + result.stderr
    assert result.stderr == ""
    assert result.stdout.count("finished at step 2 -> ") == 2
    (sweep,) = (tmp_path / "train" / "train_smoke").glob("multirun_*")
    for job in ("0", "1"):
        story = (sweep / job / "app.log").read_text()
        assert f"[numdev.train.run][DEBUG] - training {sweep / job}: " in story
        assert "[lightning.pytorch.utilities.rank_zero][INFO] - GPU available: False" in story
        assert f"[numdev.train.app][INFO] - finished at step 2 -> {sweep / job}" in story


@pytest.mark.slow
def test_a_sweep_runs_with_the_slurm_local_launcher(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    result = run_numdev(
        "numdev-train",
        "-m", "hydra/launcher=slurm_local", "attention=baseline,sdpa_flash", *SMOKE,
        f"output_root={tmp_path}", cwd=tmp_path, timeout=500,
    )
    _check_sweep(tmp_path, result)
    (sweep,) = (tmp_path / "train" / "train_smoke").glob("multirun_*")
    assert (sweep / ".submitit").is_dir()  # it really went through submitit


def test_the_launcher_configs_are_valid_against_the_plugins_schemas():
    """The submitit configs have names of their own (a config named like its plugin's schema is matched
    to it by name, which Hydra warns is deprecated): they are checked against the schemas here instead."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="numdev.conf.train", version_base="1.3"):
        cfg = compose(config_name="train", overrides=["hydra/launcher=parallel"], return_hydra_config=True)
        assert cfg.hydra.launcher._target_ == "hydra_plugins.numdev_launcher.parallel_launcher.ParallelLauncher"
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
        from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf

        for name, schema in (("slurm_local", LocalQueueConf), ("slurm", SlurmQueueConf)):
            cfg = compose(config_name="train", overrides=[f"hydra/launcher={name}"], return_hydra_config=True)
            merged = OmegaConf.merge(OmegaConf.structured(schema), cfg.hydra.launcher)  # refuses a key or type the schema has not
            assert merged._target_ == schema._target_


@pytest.mark.parametrize("trainer, overrides, gpus", [
    ("cpu", [], None), ("ddp_cpu", [], None), ("gpu", [], 1), ("ddp_gpu", [], 2), ("ddp_gpu", ["trainer.devices=8"], 8),
    ("cpu", ["hydra.launcher.gpus_per_node=4"], 4),  # an explicit override wins
])
def test_the_slurm_launcher_asks_for_gpus_only_for_a_gpu_trainer(trainer, overrides, gpus):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="numdev.conf.train", version_base="1.3"):
        cfg = compose(config_name="train", overrides=["hydra/launcher=slurm", f"trainer={trainer}", "threads=3",
                                                      *overrides], return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["gpus_per_node"] == gpus
    assert launcher["cpus_per_task"] == 3  # threads=


def test_the_progress_line_counts_jobs_and_estimates_the_time_left():
    from numdev.cli.launcher import progress_line

    # 3 of 10 done in 2 at a time, 100 s each: 7 left x 100 s / 2 = 350 s
    assert progress_line(3, 10, 150.0, 2, [100.0, 100.0, 100.0]) == "[3/10 jobs done, 2:30 elapsed, about 5:50 left]"
    assert progress_line(10, 10, 3725.0, 2, [100.0] * 10) == "[10/10 jobs done, 1:02:05 elapsed]"  # nothing left: no estimate
    assert progress_line(39, 40, 60.0, 2, [250.0, 500.0]) == "[39/40 jobs done, 1:00 elapsed, about 6:15 left]"  # one left runs alone


def test_a_sweep_run_one_job_at_a_time_says_how_far_it_is(caplog):
    import logging

    from omegaconf import OmegaConf

    from numdev.cli.sweep_jobs import SweepProgress, job_count

    assert job_count(["seed.init=0,1", "lr=1", "study=a,b,c", "study.replicate=range(0,5)"]) == 30
    assert job_count(["a=1,2", "a=3"]) == 1  # the later of two for one key wins, as in Hydra's basic sweeper
    config = OmegaConf.create({"hydra": {"launcher": {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"},
                                         "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                                                     "params": {"seed.init": "0,1"}},
                                         "overrides": {"task": ["study=a,b"]}}})
    progress = SweepProgress()
    caplog.set_level(logging.INFO, logger="numdev.cli.sweep_jobs")
    progress.on_multirun_start(config)
    for _ in range(2):
        progress.on_job_start(config)
        progress.on_job_end(config, None)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("[1/4 jobs done, 0:00 elapsed, about 0:00 left") and lines[1].startswith("[2/4 jobs done"), lines
    parallel = SweepProgress()  # numdev's parallel launcher says it itself: nothing here
    parallel.on_multirun_start(OmegaConf.merge(config, {"hydra": {"launcher": {"_target_": "numdev.cli.launcher.ParallelLauncher"}}}))
    parallel.on_job_start(config)
    parallel.on_job_end(config, None)
    assert len(caplog.records) == 2
