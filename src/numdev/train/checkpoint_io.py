"""Lightning checkpoints written atomically and read back without executing pickled code.

Lightning's own TorchCheckpointIO writes through an fsspec transaction (a rename, but no fsync)
and unpickles with whatever `weights_only` the caller passes. Here every checkpoint goes through
numdev.atomic (temporary file, fsync, rename: a SIGKILL mid-write leaves the previous
last.ckpt intact) and is always read with `torch.load(weights_only=True)`: tensors, plain
containers and numbers only, so a checkpoint from elsewhere cannot run code when it is loaded.
A truncated, corrupt or unsafe file is a `CheckpointError` naming the file and the reason.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from numdev.atomic import write_bytes


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupt or holds pickled objects: the message names the file."""


def save_checkpoint(checkpoint: dict[str, Any], path: str | Path) -> None:
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    write_bytes(path, buffer.getvalue())


def load_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """The checkpoint's dict, unpickled with weights_only=True; one-line CheckpointError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
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
    return checkpoint


class SafeCheckpointIO(TorchCheckpointIO):
    """Trainer plugin: atomic writes, weights_only=True reads (whatever Lightning asks for)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("SafeCheckpointIO takes no storage_options")
        save_checkpoint(checkpoint, path)

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        return load_checkpoint(path, "cpu" if map_location is None else map_location)
