"""Sibling-run weight distances: the live callback, the offline numdev-compare, and their errors."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch
from helpers import compose_train, run_cli
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from numdev.analysis.compare import compare_runs
from numdev.runs.layout import MODEL_ROW as MODEL
from numdev.runs.layout import RunDir
from numdev.train.callbacks.sibling import SiblingDistance, SiblingError
from numdev.train.run import train
from numdev.weights.metrics import read_distances_csv as read_csv
from numdev.weights.store import SnapshotError, SnapshotWriter


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """reference (writing its sorted values, as the study's does); an identical rerun; a flash run and
    a different-init run, all comparing with the reference."""
    root = tmp_path_factory.mktemp("siblings")
    train(compose_train("snapshot.sorted_values=true", run_dir=root / "reference"))
    for name, overrides in {
        "same": [],
        "flash": ["attention=sdpa_flash", "precision=bf16-mixed"],
        "init": ["seed.init=1"],
    }.items():
        train(compose_train(*overrides, f"sibling.reference={root / 'reference'}", "sibling.label=ref", run_dir=root / name))
    return root


def _model_rows(path):
    return [r for r in read_csv(path) if r["tensor"] == MODEL]


def test_identical_runs_read_exactly_zero(runs):
    rows = read_csv(runs / "same" / "sibling" / "ref.csv")
    assert sorted({r["step"] for r in rows}) == [0, 2, 4]
    assert len(rows) > 3 * 40  # every tensor, every step
    metrics = ("max_abs", "mean_abs", "rel_frobenius", "wasserstein", "pooled_wasserstein")
    assert all(r[m] == 0.0 for r in rows for m in (*metrics, "w1_over_std"))


def test_perturbed_siblings_read_more_than_zero(runs):
    flash = _model_rows(runs / "flash" / "sibling" / "ref.csv")
    assert flash[0]["max_abs"] == 0.0  # same initialisation whatever the backend and precision
    assert flash[-1]["max_abs"] > 0 and flash[-1]["wasserstein"] > 0
    init = _model_rows(runs / "init" / "sibling" / "ref.csv")
    assert init[0]["max_abs"] > 0.01  # another random start
    assert init[-1]["max_abs"] > flash[-1]["max_abs"]


def test_offline_compare_agrees_with_the_callback_and_tensorboard(runs):
    live = read_csv(runs / "flash" / "sibling" / "ref.csv")
    offline = compare_runs(runs / "flash", runs / "reference")
    key = lambda r: (r["step"], r["tensor"])  # noqa: E731
    assert sorted(live, key=key) == sorted(offline, key=key)
    events = EventAccumulator(str(RunDir(runs / "flash").events()), size_guidance={"scalars": 0})
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("distance/ref/wasserstein")}
    for row in (r for r in offline if r["tensor"] == MODEL):
        assert logged[row["step"]] == pytest.approx(row["wasserstein"], rel=1e-6, abs=1e-12)
    assert "sibling_diff/ref/model" in events.Tags()["histograms"]
    assert not any(tag.startswith("per_tensor/") for tag in events.Tags()["scalars"])  # callbacks.sibling.per_tensor=false: the CSV has them


def test_numdev_compare_cli_writes_csv_and_figure(runs, tmp_path):
    result = run_cli("numdev.analysis.compare", str(runs / "init"), str(runs / "reference"), "-o", str(tmp_path / "cmp"), cwd=tmp_path)
    assert "3 steps compared" in result.stdout
    rows = read_csv(tmp_path / "cmp" / "distances.csv")
    assert rows == read_csv(runs / "init" / "sibling" / "ref.csv")  # the same rows as the live callback
    assert (tmp_path / "cmp" / "distances.png").stat().st_size > 10_000


def _snapshot_dir(tmp_path, name, shapes=None, steps=(0,)):
    shapes = shapes or {"w": [4, 3]}
    writer = SnapshotWriter(tmp_path / name, "m", shapes)
    for step in steps:
        writer.write(step, {k: torch.full(v, float(step)) for k, v in shapes.items()})
    return tmp_path / name


def _callback(reference, tmp_path, timeout_s=0.0):
    callback = SiblingDistance(str(tmp_path / "me"), str(reference), timeout_s=timeout_s, poll_s=0.05)
    return callback


def test_the_callback_waits_for_a_snapshot_written_later_by_another_process(tmp_path):
    """The writer, another process, writes step 2 only once the callback has looked for it and found
    it missing (its first wait): a state, not a time, orders the two."""
    reference = _snapshot_dir(tmp_path, "sibling", steps=(0,))
    go = tmp_path / "go"
    writer_code = (
        "import sys, time, pathlib, torch\n"
        "from numdev.weights.store import SnapshotWriter\n"
        "go = pathlib.Path(sys.argv[2])\n"
        "deadline = time.monotonic() + 300\n"
        "while not go.exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "SnapshotWriter(sys.argv[1], 'm', {'w': [4, 3]}).write(2, {'w': torch.full((4, 3), 2.0)})\n"
    )
    process = subprocess.Popen([sys.executable, "-c", writer_code, str(reference), str(go)])
    callback = _callback(reference, tmp_path, timeout_s=600)
    waits = []
    real_sleep = callback._sleep

    def sleep(seconds):
        waits.append(seconds)
        go.touch()  # the step is missing now: let the writer write it
        real_sleep(seconds)

    callback._sleep = sleep
    try:
        state, _ = callback.wait_for(2)
    finally:
        go.touch()
        process.wait(timeout=300)
    assert process.returncode == 0
    assert waits  # it waited (at least once) rather than failing on a missing step
    assert torch.equal(state["w"], torch.full((4, 3), 2.0))


def test_waiting_ends_with_a_clear_error(tmp_path):
    reference = _snapshot_dir(tmp_path, "sibling", steps=(0,))
    with pytest.raises(SiblingError, match=r"no snapshot at step 2 after waiting 0.2 s \(its latest snapshot is step 0\)"):
        _callback(reference, tmp_path, timeout_s=0.2).wait_for(2)


def test_a_finished_sibling_with_another_step_grid_is_an_error(tmp_path):
    reference = _snapshot_dir(tmp_path, "sibling", steps=(0, 3, 6))
    (reference / "run.json").write_text(json.dumps({"status": "finished"}))
    with pytest.raises(SiblingError, match=r"has no snapshot at step 2; it has steps \[0, 3, 6\]: the runs must share"):
        _callback(reference, tmp_path, timeout_s=60).wait_for(2)


def test_a_corrupt_sibling_snapshot_names_the_file(tmp_path):
    reference = _snapshot_dir(tmp_path, "sibling", steps=(0, 2))
    path = reference / "weights" / "step_00000002.safetensors"
    path.write_bytes(path.read_bytes()[:-4] + b"\x00\x00\x00\x01")
    with pytest.raises(SnapshotError, match=r"step_00000002.safetensors: sha256 does not match"):
        _callback(reference, tmp_path).wait_for(2)


def test_a_missing_reference_fails_at_setup(tmp_path, train_config):
    cfg = train_config(f"sibling.reference={tmp_path / 'nowhere' / 'run'}", run_dir=tmp_path / "run")
    with pytest.raises(SiblingError, match=r"does not exist \(nor does its parent directory\): give the directory of a numdev-train run"):
        train(cfg)


def test_a_directory_that_is_not_a_run_is_an_error(tmp_path, train_config):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "run.json").write_text(json.dumps({"status": "finished"}))
    cfg = train_config(f"sibling.reference={tmp_path / 'empty'}", run_dir=tmp_path / "run")
    with pytest.raises(SiblingError, match=r"is a run without snapshots"):
        train(cfg)


def test_a_sibling_with_another_architecture_names_the_tensor(runs, tmp_path, train_config):
    cfg = train_config("model.hidden=48", f"sibling.reference={runs / 'reference'}", run_dir=tmp_path / "wide")
    with pytest.raises(ValueError, match=r"at step 0: tensor '\S+' has shape \(\d+.*\) in one run and \(\d+.*\) in the other"):
        train(cfg)


def test_numdev_compare_of_two_different_runs_is_quiet_and_records_provenance(tmp_path, capsys):
    """(Its errors, the same run twice and two bit-identical runs: the bad-input catalogue.)"""
    from numdev.analysis.compare import main as compare

    a, b = _snapshot_dir(tmp_path, "a", steps=(0, 2)), tmp_path / "b"
    writer = SnapshotWriter(b, "m", {"w": [4, 3]})
    for step in (0, 2):
        writer.write(step, {"w": torch.full((4, 3), step + 0.5)})
    compare([str(a), str(b)])  # its console: numdev's lines on stdout, warnings on stderr
    out, err = capsys.readouterr()
    assert err == "" and "2 steps compared" in out
    summary = json.loads((a / "compare_b" / "compare.json").read_text())
    assert summary["bit_identical"] is False and summary["final"]["max_abs"] == 0.5 and summary["steps"] == [0, 2]
    assert summary["final"]["wasserstein"] == pytest.approx(0.5)
    assert len(summary["provenance"]["git"]["commit"]) == 40


def test_numdev_compare_reports_missing_steps_and_compares_the_rest(tmp_path, capsys):
    from numdev.analysis.compare import main as compare

    a = _snapshot_dir(tmp_path, "a", steps=(0, 2, 4))
    b = _snapshot_dir(tmp_path, "b", steps=(0, 4))
    compare([str(a), str(b)])  # its console: numdev's lines on stdout, warnings on stderr
    out, err = capsys.readouterr()
    assert "snapshot steps only in" in err and "[2]" in err
    assert "2 steps compared" in out
    with pytest.raises(SystemExit) as exit_:
        compare([str(a), str(b), "--strict"])
    assert exit_.value.code == 2 and "drop --strict" in capsys.readouterr().err


def test_a_truncated_distance_csv_names_the_file(tmp_path):
    path = tmp_path / "ref.csv"
    path.write_text("step,tensor,numel,max_abs,mean_abs,rel_frobenius,wasserstein,w1_over_std,pooled_wasserstein\n"
                    "0,__model__,10,0.0,0.0,0.0,0.0,0.0,0.0\n2,__model__,10,0.5\n")  # cut mid-row
    with pytest.raises(ValueError, match=r"ref.csv: not a table with the columns step, tensor, numel, max_abs, .*truncated"):
        read_csv(path)


def test_the_unindexed_embedding_rows_are_their_own_set(runs):
    """No caption indexes them: identical in the Flash pair (same init, no gradient), independent draws in the init pair."""
    name = "text.encoder.token_embedding.weight"
    token_rows = json.loads((runs / "flash" / "token_rows.json").read_text())
    assert token_rows["source"] == "declared" and token_rows["tensor"] == name
    last = lambda run: {r["tensor"]: r for r in read_csv(runs / run / "sibling" / "ref.csv") if r["step"] == 4}  # noqa: E731
    flash, init = last("flash"), last("init")
    width = flash[name]["numel"] // len(token_rows["ids"])
    assert flash[name + "[unindexed]"]["numel"] == (token_rows["rows"] - len(token_rows["ids"])) * width
    assert flash[name + "[unindexed]"]["max_abs"] == 0.0 and flash[name]["max_abs"] > 0  # the indexed rows train
    assert init[name + "[unindexed]"]["mean_abs"] > 1e-3
    trained = sum(r["numel"] for t, r in flash.items() if t != MODEL and not t.endswith("[unindexed]"))
    assert flash[MODEL]["numel"] == trained


# -- the sibling's sorted values (snapshot.sorted_values): read instead of sorted, the same rows ---------


def test_the_reference_writes_sorted_values_and_the_live_rows_equal_the_offline_ones(runs):
    """The live rows (the reference's sorts read from disk) are exactly numdev-compare's (both sorted)."""
    assert sorted(p.name for p in (runs / "reference" / "weights").glob("sorted_*")) == [
        "sorted_00000000.safetensors", "sorted_00000002.safetensors", "sorted_00000004.safetensors"]
    assert not list((runs / "flash" / "weights").glob("sorted_*"))  # only the run others compare with writes them
    for name in ("same", "flash", "init"):
        live = read_csv(runs / name / "sibling" / "ref.csv")
        key = lambda r: (r["step"], r["tensor"])  # noqa: E731
        assert sorted(live, key=key) == sorted(compare_runs(runs / name, runs / "reference"), key=key)


def _pair(tmp_path, steps=(0, 2, 4), sorted_values=True):
    """A reference (with its sorted values) and a comparing run: snapshots and token rows as training writes them."""
    import numpy as np

    from numdev.weights.distances import prepare
    from numdev.weights.store import SortedSets

    shapes = {"emb.weight": [40, 4], "w": [30, 20], "bias": [7]}
    g = torch.Generator().manual_seed(1)
    start = {k: torch.randn(v, generator=g) * 0.02 for k, v in shapes.items()}
    start["bias"].zero_()
    rows = [1, 5, 6, 30]
    for run in ("reference", "me"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "token_rows.json").write_text(json.dumps(
            {"format": 1, "tensor": "emb.weight", "rows": 40, "source": "declared", "describe": "test",
             "ids": rows, "first_step": [0] * len(rows)}))
    states = {}
    for run in ("reference", "me"):
        writer, state, previous = SnapshotWriter(tmp_path / run, "m", shapes), start, None
        for step in steps:
            state = {k: v.clone() for k, v in state.items()}
            for k, v in state.items():
                moved = v + torch.randn(v.shape, generator=g) * 1e-3
                if k == "emb.weight":  # only the indexed rows train
                    v[rows] = moved[rows]
                else:
                    state[k] = moved
            states[run, step] = state
            sorted_sets = None
            if run == "reference" and sorted_values:
                previous = prepare(state, {"emb.weight": np.array(rows)}, previous=previous)
                sorted_sets = SortedSets(previous.sorted, previous.pooled_sorted, {"emb.weight": np.array(rows)})
            writer.write(step, state, sorted_sets)
    return tmp_path / "reference", tmp_path / "me", states


def _live_rows(reference, me, states, steps=(0, 2, 4)):
    callback = SiblingDistance(str(me), str(reference), label="ref", timeout_s=0)
    used = []
    for step in steps:
        callback.on_snapshot(_NoTrainer(), None, step, states["me", step])
        used.append(list(callback._reference[1].stored))
    return read_csv(callback.csv_path), used


class _NoTrainer:
    logger = None
    loggers: list = []  # no tracker (numdev.train.trackers)


def test_live_rows_with_the_sorted_values_read_from_disk_equal_the_old_path(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="numdev.train.callbacks.sibling")
    reference, me, states = _pair(tmp_path)
    rows, used = _live_rows(reference, me, states)
    assert rows == compare_runs(me, reference)  # every column, exactly
    assert "__pooled__" in used[0] and "w" in used[0] and "emb.weight[unindexed]" in used[0]
    assert "emb.weight[unindexed]" not in used[1]  # unchanged since step 0: reused, not read again
    assert "not using" not in caplog.text


def _flip_a_data_byte(path):
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))


def _forge_w(path):
    """Re-written with every header field right and one value of `w` changed (still sorted)."""
    import numpy as np
    import safetensors.numpy

    from numdev.weights.store import SortedSets, write_sorted_values

    arrays = safetensors.numpy.load_file(path)
    meta = json.loads(safetensors.safe_open(path, "np").metadata()["numdev"])
    arrays["w"][10] = arrays["w"][11]
    pooled = arrays.pop("__pooled__")
    rows = {"emb.weight": np.array([1, 5, 6, 30])}
    write_sorted_values(path.parent.parent, meta["step"], meta["snapshot_sha256"], SortedSets(arrays, pooled, rows))


def _stale(path):
    """The previous step's sorted values (another snapshot) copied over this step's, the step in its header edited."""
    step = int(path.stem.split("_")[1])
    other = (path.parent / f"sorted_{step - 2:08d}.safetensors").read_bytes()
    path.write_bytes(other.replace(f'\\"step\\": {step - 2}'.encode(), f'\\"step\\": {step}'.encode()))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: p.unlink(), "does not exist"),
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "truncated"),
        (_flip_a_data_byte, "the file is corrupt or was edited"),
        (_forge_w, "'w' does not hold the snapshot's values"),
        (_stale, "belongs to another snapshot of step 2"),
    ],
    ids=["missing", "truncated", "bit-flip", "forged", "stale"],
)
def test_a_damaged_forged_or_stale_sorted_file_falls_back_to_sorting_with_the_same_rows(tmp_path, caplog, damage, reason):
    caplog.set_level(logging.DEBUG, logger="numdev.train.callbacks.sibling")  # said in the run's log (app.log)
    reference, me, states = _pair(tmp_path)
    for step in (2, 4):  # two damaged steps: said once
        damage(reference / "weights" / f"sorted_{step:08d}.safetensors")
    rows, used = _live_rows(reference, me, states)
    assert rows == compare_runs(me, reference)
    out = caplog.text
    assert out.count("[sibling] not using the sibling's sorted values") == 1 and reason in out, out
    assert "__pooled__" in used[0]  # step 0's file was fine


def test_a_reference_without_sorted_values_is_sorted_here(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="numdev.train.callbacks.sibling")
    reference, me, states = _pair(tmp_path, sorted_values=False)
    rows, used = _live_rows(reference, me, states)
    assert rows == compare_runs(me, reference) and used == [[], [], []]
    assert caplog.text.count("sorted_00000000.safetensors does not exist") == 1


def test_only_the_study_reference_writes_sorted_values():
    roles = ("truth", "reference", "flash", "data", "noise", "ulp", "init", "fp32")
    writes = {role: compose_train("experiment=flash_stability", f"study={role}", run_dir="/tmp/x", smoke=False).snapshot.sorted_values
              for role in roles}
    assert writes == {role: role == "reference" for role in roles}
