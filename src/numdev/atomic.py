"""Atomic file writes: a reader sees the old file or the new one, never a half-written one.

Each write goes to a temporary file in the same directory, is flushed and fsynced, then renamed
over the target (rename is atomic within a file system).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files that writes killed mid-way (SIGKILL, power loss) left in `directory`.

    Only call this when no other process is writing there (e.g. when a run resumes).
    """
    directory = Path(directory)
    stale = sorted(directory.glob(".*.tmp")) if directory.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def append_jsonl(path: str | os.PathLike, records: list[dict]) -> None:
    """Append records as JSON lines by rewriting the whole file atomically."""
    path = Path(path)
    old = path.read_bytes() if path.exists() else b""
    if old and not old.endswith(b"\n"):
        raise ValueError(f"{path} does not end with a newline: it was truncated; move it aside and rerun")
    new = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in records)
    write_bytes(path, old + new.encode("utf-8"))


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Records of a JSON-lines file; a corrupt line is an error naming the file and line."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg}); the file is corrupt") from None
    return records
