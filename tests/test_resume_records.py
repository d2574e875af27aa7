"""Resuming never drops a record: the sibling CSV keeps the checkpoint step's row (issue 13, 4a), and
a deleted weights/index.json is rebuilt from the snapshot files, each verified (4b). Fault injection
in-process (deterministic); the same with a real SIGKILL of a real numdev-train is
test_faults.py::test_a_run_through_sigkill_sigterm_and_sighup_resumes_to_the_uninterrupted_runs_snapshots_and_rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import compose_train, snapshot_hashes

from numdev.analysis.compare import compare_runs
from numdev.runs.layout import RunDir
from numdev.train.run import train
from numdev.weights.metrics import read_distances_csv
from numdev.weights.store import SnapshotError, list_snapshots, load_snapshot

SIBLING = ["sibling.label=ref"]


def _key(row: dict) -> tuple:
    return row["step"], row["tensor"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("resume") / "reference"
    train(compose_train("trainer.max_steps=8", run_dir=run_dir))
    return run_dir


def _compare(reference: Path, run_dir: Path, *overrides: str):
    return compose_train(*overrides, *SIBLING, f"sibling.reference={reference}", run_dir=run_dir)


def test_a_resumed_run_keeps_the_sibling_row_of_its_checkpoint_step(reference, tmp_path):
    run_dir = tmp_path / "flash"
    train(_compare(reference, run_dir, "attention=sdpa_flash", "trainer.max_steps=4"))  # checkpoint at step 4
    before = read_distances_csv(RunDir(run_dir).sibling_csv("ref"))
    assert sorted({r["step"] for r in before}) == [0, 2, 4]
    train(_compare(reference, run_dir, "attention=sdpa_flash", "trainer.max_steps=8", "resume=true"))
    after = read_distances_csv(RunDir(run_dir).sibling_csv("ref"))
    assert sorted({r["step"] for r in after}) == [0, 2, 4, 6, 8] == list_snapshots(run_dir)
    assert [r for r in after if r["step"] <= 4] == before  # kept as they were
    assert sorted(after, key=_key) == sorted(compare_runs(run_dir, reference), key=_key)


def test_a_lost_or_old_format_sibling_csv_is_recomputed_from_the_snapshots(reference, tmp_path):
    run_dir = tmp_path / "flash"
    train(_compare(reference, run_dir, "attention=sdpa_flash", "trainer.max_steps=4"))
    csv = RunDir(run_dir).sibling_csv("ref")
    csv.write_text("step,tensor,max_abs,wasserstein\n0,__model__,0.0,0.0\n")  # the columns before this version
    train(_compare(reference, run_dir, "attention=sdpa_flash", "trainer.max_steps=6", "resume=true"))
    rows = read_distances_csv(csv)
    assert sorted({r["step"] for r in rows}) == [0, 2, 4, 6]
    assert sorted(rows, key=_key) == sorted(compare_runs(run_dir, reference), key=_key)


def test_a_deleted_index_is_rebuilt_from_the_verified_files(reference, tmp_path):
    run_dir = tmp_path / "run"
    train(compose_train("trainer.max_steps=4", run_dir=run_dir))
    written = snapshot_hashes(run_dir)
    RunDir(run_dir).index.unlink()
    train(compose_train("trainer.max_steps=8", "resume=auto", run_dir=run_dir))
    rebuilt = snapshot_hashes(run_dir)
    assert list(rebuilt) == [0, 2, 4, 6, 8]
    assert {s: rebuilt[s] for s in written} == written  # the earlier files listed again, with their checksums
    assert rebuilt == snapshot_hashes(reference)  # and the whole run is the uninterrupted one's
    for step in rebuilt:
        load_snapshot(run_dir, step)  # each verifies against the rebuilt index


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda p: p.rename(p.with_name("step_00000006.safetensors")), r"step_00000006.safetensors: its metadata step is not 6"),
        (lambda p: p.write_bytes(p.read_bytes()[:100]), r"step_00000002.safetensors is not a readable safetensors file"),
    ],
)
def test_an_unlisted_file_that_fails_verification_is_refused_by_name(tmp_path, tamper, message):
    run_dir = tmp_path / "run"
    train(compose_train("trainer.max_steps=4", run_dir=run_dir))
    RunDir(run_dir).index.unlink()
    tamper(RunDir(run_dir).snapshot(2))
    with pytest.raises(SnapshotError, match=message):
        train(compose_train("trainer.max_steps=8", "resume=auto", run_dir=run_dir))
