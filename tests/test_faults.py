"""Fault injection on real processes: signals, a second run in a live run's directory, a requeue
of a finished run. Each starts the real numdev-train console script and hits it with the real fault."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from numdev.cli.commands import argv

# Sampling every step slows the steps down so that a signal lands mid-training.
SLOW = ["experiment=train_smoke", "trainer.max_steps=40", "snapshot.every_n_steps=1", "callbacks.checkpoint.every_n_steps=4",
        "callbacks.samples.every_n_steps=1", "callbacks.samples.num_samples=2", "threads=1"]


def _command(run_dir: Path, *overrides: str) -> list[str]:
    command = argv("numdev-train")  # the console script beside this interpreter, else python -m
    return [*command, *SLOW, f"hydra.run.dir={run_dir}", *overrides]


def _latest_snapshot(run_dir: Path) -> int:
    try:
        return max(e["step"] for e in json.loads((run_dir / "weights" / "index.json").read_text())["snapshots"])
    except (FileNotFoundError, json.JSONDecodeError, ValueError):
        return -1


def _start_and_wait(run_dir: Path, step: int, *overrides: str) -> subprocess.Popen:
    process = subprocess.Popen(_command(run_dir, *overrides), cwd=run_dir.parent, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while _latest_snapshot(run_dir) < step:
        if process.poll() is not None:
            raise AssertionError(f"ended before step {step}: {process.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, "too slow"
        time.sleep(0.02)
    return process


def _error_lines(stderr: str, program: str = "numdev-train") -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"{program}: error: ")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_a_signal_marks_the_run_failed_and_exits_non_zero_then_resume_auto_finishes_it(sig, tmp_path):
    run_dir = tmp_path / "run"
    process = _start_and_wait(run_dir, 5)
    process.send_signal(sig)
    try:
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 128 + sig, (process.returncode, stderr[-2000:])
    (line,) = _error_lines(stderr)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "failed" and run["error"] == f"interrupted by {sig.name} at step {run['final_step']}"
    assert 5 <= run["final_step"] < 40
    assert line == (f"numdev-train: error: interrupted by {sig.name} at step {run['final_step']}: {run_dir}/run.json says "
                    "failed; to continue from the last checkpoint run the same command with resume=auto")

    resumed = subprocess.run(_command(run_dir, "resume=auto"), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "finished" and run["final_step"] == 40 and len(run["resumes"]) == 1
    assert _latest_snapshot(run_dir) == 40


def test_a_second_run_in_a_live_run_directory_is_refused_and_a_killed_run_leaves_no_stale_lock(tmp_path):
    run_dir = tmp_path / "run"
    first = _start_and_wait(run_dir, 2)
    # Stopped (SIGSTOP), the first run stays live and keeps its lock for as long as the second one
    # takes to start, however fast this machine trains: the test waits for states, never for a time.
    first.send_signal(signal.SIGSTOP)
    try:
        second = subprocess.run(_command(run_dir, "resume=auto"), cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert first.poll() is None, "the first run ended before the second one was tried"
    finally:
        first.kill()  # SIGKILL (it reaches a stopped process too): no chance to release anything
        first.wait()
    assert second.returncode == 2, second.stderr[-2000:]
    (line,) = _error_lines(second.stderr)
    assert line == (f"numdev-train: error: {run_dir} is in use by another live run (process {first.pid}): wait for it "
                    "to end, or give this run its own directory (hydra.run.dir=...)")
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"  # the first run's, untouched

    resumed = subprocess.run(_command(run_dir, "resume=auto", "trainer.max_steps=8"), cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]  # the kernel released the dead run's lock
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"


def test_resume_auto_of_a_finished_run_keeps_its_records(tmp_path):
    """A SLURM requeue re-runs the same command: a finished run must come out byte-for-byte unchanged."""
    run_dir = tmp_path / "run"
    overrides = ["trainer.max_steps=4", "callbacks.samples.every_n_steps=1000", "resume=auto"]
    first = subprocess.run(_command(run_dir, *overrides), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    # Every record; not the run's log (app.log), which tells the requeue too, nor TensorBoard's event files.
    files = {p: p.read_bytes() for p in run_dir.rglob("*")
             if p.is_file() and not p.name.startswith("events.out.tfevents.") and p.name not in (".lock", "app.log")}
    run = json.loads((run_dir / "run.json").read_text())
    assert {"eval", "final_loss", "snapshot_write_seconds"} <= set(run)

    again = subprocess.run(_command(run_dir, *overrides), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"already finished at step 4: nothing to do -> {run_dir}" in again.stdout
    changed = [str(p) for p, data in files.items() if not p.is_file() or p.read_bytes() != data]
    assert changed == []
    assert (run_dir / "app.log").read_text().count("already finished at step 4: nothing to do") == 1


def _session_processes(sid: int) -> list[str]:
    """Live (not zombie) processes of session `sid`: their command lines."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            if os.getsid(int(entry.name)) == sid and stat[stat.rindex(")") + 2] != "Z":
                found.append((entry / "cmdline").read_text().replace("\0", " ")[:200])
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_parallel_sweep_leaves_no_process_behind(tmp_path):
    pytest.importorskip("joblib")
    command = [*argv("numdev-train"), "-m", "hydra/launcher=parallel", "experiment=train_smoke", "trainer.max_steps=2",
               "seed.init=0,1", "threads=1", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    # Its own session, so that everything it starts (workers, their trackers) can be found afterwards.
    process = subprocess.Popen(command, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-2000:]
    # Every worker was joined before the command returned; loky's resource tracker exits when the
    # command does (its pipe closes): polled, not raced.
    deadline = time.monotonic() + 30
    while (left := _session_processes(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []
    assert [json.loads((tmp_path / "sweep" / job / "run.json").read_text())["status"] for job in "01"] == ["finished"] * 2


def _append_many(path: str, writer: int, count: int) -> None:
    from numdev.runs.atomic import append_jsonl

    for i in range(count):
        append_jsonl(path, [{"writer": writer, "i": i, "pad": "x" * 20_000}])  # > a page: no accidental atomicity


def test_concurrent_appends_keep_every_record(tmp_path):
    import multiprocessing

    from numdev.runs.atomic import read_jsonl

    path = str(tmp_path / "results.jsonl")
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_append_many, args=(path, w, 40)) for w in range(6)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
    assert [w.exitcode for w in writers] == [0] * 6
    records = read_jsonl(path)  # every line a whole record
    assert sorted((r["writer"], r["i"]) for r in records) == [(w, i) for w in range(6) for i in range(40)]


def test_a_copied_run_directory_resumes_and_compares(tmp_path):
    import shutil

    original, copy = tmp_path / "original", tmp_path / "elsewhere" / "copy"
    first = subprocess.run(_command(original, "trainer.max_steps=2", "callbacks.samples.every_n_steps=1000"),
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    copy.parent.mkdir()
    shutil.copytree(original, copy)
    resumed = subprocess.run(_command(copy, "trainer.max_steps=4", "callbacks.samples.every_n_steps=1000", "resume=true"),
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((copy / "run.json").read_text())["final_step"] == 4
    assert json.loads((original / "run.json").read_text())["final_step"] == 2  # the original is untouched

    from numdev.analysis.compare import main as compare

    compare([str(original), str(copy), "-o", str(tmp_path / "cmp")])
    rows = (tmp_path / "cmp" / "distances.csv").read_text().splitlines()
    assert len(rows) > 1
