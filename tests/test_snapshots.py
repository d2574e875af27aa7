"""Weight snapshots: layout, index, and a reader that refuses missing, corrupt or tampered files."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from numdev.snapshot_store import SnapshotError, SnapshotWriter, list_snapshots, load_snapshot, snapshot_name

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
