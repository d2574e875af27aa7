"""Fault injection on real processes: SIGKILL, SIGTERM, SIGHUP and Ctrl-C to the real numdev-train
command, a requeue of a finished run, writers appending to one file at once.

Each guarantee is tested once here, on a real process hit by the real fault (docs/reliability.md names
the test of each); what can be checked in-process is tested in-process (test_resume_records.py,
test_checkpoints.py, the bad-input catalogue). Every wait is for a state (a snapshot, a row, a record),
polled with a generous timeout; none for a time.
"""

from __future__ import annotations

import multiprocessing
import signal
from pathlib import Path

import pytest
from helpers import (
    append_records,
    error_lines,
    latest_snapshot,
    run_numdev,
    run_record,
    snapshot_hashes,
    start_numdev,
    train_run,
    wait_until,
)

from numdev.analysis.compare import compare_runs
from numdev.runs.layout import RunDir
from numdev.train.checkpoint_io import load_checkpoint
from numdev.weights.metrics import read_distances_csv

# A snapshot at every step and a checkpoint every 4: a fault lands after snapshots newer than the
# checkpoint, which the resumed run writes again. Sampling every step slows the steps down (it leaves
# the weights alone: test_train.py) so that the fault lands mid-training whatever this machine's speed.
STEPPED = ["experiment=train_smoke", "snapshot.every_n_steps=1", "callbacks.checkpoint.every_n_steps=4",
           "callbacks.samples.every_n_steps=1", "callbacks.samples.num_samples=2", "threads=1"]
LIFE_STEPS = 24  # room for three interruptions, each a few steps after the previous one
LIFE = [*STEPPED, f"trainer.max_steps={LIFE_STEPS}"]


def _rows(run_dir: Path) -> list[dict]:
    try:
        return read_distances_csv(RunDir(run_dir).sibling_csv("ref"))
    except (FileNotFoundError, ValueError):  # not written yet, or being replaced
        return []


def _key(row: dict) -> tuple:
    return row["step"], row["tensor"]


def _stop(process, sig: signal.Signals, run_dir: Path, after: int) -> int:
    """`sig` to the run once it has trained past step `after`: exit 128 + sig, run.json "failed" naming
    the signal and the step, one line saying how to continue. The step it stopped at."""
    try:
        wait_until(lambda: latest_snapshot(run_dir) >= after + 2, f"training past step {after}", process)
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=240)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 128 + sig, (process.returncode, stderr[-2000:])
    run = run_record(run_dir)
    assert run["status"] == "failed" and run["error"] == f"interrupted by {sig.name} at step {run['final_step']}"
    assert error_lines(stderr) == [
        f"numdev-train: error: interrupted by {sig.name} at step {run['final_step']}: {run_dir}/run.json says failed; "
        "to continue from the last checkpoint run the same command with resume=auto"]
    return run["final_step"]


def test_a_run_through_sigkill_sigterm_and_sighup_resumes_to_the_uninterrupted_runs_snapshots_and_rows(tmp_path):
    """The life of a run through every way a process is ended from outside, on one comparing run (a
    sibling of an uninterrupted run of the same config, so it has distance rows to lose):

    1. SIGKILL (no chance to say goodbye): run.json stays "running", the last checkpoint is intact,
       its lock died with it; weights/index.json is lost too;
    2. the same command with resume=auto starts at once (no stale lock) and rebuilds the index from the
       verified files; SIGTERM (a SLURM time limit, `kill`) ends it at the end of the current step:
       run.json "failed" naming the signal and the step, exit 143, one line saying how to continue;
    3. resume=auto again, and SIGHUP (a closed terminal): the same, exit 129;
    4. resume=auto to the end: every snapshot of the uninterrupted run, bit for bit (the snapshots after
       each checkpoint were written twice), every distance row once (equal to numdev-compare's), one
       resume per interruption, no temporary file;
    5. the same command again (a requeue of the finished run) does nothing and changes no record.

    A second run started in a live run's directory is refused: the catalogue's train-live-run-directory
    (the lock held by the test); Ctrl-C: test_ctrl_c_... below (slow)."""
    reference, run_dir = tmp_path / "reference", tmp_path / "killed"
    train_run(*LIFE, run_dir=reference)
    expected = snapshot_hashes(reference)
    assert list(expected) == list(range(LIFE_STEPS + 1))
    command = [*LIFE, "sibling.label=ref", f"sibling.reference={reference}", f"hydra.run.dir={run_dir}", "resume=auto"]

    first = start_numdev("numdev-train", *command, cwd=tmp_path)
    try:
        wait_until(lambda: max((r["step"] for r in _rows(run_dir)), default=-1) >= 5, "past the checkpoint at step 4", first)
    finally:
        first.kill()  # SIGKILL: no chance to release anything
        first.wait()
    killed_at = latest_snapshot(run_dir)
    assert 5 <= killed_at < LIFE_STEPS
    assert run_record(run_dir)["status"] == "running"  # no chance to say goodbye
    checkpoint_step = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"]  # intact
    assert checkpoint_step % 4 == 0 and 4 <= checkpoint_step <= killed_at
    RunDir(run_dir).index.unlink()  # and the index is lost too

    stopped = killed_at
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the kernel released the dead run's lock: each starts at once
        stopped = _stop(start_numdev("numdev-train", *command, cwd=tmp_path), sig, run_dir, stopped)
        assert stopped < LIFE_STEPS

    resumed = run_numdev("numdev-train", *command, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    run = run_record(run_dir)
    assert run["status"] == "finished" and run["final_step"] == LIFE_STEPS
    assert [r["from_step"] for r in run["resumes"]][0] == checkpoint_step and len(run["resumes"]) == 3
    assert snapshot_hashes(run_dir) == expected
    rows = _rows(run_dir)
    assert sorted({r["step"] for r in rows}) == list(range(LIFE_STEPS + 1)) and len(rows) == len({_key(r) for r in rows})
    assert sorted(rows, key=_key) == sorted(compare_runs(run_dir, reference, log=lambda *_: None), key=_key)
    assert RunDir(run_dir).token_rows.is_file()
    leftovers = [p.name for sub in ("weights", "checkpoints") for p in (run_dir / sub).iterdir() if p.name.startswith(".")]
    assert leftovers == []

    # Every record; not the run's log (app.log), which tells the requeue too, nor TensorBoard's event files.
    files = {p: p.read_bytes() for p in run_dir.rglob("*")
             if p.is_file() and not p.name.startswith("events.out.tfevents.") and p.name not in (".lock", "app.log")}
    assert {"eval", "final_loss", "snapshot_write_seconds"} <= set(run)
    again = run_numdev("numdev-train", *command, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"already finished at step {LIFE_STEPS}: nothing to do -> {run_dir}" in again.stdout
    assert [str(p) for p, data in files.items() if not p.is_file() or p.read_bytes() != data] == []
    assert (run_dir / "app.log").read_text().count(f"already finished at step {LIFE_STEPS}: nothing to do") == 1


@pytest.mark.slow
def test_ctrl_c_marks_the_run_failed_and_exits_non_zero_then_resume_auto_continues_it(tmp_path):
    """Ctrl-C (SIGINT) ends the run as SIGTERM does (exit 130); resume=auto finishes it."""
    run_dir = tmp_path / "run"
    command = [*STEPPED, "trainer.max_steps=20", f"hydra.run.dir={run_dir}", "resume=auto"]
    stopped = _stop(start_numdev("numdev-train", *command, cwd=tmp_path), signal.SIGINT, run_dir, 2)
    end = stopped + 2  # to the end, sooner: the run's records are what is checked here, not its weights
    resumed = run_numdev("numdev-train", *command, f"trainer.max_steps={end}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    run = run_record(run_dir)
    assert run["status"] == "finished" and run["final_step"] == end and len(run["resumes"]) == 1
    assert latest_snapshot(run_dir) == end


def test_concurrent_appends_keep_every_record(tmp_path):
    from numdev.runs.atomic import read_jsonl

    path = str(tmp_path / "results.jsonl")
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=append_records, args=(path, w, 40)) for w in range(6)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
    assert [w.exitcode for w in writers] == [0] * 6
    records = read_jsonl(path)  # every line a whole record
    assert sorted((r["writer"], r["i"]) for r in records) == [(w, i) for w in range(6) for i in range(40)]
