"""Scratch folders that outlive a process killed outright (SIGKILL, the OOM killer) no longer.

Python's TemporaryDirectory removes its folder when the block ends, a signal included - but not
when the process is killed outright, and a Triton cache or a fresh clone is megabytes to
gigabytes. A `scratch` folder is named <prefix><owner's pid>_s<its start time>_<random>, and the next process
of the same kind first removes the folders whose owner is gone (`remove_stale`). A folder whose owner is
alive - another run of the same script at the same time - is left alone; a pid that is alive but
started at another time is a new process that reused the owner's pid, so its folder goes too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def _start_time(pid: int) -> str | None:
    """When process `pid` started, in clock ticks since boot (/proc/<pid>/stat's 22nd field); None where it cannot
    be read (no /proc, the process gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command's name, which may hold spaces and parentheses
    return fields[19] if len(fields) > 19 and fields[19].isdigit() else None


def _owner_alive(pid: int, started: str | None) -> bool:
    """Whether the folder's owner still runs: its pid is alive and, where the folder names the owner's start time,
    that pid is the same process (a pid reused by another process after the owner was killed is not the owner)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    now = _start_time(pid) if started is not None else None
    return now is None or now == started


def _owner(name: str) -> tuple[int, str | None] | None:
    """<pid>_s<start>_<random> (or <pid>_<random>, before start times were named) -> (pid, start); None: no pid."""
    pid, _, rest = name.partition("_")
    if not pid.isdigit():
        return None
    start = rest[1:].split("_", 1)[0] if rest.startswith("s") and "_" in rest else ""
    return int(pid), (start if start.isdigit() else None)


def remove_stale(root: str | os.PathLike, prefix: str) -> list[str]:
    """Remove the folders <root>/<prefix><pid>[_s<start>]_... whose owner is gone; the folders removed.
    Anything else under the prefix (no pid, a file, a symbolic link) is left as it is."""
    removed = []
    for folder in sorted(Path(root).glob(f"{prefix}*")):
        owner = _owner(folder.name.removeprefix(prefix))
        if owner is None or folder.is_symlink() or not folder.is_dir() or _owner_alive(*owner):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    return removed


@contextlib.contextmanager
def scratch(prefix: str, root: str | os.PathLike | None = None):
    """A new folder <root>/<prefix><pid>_s<start>_<random> (root: the system's temporary directory), removed
    when the block ends however it ends; stale folders of the same prefix are removed first."""
    root = Path(root) if root is not None else Path(tempfile.gettempdir())
    remove_stale(root, prefix)
    started = _start_time(os.getpid())
    folder = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}_{'s' + started + '_' if started else ''}", dir=root)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
