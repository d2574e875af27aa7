"""Lightning checkpoints written atomically, checksummed, and read back without executing pickled code.

Lightning's own TorchCheckpointIO writes through an fsspec transaction (a rename, but no fsync)
and unpickles with whatever `weights_only` the caller passes. Here every checkpoint goes through
numdev.runs.atomic (temporary file, fsync, rename: a SIGKILL mid-write leaves the previous
last.ckpt intact) and is always read with `torch.load(weights_only=True)`: tensors, plain
containers and numbers only, so a checkpoint from elsewhere cannot run code when it is loaded.
A truncated, corrupt or unsafe file is a `CheckpointError` naming the file and the reason.

Integrity: beside each checkpoint, `<name>.sha256` (run_layout.checkpoint_digest_path) records
{"sha256": <the checkpoint's>, "previous": <the one it replaces>, "bytes", "previous_bytes": their
sizes}; a checkpoint's size is checked against them before it is read (a file extended to 100 GB is
refused without reading it; for records written before the sizes, the sha256 of a file above 1 GiB is
read in chunks first). It is written (atomically)
before the checkpoint, so whenever a kill falls between the two writes the checkpoint on disk is
one of the two it lists; a checkpoint matching neither was changed after it was written (a bit
flip, an edit, a copy gone wrong) and is refused at every load, resume=true and resume=auto alike,
with what to do. A checkpoint without the file is refused too: numdev writes the file before every
checkpoint, so its absence means the pair was separated (a copy of the checkpoint alone, a deletion)
and nothing says the weights are the ones that were written.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from numdev.runs.atomic import read_bounded, write_bytes, write_json
from numdev.runs.layout import checkpoint_digest_path
from numdev.runs.provenance import file_sha256
from numdev.weights.store import plain


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupt or holds pickled objects: the message names the file."""


def save_checkpoint(checkpoint: dict[str, Any], path: str | Path) -> None:
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(_plain_tensors(checkpoint), buffer)
    data = buffer.getvalue()
    digest = checkpoint_digest_path(path)
    previous, previous_bytes = (file_sha256(path), path.stat().st_size) if path.is_file() else (None, None)
    write_json(digest, {"sha256": hashlib.sha256(data).hexdigest(), "previous": previous, "bytes": len(data),
                        "previous_bytes": previous_bytes})
    write_bytes(path, data)


def _plain_tensors(value):
    """The checkpoint with every tensor subclass (torchao's weight wrappers) stored as a plain tensor, so it
    loads with weights_only=True; loading copies the values back into the model's own parameters."""
    if isinstance(value, torch.Tensor):
        return plain(value)
    if isinstance(value, dict):
        return type(value)((k, _plain_tensors(v)) for k, v in value.items())  # dict, OrderedDict (state dicts)
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_plain_tensors(v) for v in value)
    return value


def _check_size(path: Path) -> None:
    """Before a checkpoint is read whole: its size must be one its checksum record lists (records written
    before the sizes were kept: its sha256, read in chunks, must match first), so an extended (a sparse
    100 GB truncate) or damaged file is refused without reading it into memory."""
    digest_path = checkpoint_digest_path(path)
    try:
        record = json.loads(read_bounded(digest_path, 1 << 20, "checksum record").decode("utf-8"))
    except FileNotFoundError:
        return  # missing: _check_digest names it once the file has been read
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{digest_path}: not a checksum record ({str(error).splitlines()[0][:200] if str(error) else type(error).__name__}): it is corrupt, so {path} cannot be "
                              "verified; restore both from a copy, or move the checkpoints/ directory aside and rerun with resume=auto") from None
    if not isinstance(record, dict):
        return
    size = path.stat().st_size
    sizes = {record.get("bytes"), record.get("previous_bytes")} - {None}
    if sizes and all(isinstance(n, int) and not isinstance(n, bool) for n in sizes):
        # Larger than twice what was written: extended or replaced, refused unread. A file up to that size
        # is read and checked (its content names what is wrong: truncated, pickled code, not Lightning's).
        if size > 2 * max(sizes) + (1 << 20):
            raise CheckpointError(
                f"{path} is not a readable checkpoint ({size} bytes, far more than the {' or '.join(map(str, sorted(sizes)))} "
                f"its {digest_path.name} records): it was extended or replaced, or is corrupt; restore it from a copy, or move "
                "it aside and rerun with resume=auto to train again from step 0 (nothing was read)"
            )
        return
    if size > (1 << 30) and file_sha256(path) not in {record.get("sha256"), record.get("previous")}:
        raise CheckpointError(f"{path}: its sha256 does not match {digest_path.name} ({size} bytes): the checkpoint was changed "
                              "or damaged after it was written; restore it from a copy, or move it aside and rerun with resume=auto")


def _check_digest(path: Path, data: bytes) -> None:
    digest_path = checkpoint_digest_path(path)
    if not digest_path.is_file():
        raise CheckpointError(
            f"{path}: its checksum file {digest_path.name} is missing, so the checkpoint cannot be verified (numdev "
            "writes it before every checkpoint); copy it along with the checkpoint, or move the checkpoints/ directory "
            "aside and rerun with resume=auto to train again from step 0 (the snapshots come out the same)"
        )
    try:
        record = json.loads(read_bounded(digest_path, 1 << 20, "checksum record").decode("utf-8"))
        known = {record["sha256"], record.get("previous")} - {None}
        if not all(isinstance(k, str) and len(k) == 64 for k in known):
            raise TypeError
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(
            f"{digest_path}: not a checksum record ({{\"sha256\": ..., \"previous\": ...}}): it is corrupt, so {path} "
            "cannot be verified; restore both from a copy, or move the checkpoints/ directory aside and rerun with "
            "resume=auto to train again from step 0"
        ) from None
    if hashlib.sha256(data).hexdigest() not in known:
        raise CheckpointError(
            f"{path}: its sha256 does not match {digest_path.name}: the checkpoint was changed or damaged after it was "
            "written, and resuming from it would continue from other weights; restore it from a copy, or move it aside "
            "and rerun with resume=auto to train again from step 0 (the snapshots come out the same)"
        )


def load_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """The checkpoint's dict, unpickled with weights_only=True and checked against its checksum;
    one-line CheckpointError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    try:
        _check_size(path)
        data = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"{path} could not be read ({error.strerror or error})") from None
    try:
        checkpoint = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        unsafe = next((line for line in lines if "GLOBAL" in line), None)
        if unsafe is not None:
            raise CheckpointError(
                f"{path}: refused to load: it holds pickled objects other than tensors and plain data "
                f"({unsafe.rstrip('.')[:200]}); numdev loads checkpoints with weights_only=True, "
                "so only checkpoints written by numdev-train can be resumed"
            ) from None
        reason = next((line for line in lines if line.startswith("Unsupported")), lines[0] if lines else "unpickling failed")
        raise CheckpointError(f"{path} is not a readable checkpoint ({reason[:200]}): it is truncated or corrupt") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{path} is not a readable checkpoint ({reason[:200]}): it is truncated or corrupt") from None
    if not isinstance(checkpoint, dict) or "global_step" not in checkpoint or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is not a Lightning checkpoint (no global_step / state_dict)")
    _check_digest(path, data)
    return checkpoint


class SafeCheckpointIO(TorchCheckpointIO):
    """Trainer plugin: atomic, checksummed writes, weights_only=True verified reads (whatever Lightning asks for)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("SafeCheckpointIO takes no storage_options")
        save_checkpoint(checkpoint, path)

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        return load_checkpoint(path, "cpu" if map_location is None else map_location)

    def remove_checkpoint(self, path) -> None:
        super().remove_checkpoint(path)
        checkpoint_digest_path(path).unlink(missing_ok=True)
