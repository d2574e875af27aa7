"""Fault injection on real processes: SIGKILL, SIGTERM, SIGHUP and Ctrl-C to the real numdev-train
command, a second run started in a live run's directory, a requeue of a finished run, writers appending
to one file at once.

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
KILLED = [*STEPPED, "trainer.max_steps=10"]


def _rows(run_dir: Path) -> list[dict]:
    try:
        return read_distances_csv(RunDir(run_dir).sibling_csv("ref"))
    except (FileNotFoundError, ValueError):  # not written yet, or being replaced
        return []


def _key(row: dict) -> tuple:
    return row["step"], row["tensor"]


def test_a_killed_run_refuses_a_second_run_then_resumes_to_the_uninterrupted_runs_snapshots_and_rows(tmp_path):
    """The life of a run through the faults that leave no chance to say goodbye, on one comparing run
    (a sibling of an uninterrupted run of the same config, so it has distance rows to lose):

    1. a second run started in its directory while it lives (stopped with SIGSTOP, so it stays live for
       as long as the second one takes, however fast this machine trains) is refused, exit 2;
    2. SIGKILL: run.json stays "running", the last checkpoint is intact; its lock died with it;
    3. weights/index.json is lost too: the same command with resume=auto starts at once (no stale
       lock), rebuilds the index from the verified files, and ends with every snapshot of the
       uninterrupted run, bit for bit, every distance row (each step once, equal to numdev-compare's)
       and no temporary file;
    4. the same command again (a requeue of the finished run) does nothing and changes no record.
    """
    reference, run_dir = tmp_path / "reference", tmp_path / "killed"
    train_run(*KILLED, run_dir=reference)
    expected = snapshot_hashes(reference)
    assert list(expected) == list(range(11))
    command = [*KILLED, "sibling.label=ref", f"sibling.reference={reference}", f"hydra.run.dir={run_dir}", "resume=auto"]

    first = start_numdev("numdev-train", *command, cwd=tmp_path)
    try:
        wait_until(lambda: max((r["step"] for r in _rows(run_dir)), default=-1) >= 5, "past the checkpoint at step 4", first)
        first.send_signal(signal.SIGSTOP)
        second = run_numdev("numdev-train", *command, cwd=tmp_path)
        assert first.poll() is None, "the first run ended before the second one was tried"
    finally:
        first.kill()  # SIGKILL (it reaches a stopped process too): no chance to release anything
        first.wait()
    assert second.returncode == 2, second.stderr[-2000:]
    assert error_lines(second.stderr) == [
        f"numdev-train: error: {run_dir} is in use by another live run (process {first.pid}): wait for it to end, or give "
        "this run its own directory (hydra.run.dir=...)"]

    killed_at = latest_snapshot(run_dir)
    assert 5 <= killed_at < 10
    assert run_record(run_dir)["status"] == "running"  # no chance to say goodbye
    checkpoint_step = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"]  # intact
    assert checkpoint_step in (4, 8) and checkpoint_step <= killed_at
    RunDir(run_dir).index.unlink()  # and the index is lost too

    resumed = run_numdev("numdev-train", *command, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]  # the kernel released the dead run's lock
    run = run_record(run_dir)
    assert run["status"] == "finished" and run["final_step"] == 10
    assert run["resumes"] == [{"from_step": checkpoint_step, "at": run["resumes"][0]["at"]}]
    # The snapshots after the checkpoint were written twice (before the kill and after the resume);
    # the rebuilt index holds each step once, and every file is the uninterrupted run's.
    assert snapshot_hashes(run_dir) == expected
    rows = _rows(run_dir)
    assert sorted({r["step"] for r in rows}) == list(range(11)) and len(rows) == len({_key(r) for r in rows})
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
    assert f"already finished at step 10: nothing to do -> {run_dir}" in again.stdout
    assert [str(p) for p, data in files.items() if not p.is_file() or p.read_bytes() != data] == []
    assert (run_dir / "app.log").read_text().count("already finished at step 10: nothing to do") == 1


@pytest.mark.parametrize("signals", [(signal.SIGTERM, signal.SIGHUP), pytest.param((signal.SIGINT,), marks=pytest.mark.slow)],
                         ids=lambda s: "-".join(sig.name for sig in s))
def test_a_signal_marks_the_run_failed_and_exits_non_zero_then_resume_auto_continues_it(signals, tmp_path):
    """SIGTERM (a SLURM time limit, `kill`), SIGHUP (a closed terminal) and Ctrl-C each end the run at
    the end of the current step: run.json "failed" naming the signal and the step, exit 128 + the
    signal, one line saying how to continue; resume=auto continues it (SIGTERM, then SIGHUP to the
    resumed run, then a resume to the end)."""
    run_dir = tmp_path / "run"
    command = [*STEPPED, "trainer.max_steps=40", f"hydra.run.dir={run_dir}", "resume=auto"]
    stopped = -1
    for sig in signals:
        process = start_numdev("numdev-train", *command, cwd=tmp_path)
        try:  # beyond where the previous one stopped: this one trains (it resumed from a checkpoint at or before it)
            wait_until(lambda: latest_snapshot(run_dir) >= max(stopped, 2) + 3, "training", process)  # noqa: B023
            process.send_signal(sig)
            _, stderr = process.communicate(timeout=240)
        finally:
            process.kill()
            process.wait()
        assert process.returncode == 128 + sig, (process.returncode, stderr[-2000:])
        run = run_record(run_dir)
        assert run["status"] == "failed" and run["error"] == f"interrupted by {sig.name} at step {run['final_step']}"
        assert max(stopped, 2) + 3 <= run["final_step"] < 40
        assert error_lines(stderr) == [
            f"numdev-train: error: interrupted by {sig.name} at step {run['final_step']}: {run_dir}/run.json says failed; "
            "to continue from the last checkpoint run the same command with resume=auto"]
        stopped = run["final_step"]

    end = stopped + 2  # to the end, sooner: the run's records are what is checked here, not its weights
    resumed = run_numdev("numdev-train", *command, f"trainer.max_steps={end}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    run = run_record(run_dir)
    assert run["status"] == "finished" and run["final_step"] == end and len(run["resumes"]) == len(signals)
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
