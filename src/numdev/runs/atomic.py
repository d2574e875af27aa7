"""Atomic file writes: a reader sees the old file or the new one, never a half-written one.

Each write goes to a temporary file in the same directory, is flushed and fsynced, then renamed
over the target (rename is atomic within a file system). A write that fails (disk full, quota,
read-only or permission) removes its temporary file, leaves the target as it was, and raises
`WriteError`, an OSError whose message is one line naming the file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import tempfile
from pathlib import Path


class WriteError(OSError):
    """Writing `path` failed; the file is unchanged (or absent) and no temporary file is left."""

    def __init__(self, path: Path, error: OSError):
        super().__init__(error.errno, error.strerror or str(error))
        self.path = path
        self.message = (
            f"could not write {path}: {error.strerror or error}; nothing was changed there: "
            "free some space (or fix the permissions), or write somewhere else"
        )

    def __str__(self) -> str:
        return self.message


class NotARegularFile(ValueError):
    """The target exists and is a FIFO, a device, a socket or a directory: an atomic write (a rename
    over it) would replace it with a regular file, so nothing is written."""


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def check_regular_target(path: str | os.PathLike) -> None:
    """Refuse to write over anything but a regular file (or nothing): one line naming it."""
    parent = Path(path).parent
    if parent.exists() and not parent.is_dir():
        raise NotARegularFile(f"{parent} is not a directory, so {path} cannot be written there: give a directory path")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # absent (or unreadable: the write itself will say why)
    for test, kind in _KINDS:
        if test(mode):
            raise NotARegularFile(
                f"{path} is {kind}, not a regular file: numdev writes its outputs by renaming a finished file over "
                "the target, which would replace it; give the path of a regular file (or a new one)"
            )


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    write_buffers(path, [data])


def write_npz(path: str | os.PathLike, arrays: dict) -> int:
    """NumPy arrays as one compressed .npz, written atomically; its size in bytes."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    write_bytes(path, buffer.getvalue())
    return buffer.getbuffer().nbytes


def write_buffers(path: str | os.PathLike, buffers) -> None:
    """Write the buffers (bytes, or NumPy arrays: anything with the buffer protocol) one after
    another as one file, atomically, without joining them in memory first."""
    path = Path(path)
    check_regular_target(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, file_mode())  # mkstemp's 0600 would keep others on a shared machine (or a web server) out
        with os.fdopen(fd, "wb") as handle:
            for data in buffers:
                handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError) and not isinstance(error, WriteError):
            raise WriteError(path, error) from error
        raise


def write_together(files: dict) -> None:
    """Write several files as one output: all of them, or none.

    `files`: {target path: bytes, or the path of a finished file to copy}. Every target is checked
    first (a directory, FIFO or device where a file should go, a parent that is a file: refused before
    anything is written); then each is staged as a fsynced temporary file beside its target; only when
    every one is staged are they renamed over their targets. A failure while staging (a full disk)
    removes every temporary file and changes nothing; files an earlier run left under the same names
    are replaced together, never some of them."""
    targets = [Path(target) for target in files]
    for target in targets:
        check_regular_target(target)
    staged: list[tuple[str, Path]] = []
    current = None
    try:
        for target, data in zip(targets, files.values()):
            current = target
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            staged.append((tmp, target))
            os.fchmod(fd, file_mode())
            with os.fdopen(fd, "wb") as handle:
                if isinstance(data, (bytes, bytearray, memoryview)):
                    handle.write(data)
                else:
                    with open(data, "rb") as source:
                        for chunk in iter(lambda: source.read(1 << 22), b""):
                            handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
        for tmp, target in staged:
            current = target
            os.replace(tmp, target)
    except BaseException as error:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError) and not isinstance(error, WriteError) and current is not None:
            raise WriteError(current, error) from error
        raise


def file_mode() -> int:
    """The mode a plain open() would give a new file: 0666 less the process umask (0644 under the usual 022).
    The umask is read from /proc (setting it to read it back would race with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            umask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):  # not Linux
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


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
    """Append records as JSON lines with one O_APPEND write under an exclusive flock: any number of
    processes may append to the same file at once and every record arrives whole (the lock makes
    the torn-line check and the rollback below safe; the kernel drops it if a holder is killed).

    A file that does not end with a newline (a torn line) is refused. If the write or its fsync
    fails (disk full), the bytes this call added are cut off again and a WriteError names the file.
    """
    path = Path(path)
    data = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in records).encode("utf-8")
    if not data:
        return
    check_regular_target(path)  # opening a FIFO for append would block
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)  # less the umask
    except OSError as error:
        raise WriteError(path, error) from error
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by os.close below
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            raise ValueError(f"{path} does not end with a newline: it was truncated; move it aside and rerun")
        written = 0
        try:
            written = os.write(fd, data)
            end = os.lseek(fd, 0, os.SEEK_CUR)
            if written != len(data):
                raise OSError(errno.ENOSPC, "No space left on device (short write)")
            os.fsync(fd)
        except OSError as error:
            if written:  # take back what this call added (the lock keeps others from appending after it)
                os.ftruncate(fd, end - written)
            raise WriteError(path, error) from error
    finally:
        os.close(fd)


RECORD_LIMIT = 64 << 20  # a JSON or YAML record numdev writes is kB
TABLE_LIMIT = 1 << 30  # results.jsonl, the sibling CSVs: MB even for large sweeps and runs


def read_bounded(path: str | os.PathLike, limit: int = RECORD_LIMIT, what: str = "record") -> bytes:
    """A file's bytes, read only once its size is known to be at most `limit`: a file extended (a sparse
    100 GB `truncate`) or replaced by something else is one ValueError naming it, not a MemoryError."""
    path = Path(path)
    size = path.stat().st_size
    if size > limit:
        raise ValueError(f"{path}: {size} bytes, far more than a {what} holds (at most {limit >> 20} MiB): the file is "
                         "corrupt, extended or not numdev's; restore it from a copy (nothing was read)")
    with open(path, "rb") as handle:
        return handle.read(limit + 1)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Records (JSON objects) of a JSON-lines file; a corrupt, torn, blank or non-object line is a
    ValueError naming the file and line. Every record ends with a newline, so a last line without
    one was torn; numdev never writes a blank line, so one means a record was blanked or removed."""
    return [record for _, record in read_jsonl_numbered(path)]


def read_jsonl_numbered(path: str | os.PathLike) -> list[tuple[int, dict]]:
    """(line number, record) of every record of a JSON-lines file, checked as read_jsonl says."""
    try:
        text = read_bounded(path, TABLE_LIMIT, "JSON-lines file of records").decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text (byte {error.start}): the file is corrupt") from None
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if number == len(lines) and not line:  # after the last newline
            continue
        if not line.strip():
            raise ValueError(f"{path}, line {number}: blank line where a record should be: a record was blanked or the "
                             "file was edited; remove the line (or rerun the job in a new directory)")
        if number == len(lines):
            raise ValueError(f"{path}, line {number}: incomplete record (no newline at the end): the file was truncated")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg}); the file is corrupt") from None
        except RecursionError:
            raise ValueError(f"{path}, line {number}: not valid JSON (nested too deeply); the file is corrupt") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}, line {number}: a {type(record).__name__}, not a JSON object; the file is corrupt")
        records.append((number, record))
    return records


def read_json(path: str | os.PathLike, what: str = "file"):
    """A JSON file's content; unreadable or invalid JSON is a ValueError naming the file."""
    path = Path(path)
    try:
        return json.loads(read_bounded(path, what=what).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        reason = error.msg if isinstance(error, json.JSONDecodeError) else "not UTF-8"
        raise ValueError(f"{path}: not valid JSON ({reason}): the {what} is corrupt or truncated") from None
