"""Weight snapshots in a run directory: write them, read them back verified, rebuild their index.

Layout (numdev.run_layout, docs/run_layout.md):

    weights/step_00000000.safetensors   the model's parameters at global step 0 (initial weights)
    weights/step_00000100.safetensors   ... every snapshot.every_n_steps steps, and the final step
    weights/index.json                  {"format": 1, "model": <model config name>,
                                         "param_shapes": {name: shape},
                                         "snapshots": [{"step", "file", "sha256"}, ...]}

Tensors are float32 copies of the model's parameters (not buffers), keyed by parameter name, in
safetensors (no pickle). Each file is written atomically, then the index is rewritten
atomically, so a reader never sees a half-written file or an index entry without its file.
`load_snapshot` verifies the sha256 recorded in the index before it trusts a file. A writer
opening a run directory lists every snapshot file the index lacks (an index deleted, or a kill
between a file and its index entry), each verified, so no snapshot is ever left unlisted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import struct
from pathlib import Path

import safetensors.torch
import torch
from safetensors import SafetensorError

from numdev.atomic import write_bytes, write_json
from numdev.run_layout import INDEX, INDEX_FORMAT, index_path, snapshot_name, weights_dir
from numdev.schemas import SNAPSHOT_INDEX

log = logging.getLogger(__name__)
SNAPSHOT_FILE = re.compile(r"step_(\d{8})\.safetensors")


class SnapshotError(ValueError):
    """A snapshot or the index is missing, corrupt or does not match: the message names the file."""


def parameter_state(named_parameters) -> dict[str, torch.Tensor]:
    """name -> float32, contiguous CPU copy, from (name, tensor) pairs (a copy even of float32 CPU
    parameters: listeners keep the state of a step after training has moved on)."""
    return {
        name: p.detach().to(device="cpu", dtype=torch.float32, copy=True, memory_format=torch.contiguous_format)
        for name, p in named_parameters
    }


class SnapshotWriter:
    """Appends snapshots to a run's weights/ directory, continuing (and completing) an existing index."""

    def __init__(self, run_dir: str | Path, model_name: str, param_shapes: dict[str, list[int]]):
        self.run_dir = Path(run_dir)
        self.directory = weights_dir(run_dir)
        self.index_path = index_path(run_dir)
        self.index = {"format": INDEX_FORMAT, "model": model_name, "param_shapes": param_shapes, "snapshots": []}
        if self.index_path.exists():
            existing = read_index(run_dir)
            if existing["model"] != model_name or existing["param_shapes"] != param_shapes:
                raise SnapshotError(
                    f"{self.index_path} belongs to a different model ({existing['model']!r}): "
                    "use a new run directory, or resume with the run's own config"
                )
            self.index["snapshots"] = existing["snapshots"]
        self.list_unlisted_files()

    def list_unlisted_files(self) -> list[int]:
        """Add every verified snapshot file the index does not list; returns their steps."""
        listed = {int(e["step"]) for e in self.index["snapshots"]}
        found = []
        for path in sorted(self.directory.glob("step_*.safetensors")) if self.directory.is_dir() else []:
            match = SNAPSHOT_FILE.fullmatch(path.name)
            if match is None or int(match[1]) in listed:
                continue
            found.append(verified_entry(path, int(match[1]), self.index["param_shapes"]))
        if found:
            self.index["snapshots"] = sorted([*self.index["snapshots"], *found], key=lambda e: e["step"])
            write_json(self.index_path, self.index)
            steps = [e["step"] for e in found]
            log.warning("%s lacked %d snapshot file(s), now listed after verification: steps %s", self.index_path, len(steps), steps)
        return [e["step"] for e in found]

    def write(self, step: int, state: dict[str, torch.Tensor]) -> dict:
        """Write one snapshot (file, then index); returns its index entry."""
        shapes = {name: list(t.shape) for name, t in state.items()}
        if shapes != self.index["param_shapes"]:
            raise SnapshotError(f"snapshot at step {step}: the parameters differ from {self.index_path}'s param_shapes")
        # One metadata key only: safetensors writes a metadata map in hash order, so two keys
        # could swap places between processes and the same weights would hash differently.
        data = safetensors.torch.save(state, metadata={"step": str(int(step))})
        entry = {"step": int(step), "file": snapshot_name(step), "sha256": hashlib.sha256(data).hexdigest()}
        write_bytes(self.directory / entry["file"], data)
        others = [e for e in self.index["snapshots"] if e["step"] != entry["step"]]
        self.index["snapshots"] = sorted([*others, entry], key=lambda e: e["step"])
        write_json(self.index_path, self.index)
        return entry


def verified_entry(path: Path, step: int, param_shapes: dict[str, list[int]]) -> dict:
    """The index entry of a snapshot file that has no entry yet: readable safetensors, its metadata
    step equal to its name's, its tensors the run's parameter shapes."""
    data = path.read_bytes()
    state = _parse(path, data)
    if _metadata_step(data) != step:
        raise SnapshotError(f"{path}: its metadata step is not {step}: the file was renamed or is not a numdev snapshot; move it away")
    if {name: list(t.shape) for name, t in state.items()} != param_shapes:
        raise SnapshotError(f"{path}: its tensors do not match the run's param_shapes: it belongs to another model; move it away")
    return {"step": step, "file": path.name, "sha256": hashlib.sha256(data).hexdigest()}


def read_index(run_dir: str | Path) -> dict:
    path = index_path(run_dir)
    if not path.is_file():
        raise SnapshotError(f"{path} does not exist: {run_dir} is not a training run directory with snapshots")
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SnapshotError(f"{path} is not valid JSON ({error}): the index is corrupt") from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT or not isinstance(index.get("snapshots"), list):
        raise SnapshotError(f"{path}: not a format-{INDEX_FORMAT} snapshot index")
    try:  # fields and types (numdev.schemas), and file names confined to weights/
        SNAPSHOT_INDEX.check(path, index)
    except ValueError as error:
        raise SnapshotError(str(error)) from None
    for entry in index["snapshots"]:
        if entry["file"] != snapshot_name(entry["step"]):
            raise SnapshotError(f"{path}: step {entry['step']} lists file {entry['file']!r}, not {snapshot_name(entry['step'])!r}: the index was edited")
    return index


def list_snapshots(run_dir: str | Path) -> list[int]:
    """Steps with a snapshot, ascending."""
    return sorted(int(e["step"]) for e in read_index(run_dir)["snapshots"])


def snapshot_sha256(run_dir: str | Path, step: int) -> str:
    """The checksum the index records for `step` (identifies the snapshot's content)."""
    return _entry(read_index(run_dir), run_dir, step)["sha256"]


def load_snapshot(run_dir: str | Path, step: int, verify: bool = True) -> dict[str, torch.Tensor]:
    """The parameters at `step` (name -> float32 tensor); with verify, the file's sha256 must match the index."""
    index = read_index(run_dir)
    entry = _entry(index, run_dir, step)
    path = weights_dir(run_dir) / entry["file"]
    if not path.is_file():
        raise SnapshotError(f"{path} is missing (listed in {INDEX} for step {step})")
    data = path.read_bytes()
    if verify and hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise SnapshotError(f"{path}: sha256 does not match {INDEX}: the file is corrupt or was changed after it was written")
    state = _parse(path, data)
    shapes = {name: list(t.shape) for name, t in state.items()}
    if verify and shapes != index["param_shapes"]:
        raise SnapshotError(f"{path}: its tensors do not match the param_shapes of {INDEX}")
    return state


def _entry(index: dict, run_dir: str | Path, step: int) -> dict:
    entry = next((e for e in index["snapshots"] if int(e["step"]) == int(step)), None)
    if entry is None:
        steps = sorted(int(e["step"]) for e in index["snapshots"])
        listed = f"{steps[0]}..{steps[-1]} ({len(steps)} snapshots)" if steps else "none"
        raise SnapshotError(f"{index_path(run_dir)}: no snapshot at step {step}; steps: {listed}")
    return entry


def _parse(path: Path, data: bytes) -> dict[str, torch.Tensor]:
    try:
        return safetensors.torch.load(data)
    except (SafetensorError, ValueError) as error:
        raise SnapshotError(f"{path} is not a readable safetensors file ({error})") from None


def _metadata_step(data: bytes) -> int | None:
    """The "step" of a safetensors header's metadata (the header: 8-byte length, then JSON)."""
    try:
        (length,) = struct.unpack("<Q", data[:8])
        step = json.loads(data[8 : 8 + length]).get("__metadata__", {}).get("step")
        return int(step)
    except (struct.error, ValueError, TypeError, AttributeError):
        return None
