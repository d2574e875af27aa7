"""Weight snapshots: layout, index, and a reader that refuses missing, corrupt or tampered files."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest
import torch

from numdev.weights.store import SnapshotError, SnapshotWriter, list_snapshots, load_snapshot, snapshot_name

SHAPES = {"a.weight": [2, 3], "b.bias": [4]}


def _state(value: float) -> dict[str, torch.Tensor]:
    return {"a.weight": torch.full((2, 3), value), "b.bias": torch.arange(4, dtype=torch.float32) * value}


@pytest.fixture
def run(tmp_path):
    writer = SnapshotWriter(tmp_path, "toy", SHAPES)
    for step, value in ((0, 0.5), (10, 1.5), (20, 2.5)):
        writer.write(step, _state(value))
    return tmp_path


def test_layout_index_and_round_trip(run):
    assert snapshot_name(20) == "step_00000020.safetensors"
    index = json.loads((run / "weights" / "index.json").read_text())
    assert index["format"] == 1 and index["model"] == "toy" and index["param_shapes"] == SHAPES
    assert [e["step"] for e in index["snapshots"]] == [0, 10, 20]
    for entry in index["snapshots"]:
        data = (run / "weights" / entry["file"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert list_snapshots(run) == [0, 10, 20]
    state = load_snapshot(run, 10)
    assert set(state) == set(SHAPES) and all(t.dtype == torch.float32 for t in state.values())
    assert torch.equal(state["b.bias"], _state(1.5)["b.bias"])
    assert not list(run.glob("weights/.*.tmp"))  # atomic writes leave no temporaries


def test_a_flipped_byte_is_caught_and_named(run):
    path = run / "weights" / snapshot_name(10)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # a tensor byte: still a valid safetensors file
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match=r"step_00000010\.safetensors: sha256 does not match"):
        load_snapshot(run, 10)
    assert load_snapshot(run, 10, verify=False)["b.bias"].shape == (4,)


def test_missing_and_unknown_snapshots_are_one_line_errors(run):
    (run / "weights" / snapshot_name(20)).unlink()
    with pytest.raises(SnapshotError, match=r"step_00000020\.safetensors is missing"):
        load_snapshot(run, 20)
    with pytest.raises(SnapshotError, match="no snapshot at step 5; steps: 0..20"):
        load_snapshot(run, 5)
    with pytest.raises(SnapshotError, match="index.json does not exist"):
        list_snapshots(run / "elsewhere")


def test_tampered_index_and_garbage_files(run):
    index_path = run / "weights" / "index.json"
    index = json.loads(index_path.read_text())
    index["snapshots"][0]["sha256"] = "0" * 64
    index_path.write_text(json.dumps(index))
    with pytest.raises(SnapshotError, match="sha256 does not match"):
        load_snapshot(run, 0)
    (run / "weights" / snapshot_name(10)).write_bytes(b"not safetensors")
    with pytest.raises(SnapshotError, match="sha256 does not match"):
        load_snapshot(run, 10)
    with pytest.raises(SnapshotError, match="not a readable safetensors file"):
        load_snapshot(run, 10, verify=False)
    index_path.write_text("{broken")
    with pytest.raises(SnapshotError, match="not valid JSON"):
        list_snapshots(run)


def test_writer_continues_an_index_and_refuses_another_model(run):
    writer = SnapshotWriter(run, "toy", SHAPES)
    writer.write(30, _state(3.5))
    writer.write(20, _state(9.0))  # rewritten after a resume: replaced, not duplicated
    assert list_snapshots(run) == [0, 10, 20, 30]
    assert torch.equal(load_snapshot(run, 20)["a.weight"], _state(9.0)["a.weight"])
    with pytest.raises(SnapshotError, match="belongs to a different model"):
        SnapshotWriter(run, "other", SHAPES)
    with pytest.raises(SnapshotError, match="differ from"):
        writer.write(40, {"a.weight": torch.zeros(2, 3)})


# -- sorted values beside a snapshot (snapshot.sorted_values) -------------------------------------------


def _sorted_sets(state, rows=None):
    from numdev.weights.distances import prepare
    from numdev.weights.store import SortedSets

    prepared = prepare(state, rows)
    return SortedSets(prepared.sorted, prepared.pooled_sorted, rows)


@pytest.fixture
def sorted_run(tmp_path):
    writer = SnapshotWriter(tmp_path, "toy", SHAPES)
    for step, value in ((0, 0.5), (10, -1.5)):
        writer.write(step, _state(value), _sorted_sets(_state(value)))
    return tmp_path


def test_sorted_values_are_written_before_the_index_entry_and_read_back(sorted_run):
    import numpy as np
    import safetensors.numpy

    from numdev.runs.layout import POOLED, sorted_values_name
    from numdev.weights.store import open_sorted_values, snapshot_sha256

    assert sorted_values_name(10) == "sorted_00000010.safetensors"
    assert list_snapshots(sorted_run) == [0, 10]  # the sorted files are not snapshots
    path = sorted_run / "weights" / "sorted_00000010.safetensors"
    plain = safetensors.numpy.load_file(path)  # a standard safetensors file
    expected = np.sort(_state(-1.5)["b.bias"].numpy())
    assert np.array_equal(plain["b.bias"], expected) and plain[POOLED].size == 10
    with open_sorted_values(sorted_run, 10, snapshot_sha256(sorted_run, 10)) as stored:
        assert stored.sets == ["a.weight", "b.bias"] and stored.rows == {}
        assert np.array_equal(stored.read("b.bias"), expected)
        assert np.array_equal(stored.read(POOLED), np.sort(np.concatenate([t.numpy().ravel() for t in _state(-1.5).values()])))
    assert not list(sorted_run.glob("weights/.*.tmp"))


def _cut(path):
    path.write_bytes(path.read_bytes()[:-10])


def _garble_header(path):
    data = bytearray(path.read_bytes())
    data[8:20] = b"not json at "
    path.write_bytes(bytes(data))


def _move(path):  # step 0's file where step 10's was
    path.write_bytes((path.parent / "sorted_00000000.safetensors").read_bytes())


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.unlink(), r"sorted_00000010.safetensors does not exist"),
        (_cut, r"ends past the end of the file: the file was truncated"),
        (lambda p: p.write_bytes(p.read_bytes()[:5]), r"shorter than a safetensors header"),
        (_garble_header, r"its header is not numdev's"),
        (_move, r"it is the sorted values of step 0, not 10: the file was moved or renamed"),
    ],
)
def test_a_damaged_sorted_values_file_is_a_one_line_error(sorted_run, damage, message):
    from numdev.weights.store import SortedValuesError, open_sorted_values, snapshot_sha256

    damage(sorted_run / "weights" / "sorted_00000010.safetensors")
    with pytest.raises(SortedValuesError, match=message):
        open_sorted_values(sorted_run, 10, snapshot_sha256(sorted_run, 10))


def test_sorted_values_of_a_rewritten_snapshot_are_stale(sorted_run):
    from numdev.weights.store import SortedValuesError, open_sorted_values, snapshot_sha256

    old = snapshot_sha256(sorted_run, 10)
    SnapshotWriter(sorted_run, "toy", SHAPES).write(10, _state(7.0))  # rewritten without its sorted values
    with pytest.raises(SortedValuesError, match=r"belongs to another snapshot of step 10 .*stale"):
        open_sorted_values(sorted_run, 10, snapshot_sha256(sorted_run, 10))
    open_sorted_values(sorted_run, 10, old).close()  # (the file itself is whole)


def test_readers_never_see_a_half_written_sorted_values_file(sorted_run):
    """A reference rewriting its sorted values (a resumed run) while comparing runs read them: every
    read is the whole old or the whole new file (written to a temporary, renamed into place)."""
    import threading

    import numpy as np

    from numdev.weights.store import open_sorted_values, snapshot_sha256, write_sorted_values

    sha = snapshot_sha256(sorted_run, 10)
    big = {"a.weight": torch.randn(600, 500), "b.bias": torch.randn(4000)}
    sets = _sorted_sets(big)
    write_sorted_values(sorted_run, 10, sha, sets)
    stop, errors = threading.Event(), []

    def writer():
        while not stop.is_set():
            write_sorted_values(sorted_run, 10, sha, sets)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(30):
            with open_sorted_values(sorted_run, 10, sha) as stored:
                got = stored.read("a.weight")
                if not np.array_equal(got, sets.sets["a.weight"]):
                    errors.append("torn")
    except Exception as error:  # noqa: BLE001
        errors.append(repr(error))
    finally:
        stop.set()
        thread.join()
    assert errors == []


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_written_files_have_the_mode_the_umask_gives(umask, tmp_path):
    """What numdev writes others can read: 0666 less the umask (0644 under the usual 022), not mkstemp's 0600."""
    from numdev.runs.atomic import append_jsonl, write_json

    old = os.umask(umask)
    try:
        write_json(tmp_path / "a.json", {"x": 1})
        append_jsonl(tmp_path / "b.jsonl", [{"x": 1}])
    finally:
        os.umask(old)
    for name in ("a.json", "b.jsonl"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name
    if umask == 0o022:
        assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644


def test_pruning_keeps_the_steps_asked_for_and_their_base_and_reads_back(run, tmp_path):
    from numdev.weights.store import prune_snapshots

    kept_bytes = (run / "weights" / snapshot_name(20)).stat().st_size
    freed = prune_snapshots(run, {20})
    assert list_snapshots(run) == [20] and freed > 0
    assert sorted(p.name for p in (run / "weights").glob("step_*")) == [snapshot_name(20)]
    assert (run / "weights" / snapshot_name(20)).stat().st_size == kept_bytes
    assert torch.equal(load_snapshot(run, 20)["b.bias"], _state(2.5)["b.bias"])  # verified against its checksum
    with pytest.raises(SnapshotError, match=r"has no snapshot at step\(s\) \[10\] to keep: nothing was removed"):
        prune_snapshots(run, {10, 20})
    assert list_snapshots(run) == [20]
    # a trained-only snapshot keeps step 0, which holds what it leaves out
    trained = tmp_path / "trained"
    writer = SnapshotWriter(trained, "toy", SHAPES, trained_only=True)
    for step, value in ((0, 0.5), (10, 1.5), (20, 2.5)):
        writer.write(step, _state(value), trained_rows={})
    before = {s: load_snapshot(trained, s) for s in (0, 20)}
    entry = next(e for e in json.loads((trained / "weights" / "index.json").read_text())["snapshots"] if e["step"] == 20)
    prune_snapshots(trained, {20})
    assert list_snapshots(trained) == sorted({20, *([entry["base_step"]] if "base_step" in entry else [])})
    assert all(torch.equal(load_snapshot(trained, 20)[k], before[20][k]) for k in SHAPES)
