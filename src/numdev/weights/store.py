"""Weight snapshots in a run directory: write them, read them back verified, rebuild their index.

Layout (numdev.runs.layout, docs/run_layout.md):

    weights/step_00000000.safetensors   the model's parameters at global step 0 (initial weights)
    weights/step_00000100.safetensors   ... every snapshot.every_n_steps steps, and the final step
    weights/index.json                  {"format": 1, "model": <model config name>,
                                         "param_shapes": {name: shape},
                                         "snapshots": [{"step", "file", "sha256"}, ...]}

Tensors are float32 copies of the model's parameters (not buffers), keyed by parameter name, in
safetensors (no pickle). An entry with "stored": "trained" (snapshot.trained_only, where it saves
disk) holds only the token-embedding rows the captions index, with their ids, and names its
"base_step" (0) for the rows that never train; load_snapshot rebuilds the whole tensors from both
files, each verified (numdev.runs.layout.TRAINED). Each file is written atomically, then the index is rewritten
atomically, so a reader never sees a half-written file or an index entry without its file.
`load_snapshot` verifies the sha256 recorded in the index before it trusts a file. A writer
opening a run directory lists every snapshot file the index lacks (an index deleted, or a kill
between a file and its index entry), each verified, so no snapshot is ever left unlisted.

A run that others compare with (snapshot.sorted_values=true) also writes its weight sets sorted:

    weights/sorted_00000100.safetensors  safetensors layout: one float32 tensor per weight set
                                         (numdev.weights.distances' sets), "__pooled__" (every
                                         value), metadata {"numdev": JSON {"format": 1, "step",
                                         "snapshot_sha256", "sets": [names], "rows": {tensor: sha256}}}

written atomically after the snapshot file and before its index entry, so a reader that sees the
step in the index finds the file complete. It is an optimisation only: `open_sorted_values` checks
that the header is whole and names this step and this snapshot's sha256 (a stale, moved, edited or
truncated file is a SortedValuesError), and the reader checks every array it uses against the
verified snapshot's values (numdev.weights.distances.prepare) and sorts them itself otherwise.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
from safetensors import SafetensorError

from numdev.runs.atomic import read_bounded, write_buffers, write_bytes, write_json
from numdev.runs.layout import (
    INDEX,
    INDEX_FORMAT,
    POOLED,
    ROWS_SUFFIX,
    SORTED_FORMAT,
    TRAINED,
    RunDir,
    rows_digest,
    snapshot_name,
)
from numdev.runs.schemas import SNAPSHOT_INDEX

log = logging.getLogger(__name__)
SNAPSHOT_FILE = re.compile(r"step_(\d{8})\.safetensors")


class SnapshotError(ValueError):
    """A snapshot or the index is missing, corrupt or does not match: the message names the file."""


class SortedValuesError(ValueError):
    """A sorted-values file is missing, damaged, or not this snapshot's: the message names the file
    and why. Readers then sort the values themselves; results never depend on the file."""


@dataclass
class SortedSets:
    """One snapshot's weight sets sorted, to be written beside it (weights/sorted_XXXXXXXX.safetensors)."""

    sets: dict[str, np.ndarray]  # set name -> its values, sorted (numdev.weights.distances.split_sets' sets)
    pooled: np.ndarray  # every value of the model, sorted
    rows: dict[str, np.ndarray] | None  # the indexed token-embedding rows the sets were split by


def parameter_state(named_parameters) -> dict[str, torch.Tensor]:
    """name -> float32, contiguous CPU copy, from (name, tensor) pairs (a copy even of float32 CPU
    parameters: listeners keep the state of a step after training has moved on)."""
    return {name: plain(p.detach()).to(device="cpu", dtype=torch.float32, copy=True, memory_format=torch.contiguous_format)
            for name, p in named_parameters}


def plain(t: torch.Tensor) -> torch.Tensor:
    """t as a plain torch.Tensor: a tensor subclass (torchao's weight wrappers, which safetensors and a
    weights_only checkpoint cannot hold) is copied element by element into one of its dtype and device."""
    if type(t) is torch.Tensor or isinstance(t, torch.nn.Parameter) and type(t.data) is torch.Tensor:
        return t
    out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    out.copy_(t.detach())  # in place: `out` stays a plain tensor whatever copy_ returns under the subclass's dispatch
    return out


class SnapshotWriter:
    """Appends snapshots to a run's weights/ directory, continuing (and completing) an existing index."""

    def __init__(self, run_dir: str | Path, model_name: str, param_shapes: dict[str, list[int]], trained_only: bool = False):
        self.run_dir = Path(run_dir)
        self.trained_only = trained_only
        self._base: dict[str, torch.Tensor] | None = None  # step 0's state, what a trained-only snapshot leaves out
        self.directory = RunDir(run_dir).weights
        self.index_path = RunDir(run_dir).index
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

    def write(self, step: int, state: dict[str, torch.Tensor], sorted_sets: SortedSets | None = None,
              trained_rows: dict[str, np.ndarray] | None = None) -> dict:
        """Write one snapshot (file, its sorted values if given, then the index); returns its index entry.

        With trained_only and `trained_rows` ({embedding: indexed row ids}), a step after 0 stores only
        those rows of the embedding when every other row equals step 0's (else the whole tensor)."""
        shapes = {name: list(t.shape) for name, t in state.items()}
        if shapes != self.index["param_shapes"]:
            raise SnapshotError(f"snapshot at step {step}: the parameters differ from {self.index_path}'s param_shapes")
        stored = self._trained_part(step, state, trained_rows) if self.trained_only else None
        # One metadata key only: safetensors writes a metadata map in hash order, so two keys
        # could swap places between processes and the same weights would hash differently.
        data = safetensors.torch.save(stored or state, metadata={"step": str(int(step))})
        entry = {"step": int(step), "file": snapshot_name(step), "sha256": hashlib.sha256(data).hexdigest()}
        if stored is not None:
            entry.update(stored=TRAINED, base_step=0)
        write_bytes(self.directory / entry["file"], data)
        if sorted_sets is not None:
            write_sorted_values(self.run_dir, step, entry["sha256"], sorted_sets)
        others = [e for e in self.index["snapshots"] if e["step"] != entry["step"]]
        self.index["snapshots"] = sorted([*others, entry], key=lambda e: e["step"])
        write_json(self.index_path, self.index)
        return entry

    def _trained_part(self, step: int, state: dict[str, torch.Tensor], trained_rows) -> dict[str, torch.Tensor] | None:
        """The trained-only tensors of `state`, or None where a whole snapshot is due (step 0, no rows,
        nothing saved, or rows outside the indexed ones that moved)."""
        if step == 0:
            self._base = {name: t.clone() for name, t in state.items()}
            return None
        if not trained_rows:
            return None
        if self._base is None:
            if 0 not in {int(e["step"]) for e in self.index["snapshots"]}:
                return None
            self._base = load_snapshot(self.run_dir, 0)
        out = dict(state)
        saved = 0
        for name, ids in trained_rows.items():
            full = state[name]
            index = torch.as_tensor(np.asarray(ids, dtype=np.int64))
            untrained = torch.ones(full.shape[0], dtype=torch.bool)
            untrained[index] = False
            if not torch.equal(full[untrained], self._base[name][untrained]):
                return None  # rows that should not train moved (weight decay?): keep the whole tensor
            out[name] = full[index].contiguous()
            out[name + ROWS_SUFFIX] = index.contiguous()
            saved += int(untrained.sum())
        return out if saved else None


def verified_entry(path: Path, step: int, param_shapes: dict[str, list[int]]) -> dict:
    """The index entry of a snapshot file that has no entry yet: readable safetensors, its metadata
    step equal to its name's, its tensors the run's parameter shapes."""
    data = read_snapshot_bytes(path, param_shapes)
    state = _parse(path, data)
    trained = any(name.endswith(ROWS_SUFFIX) for name in state)
    if trained:
        state = {n: t for n, t in state.items() if not n.endswith(ROWS_SUFFIX) and n + ROWS_SUFFIX not in state}
        param_shapes = {n: s for n, s in param_shapes.items() if n in state}
    if _metadata_step(data) != step:
        raise SnapshotError(f"{path}: its metadata step is not {step}: the file was renamed or is not a numdev snapshot; move it away")
    if {name: list(t.shape) for name, t in state.items()} != param_shapes:
        raise SnapshotError(f"{path}: its tensors do not match the run's param_shapes: it belongs to another model; move it away")
    _check_float32(path, state)
    entry = {"step": step, "file": path.name, "sha256": hashlib.sha256(data).hexdigest()}
    return {**entry, "stored": TRAINED, "base_step": 0} if trained else entry


def read_index(run_dir: str | Path) -> dict:
    path = RunDir(run_dir).index
    if not path.is_file():
        raise SnapshotError(f"{path} does not exist: {run_dir} is not a training run directory with snapshots")
    try:
        index = json.loads(read_bounded(path, what="snapshot index").decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SnapshotError(f"{path} is not valid JSON ({error}): the index is corrupt") from None
    except ValueError as error:  # larger than any index (extended): not read
        raise SnapshotError(str(error)) from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT or not isinstance(index.get("snapshots"), list):
        raise SnapshotError(f"{path}: not a format-{INDEX_FORMAT} snapshot index")
    try:  # fields and types (numdev.runs.schemas), and file names confined to weights/
        SNAPSHOT_INDEX.check(path, index)
    except ValueError as error:
        raise SnapshotError(str(error)) from None
    seen = set()
    for entry in index["snapshots"]:
        if entry["step"] < 0:
            raise SnapshotError(f"{path}: lists step {entry['step']}, a negative step: the index was edited; restore it from a copy")
        if entry["step"] in seen:
            raise SnapshotError(f"{path}: lists step {entry['step']} twice: the index was edited; restore it from a copy "
                                "(or delete it: a resumed run lists every verified snapshot file again)")
        seen.add(entry["step"])
        if entry["file"] != snapshot_name(entry["step"]):
            raise SnapshotError(f"{path}: step {entry['step']} lists file {entry['file']!r}, not {snapshot_name(entry['step'])!r}: the index was edited")
    return index


def prune_snapshots(run_dir: str | Path, keep: set[int]) -> int:
    """Keep only the snapshots at `keep` (and the step each stores its untrained part against): the index
    first (rewritten atomically: a crash leaves files it no longer lists, which a resumed run lists again after
    verifying them), then every other snapshot file and every sorted-values file of a step not kept.
    Returns the bytes freed. What a finished study's analysis reads from a run after it: its final and step-0
    snapshots (function-level measures, the loss barrier); the distances are in sibling/*.csv."""
    directory = RunDir(run_dir).weights
    index = read_index(run_dir)
    listed = {int(e["step"]): e for e in index["snapshots"]}
    missing = sorted(set(keep) - set(listed))
    if missing:
        raise SnapshotError(f"{RunDir(run_dir).index}: has no snapshot at step(s) {missing} to keep: nothing was removed")
    kept = set(keep) | {int(listed[s]["base_step"]) for s in keep if "base_step" in listed[s]}
    index["snapshots"] = [e for e in index["snapshots"] if int(e["step"]) in kept]
    write_json(RunDir(run_dir).index, index)  # a WriteError naming the file when it cannot be written
    freed = 0
    for path in sorted(directory.iterdir()):
        match = re.fullmatch(r"(step|sorted)_(\d{8})\.safetensors", path.name)
        if match is None or int(match[2]) in kept:
            continue
        try:
            size = path.stat().st_size
            path.unlink()
        except OSError as error:
            raise SnapshotError(f"{path}: could not be removed ({error.strerror or error}); the index already lists only the "
                                f"kept steps, so the rest can be deleted by hand or this rerun") from None
        freed += size
    return freed


def list_snapshots(run_dir: str | Path) -> list[int]:
    """Steps with a snapshot, ascending."""
    return sorted(int(e["step"]) for e in read_index(run_dir)["snapshots"])


def snapshot_sha256(run_dir: str | Path, step: int) -> str:
    """The checksum the index records for `step` (identifies the snapshot's content)."""
    return _entry(read_index(run_dir), run_dir, step)["sha256"]


def load_snapshot(run_dir: str | Path, step: int, verify: bool = True) -> dict[str, torch.Tensor]:
    """The parameters at `step` (name -> float32 tensor); with verify, the file's sha256 must match the index."""
    return load_snapshot_entry(run_dir, step, verify)[0]


def load_snapshot_entry(run_dir: str | Path, step: int, verify: bool = True) -> tuple[dict[str, torch.Tensor], str]:
    """load_snapshot's parameters and the sha256 the index records for them (read from the same index)."""
    index = read_index(run_dir)
    entry = _entry(index, run_dir, step)
    path = RunDir(run_dir).weights / entry["file"]
    if not path.is_file():
        raise SnapshotError(f"{path} is missing (listed in {INDEX} for step {step})")
    data = read_snapshot_bytes(path, index["param_shapes"])
    if verify and hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise SnapshotError(f"{path}: sha256 does not match {INDEX}: the file is corrupt or was changed after it was written")
    state = _parse(path, data)
    if entry.get("stored") == TRAINED:
        state = _rebuild(run_dir, path, state, int(entry.get("base_step", 0)), verify)
    shapes = {name: list(t.shape) for name, t in state.items()}
    if verify and shapes != index["param_shapes"]:
        raise SnapshotError(f"{path}: its tensors do not match the param_shapes of {INDEX}")
    _check_float32(path, state)  # a checksum recomputed after a rewrite in another dtype proves nothing
    return state, entry["sha256"]


MAX_SNAPSHOT_HEADER = 1 << 24  # bytes; a real header is a few kB (one entry per parameter)


def read_snapshot_bytes(path: Path, param_shapes: dict) -> bytes:
    """A snapshot file's bytes, read only once its size is known to be at most what a snapshot of the
    run's param_shapes can take (every parameter in float32, the rows' ids, a header): a file extended
    (a sparse 100 GB `truncate`) or replaced by something much larger is a SnapshotError before anything
    is read. A file within that size is read and checked as before (sha256, safetensors, shapes)."""
    try:
        size = path.stat().st_size
        limit = 8 + MAX_SNAPSHOT_HEADER + 2 * 4 * sum(_numel(shape) for shape in param_shapes.values()) + (1 << 20)
        if size > limit:
            raise SnapshotError(f"{path}: {size} bytes, far more than a snapshot of this model holds (at most {limit}): the file "
                                "was extended or replaced after it was written; restore it from a copy (nothing was read)")
        with open(path, "rb") as handle:
            return handle.read(limit + 1)
    except OSError as error:
        raise SnapshotError(f"{path} could not be read ({error.strerror or error})") from None


def _numel(shape) -> int:
    total = 1
    for n in shape if isinstance(shape, list) else []:
        total *= int(n) if isinstance(n, int) and n > 0 else 1
    return total


def _check_float32(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Snapshots are float32 (module doc); a file rewritten in another dtype is refused, naming a tensor."""
    other = next(((name, t.dtype) for name, t in state.items() if t.dtype != torch.float32), None)
    if other is not None:
        raise SnapshotError(
            f"{path}: tensor {other[0]!r} is {str(other[1]).removeprefix('torch.')}, not float32: the snapshot was "
            "rewritten after numdev wrote it (its sha256 in the index too); restore the run from a copy"
        )


def _rebuild(run_dir, path: Path, stored: dict[str, torch.Tensor], base_step: int, verify: bool) -> dict[str, torch.Tensor]:
    """A trained-only snapshot made whole: its embedding rows written over the base snapshot's."""
    base = load_snapshot(run_dir, base_step, verify)
    state = {}
    for name, tensor in stored.items():
        if name.endswith(ROWS_SUFFIX):
            continue
        ids = stored.get(name + ROWS_SUFFIX)
        if ids is None:
            state[name] = tensor
            continue
        if name not in base or ids.numel() != tensor.shape[0] or (ids.numel() and int(ids.max()) >= base[name].shape[0]):
            raise SnapshotError(f"{path}: the stored rows of {name} do not fit step {base_step}'s tensor: the file is not this run's")
        full = base[name].clone()
        full[ids] = tensor
        state[name] = full
    return state


def _entry(index: dict, run_dir: str | Path, step: int) -> dict:
    entry = next((e for e in index["snapshots"] if int(e["step"]) == int(step)), None)
    if entry is None:
        steps = sorted(int(e["step"]) for e in index["snapshots"])
        listed = f"{steps[0]}..{steps[-1]} ({len(steps)} snapshots)" if steps else "none"
        raise SnapshotError(f"{RunDir(run_dir).index}: no snapshot at step {step}; steps: {listed}")
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


# -- sorted values ------------------------------------------------------------------------------------

MAX_SORTED_HEADER = 1 << 24  # bytes; a real header is a few kB (one entry per weight set)


def write_sorted_values(run_dir: str | Path, step: int, snapshot_sha256: str, sorted_sets: SortedSets) -> Path:
    """weights/sorted_XXXXXXXX.safetensors of the snapshot at `step` (whose file has `snapshot_sha256`), atomically."""
    arrays = {name: _float32(values) for name, values in sorted_sets.sets.items()}
    if POOLED in arrays:
        raise ValueError(f"a weight set may not be named {POOLED!r}")
    arrays[POOLED] = _float32(sorted_sets.pooled)
    header, offset = {}, 0
    for name, values in arrays.items():
        header[name] = {"dtype": "F32", "shape": [values.size], "data_offsets": [offset, offset + values.nbytes]}
        offset += values.nbytes
    meta = {"format": SORTED_FORMAT, "step": int(step), "snapshot_sha256": snapshot_sha256,
            "sets": list(sorted_sets.sets), "rows": rows_digest(sorted_sets.rows)}
    header["__metadata__"] = {"numdev": json.dumps(meta, sort_keys=True)}
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)  # safetensors pads its header with spaces to 8 bytes
    path = RunDir(run_dir).sorted_values(step)
    write_buffers(path, [struct.pack("<Q", len(text)), text, *arrays.values()])
    return path


class SortedFile:
    """An open sorted-values file whose header is whole and names the snapshot it was asked for.

    `sets` lists its weight sets, `rows` the split they were made with (run_layout.rows_digest);
    `read(name)` reads one set (or POOLED). The values themselves are unchecked here: the reader
    checks them against the snapshot's (numdev.weights.distances.prepare). Use as a context manager.
    """

    def __init__(self, path: Path, handle, data_start: int, entries: dict[str, tuple[int, int]], sets: list[str], rows: dict[str, str]):
        self.path, self._handle, self._data_start, self._entries = path, handle, data_start, entries
        self.sets, self.rows = sets, rows

    def read(self, name: str) -> np.ndarray:
        begin, end = self._entries[name]
        out = np.empty((end - begin) // 4, dtype="<f4")
        try:
            got = _pread_into(self._handle.fileno(), out, self._data_start + begin) if out.nbytes else 0
        except OSError as error:
            raise SortedValuesError(f"{self.path}: could not be read ({error.strerror or error})") from None
        if got != out.nbytes:
            raise SortedValuesError(f"{self.path}: {name!r} ends early: the file was truncated")
        return out

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> SortedFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_sorted_values(run_dir: str | Path, step: int, snapshot_sha256: str) -> SortedFile:
    """The sorted values of the snapshot at `step` whose file has `snapshot_sha256`; a file that is
    missing, unreadable, truncated, of another step or snapshot (stale, moved) is a SortedValuesError."""
    path = RunDir(run_dir).sorted_values(step)
    try:
        handle = open(path, "rb", buffering=0)  # noqa: SIM115 (SortedFile closes it)
    except FileNotFoundError:
        raise SortedValuesError(f"{path} does not exist") from None
    except OSError as error:
        raise SortedValuesError(f"{path} could not be opened ({error.strerror or error})") from None
    try:
        return _sorted_file(path, handle, step, snapshot_sha256)
    except BaseException:
        handle.close()
        raise


def _sorted_file(path: Path, handle, step: int, snapshot_sha256: str) -> SortedFile:
    def bad(problem: str) -> SortedValuesError:
        return SortedValuesError(f"{path}: {problem}")

    size = os.fstat(handle.fileno()).st_size
    head = handle.read(8)
    if len(head) < 8:
        raise bad("shorter than a safetensors header: the file was truncated")
    (length,) = struct.unpack("<Q", head)
    if length > min(size - 8, MAX_SORTED_HEADER):
        raise bad("its header length is out of range: the file is truncated or not a numdev sorted-values file")
    try:
        header = json.loads(handle.read(length))
        meta = json.loads(header["__metadata__"]["numdev"])
    except (ValueError, KeyError, TypeError):
        raise bad("its header is not numdev's (JSON with a 'numdev' metadata record): corrupt or not written by numdev") from None
    if not isinstance(meta, dict) or meta.get("format") != SORTED_FORMAT:
        raise bad(f"not a format-{SORTED_FORMAT} sorted-values file")
    if meta.get("step") != int(step) or isinstance(meta.get("step"), bool):
        raise bad(f"it is the sorted values of step {meta.get('step')!r}, not {step}: the file was moved or renamed")
    if meta.get("snapshot_sha256") != snapshot_sha256:
        raise bad(f"it belongs to another snapshot of step {step} (sha256 {str(meta.get('snapshot_sha256'))[:12]}..., "
                  f"the snapshot's is {snapshot_sha256[:12]}...): stale, written before the snapshot was rewritten")
    sets, rows = meta.get("sets"), meta.get("rows")
    if (not isinstance(sets, list) or not all(isinstance(n, str) for n in sets) or len(set(sets)) != len(sets)
            or POOLED in sets or not isinstance(rows, dict) or not all(isinstance(v, str) for v in rows.values())):
        raise bad("its 'sets' or 'rows' record is malformed: the file was edited")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    if set(tensors) != {*sets, POOLED}:
        raise bad("its tensors are not the weight sets its record lists: the file was edited")
    data = size - 8 - length
    entries = {}
    for name, entry in tensors.items():
        if not isinstance(entry, dict) or entry.get("dtype") != "F32":
            raise bad(f"{name!r} is not a float32 tensor")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not (_ints(shape) and len(shape) == 1 and _ints(offsets) and len(offsets) == 2):
            raise bad(f"{name!r} has a malformed shape or data_offsets")
        begin, end = offsets
        if not 0 <= begin <= end or end - begin != 4 * shape[0]:
            raise bad(f"{name!r}: its data_offsets do not hold {shape[0]} float32 values")
        if end > data:
            raise bad(f"{name!r} ends past the end of the file: the file was truncated")
        entries[name] = (begin, end)
    return SortedFile(path, handle, 8 + length, entries, sets, rows)


def _pread_into(fd: int, out: np.ndarray, offset: int) -> int:
    """Read into `out` at `offset` of the file, without moving a shared file position (readers in threads)."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [out], offset)
    data = os.pread(fd, out.nbytes, offset)  # (platforms without preadv: one copy more)
    out.view(np.uint8)[: len(data)] = np.frombuffer(data, np.uint8)
    return len(data)


def _ints(values) -> bool:
    return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


def _float32(values) -> np.ndarray:
    return np.ascontiguousarray(values, dtype="<f4").reshape(-1)
