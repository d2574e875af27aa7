"""One live process per run directory: an exclusive flock on <run_dir>/.lock.

The kernel releases a flock when its process ends, however it ends (SIGKILL, OOM killer, power
loss of the holder), so a killed run never leaves a stale lock behind: the lock file itself may
remain and means nothing while no process holds it. flock works on local file systems; on NFS it
is emulated with POSIX locks by Linux (since 2.6.12), which lockd also releases when the holder dies.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

LOCK = ".lock"
ACQUIRE_TRIES = 20  # x 50 ms: a probe (is_held) holding the lock for a moment is not another run


class RunDirectoryInUse(ValueError):
    """Another live process holds the run directory."""


class RunLock:
    """`with RunLock(run_dir):` - refuses (RunDirectoryInUse) if another process holds run_dir."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            for attempt in range(ACQUIRE_TRIES):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if attempt == ACQUIRE_TRIES - 1:
                        raise
                    time.sleep(0.05)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise RunDirectoryInUse(
                f"{self.path.parent} is in use by another live run (process {holder}): wait for it to end, "
                "or give this run its own directory (hydra.run.dir=...)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def is_held(run_dir: str | os.PathLike) -> bool:
    """Whether a live process holds run_dir's lock (a run is training there). No lock file: False.
    Probes by taking the lock for a moment (RunLock.acquire retries meanwhile)."""
    try:
        fd = os.open(Path(run_dir) / LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's lock, if it got it
    return False
