"""A run killed with SIGKILL mid-training and started again with the same command ends with the
snapshots of an uninterrupted run (a real subprocess, a real kill)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
from helpers import compose_train, kill_when

from numdev.cli.commands import argv
from numdev.train.checkpoint_io import load_checkpoint
from numdev.train.run import train

# Snapshots every step, a checkpoint every 4: the kill lands after snapshots newer than the
# checkpoint, which the resumed run writes again. Sampling every step slows the steps down (it
# leaves the weights alone, tested in test_train.py) so the kill lands mid-training.
OVERRIDES = [
    "trainer.max_steps=10", "snapshot.every_n_steps=1", "callbacks.checkpoint.every_n_steps=4",
    "callbacks.samples.every_n_steps=1", "callbacks.samples.num_samples=2", "threads=2",
]


def _hashes(run_dir: Path) -> dict[int, str]:
    return {e["step"]: e["sha256"] for e in json.loads((run_dir / "weights" / "index.json").read_text())["snapshots"]}


def _latest_snapshot(run_dir: Path) -> int:
    try:
        return max(_hashes(run_dir), default=-1)
    except (FileNotFoundError, json.JSONDecodeError):  # not there yet (it is never half-written)
        return -1


def _command(run_dir: Path) -> list[str]:
    command = argv("numdev-train")  # the console script beside this interpreter, else python -m
    return [*command, "experiment=train_smoke", *OVERRIDES, f"hydra.run.dir={run_dir}", "resume=auto"]


def test_a_run_killed_mid_training_resumes_with_the_same_command_to_the_same_snapshots(tmp_path):
    run_dir = tmp_path / "killed"
    process = subprocess.Popen(_command(run_dir), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kill_when(process, lambda: _latest_snapshot(run_dir) >= 6)
    killed_at = _latest_snapshot(run_dir)
    print("killed after snapshot", killed_at)
    assert 6 <= killed_at < 10
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"  # no chance to say goodbye
    checkpoint_step = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"]  # intact
    assert checkpoint_step in (4, 8) and checkpoint_step <= killed_at
    print("checkpoint at", checkpoint_step)

    result = subprocess.run(_command(run_dir), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "finished" and run["final_step"] == 10
    assert run["resumes"] == [{"from_step": checkpoint_step, "at": run["resumes"][0]["at"]}]

    threads = torch.get_num_threads()
    try:
        train(compose_train(*OVERRIDES, run_dir=tmp_path / "uninterrupted"))
    finally:
        torch.set_num_threads(threads)
    expected = _hashes(tmp_path / "uninterrupted")
    assert list(expected) == list(range(11))
    # The snapshots after the checkpoint were written twice (before the kill and after the
    # resume); the index holds each step once, and every file is the uninterrupted run's.
    assert _hashes(run_dir) == expected
    leftovers = [p.name for sub in ("weights", "checkpoints") for p in (run_dir / sub).iterdir() if p.name.startswith(".")]
    assert leftovers == []
