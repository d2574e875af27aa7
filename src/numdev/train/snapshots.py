"""Weight snapshots of a run: write them during training, read them back for analysis.

Layout, in a run directory (see docs/run_layout.md):

    weights/step_00000000.safetensors   the model's parameters at global step 0 (initial weights)
    weights/step_00000100.safetensors   ... every snapshot.every_n_steps steps, and the final step
    weights/index.json                  {"format": 1, "model": <model config name>,
                                         "param_shapes": {name: shape},
                                         "snapshots": [{"step", "file", "sha256"}, ...]}

Tensors are float32 copies of the model's parameters (not buffers), keyed by parameter name, in
safetensors (no pickle). Each file is written atomically, then the index is rewritten
atomically, so a reader never sees a half-written file or an index entry without its file.
`load_snapshot` verifies the sha256 recorded in the index before it trusts a file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import safetensors.torch
import torch
from safetensors import SafetensorError

from numdev.atomic import write_bytes, write_json
from numdev.schemas import SNAPSHOT_INDEX

FORMAT = 1
WEIGHTS_DIR = "weights"
INDEX = "index.json"


class SnapshotError(ValueError):
    """A snapshot or the index is missing, corrupt or does not match: the message names the file."""


def snapshot_name(step: int) -> str:
    return f"step_{int(step):08d}.safetensors"


def weights_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / WEIGHTS_DIR


def parameter_state(named_parameters) -> dict[str, torch.Tensor]:
    """name -> float32, contiguous CPU copy, from (name, tensor) pairs."""
    return {name: p.detach().to(device="cpu", dtype=torch.float32).contiguous() for name, p in named_parameters}


class SnapshotWriter:
    """Appends snapshots to a run's weights/ directory (continuing an existing index on resume)."""

    def __init__(self, run_dir: str | Path, model_name: str, param_shapes: dict[str, list[int]]):
        self.directory = weights_dir(run_dir)
        self.index_path = self.directory / INDEX
        self.index = {"format": FORMAT, "model": model_name, "param_shapes": param_shapes, "snapshots": []}
        if self.index_path.exists():
            existing = read_index(run_dir)
            if existing["model"] != model_name or existing["param_shapes"] != param_shapes:
                raise SnapshotError(
                    f"{self.index_path} belongs to a different model ({existing['model']!r}): "
                    "use a new run directory, or resume with the run's own config"
                )
            self.index["snapshots"] = existing["snapshots"]

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


def read_index(run_dir: str | Path) -> dict:
    path = weights_dir(run_dir) / INDEX
    if not path.is_file():
        raise SnapshotError(f"{path} does not exist: {run_dir} is not a training run directory with snapshots")
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SnapshotError(f"{path} is not valid JSON ({error}): the index is corrupt") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or not isinstance(index.get("snapshots"), list):
        raise SnapshotError(f"{path}: not a format-{FORMAT} snapshot index")
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


def load_snapshot(run_dir: str | Path, step: int, verify: bool = True) -> dict[str, torch.Tensor]:
    """The parameters at `step` (name -> float32 tensor); with verify, the file's sha256 must match the index."""
    index = read_index(run_dir)
    entry = next((e for e in index["snapshots"] if int(e["step"]) == int(step)), None)
    if entry is None:
        steps = sorted(int(e["step"]) for e in index["snapshots"])
        listed = f"{steps[0]}..{steps[-1]} ({len(steps)} snapshots)" if steps else "none"
        raise SnapshotError(f"{weights_dir(run_dir) / INDEX}: no snapshot at step {step}; steps: {listed}")
    path = weights_dir(run_dir) / entry["file"]
    if not path.is_file():
        raise SnapshotError(f"{path} is missing (listed in {INDEX} for step {step})")
    data = path.read_bytes()
    if verify and hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise SnapshotError(f"{path}: sha256 does not match {INDEX}: the file is corrupt or was changed after it was written")
    try:
        state = safetensors.torch.load(data)
    except (SafetensorError, ValueError) as error:
        raise SnapshotError(f"{path} is not a readable safetensors file ({error})") from None
    shapes = {name: list(t.shape) for name, t in state.items()}
    if verify and shapes != index["param_shapes"]:
        raise SnapshotError(f"{path}: its tensors do not match the param_shapes of {INDEX}")
    return state
