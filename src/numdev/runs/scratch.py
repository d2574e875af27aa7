"""Scratch folders that outlive a process killed outright (SIGKILL, the OOM killer) no longer.

Python's TemporaryDirectory removes its folder when the block ends, a signal included - but not
when the process is killed outright, and a Triton cache or a fresh clone is megabytes to
gigabytes. A `scratch` folder is named <prefix><owner's pid>_<random>, and the next process of the
same kind first removes the folders whose owner is gone (`remove_stale`). A folder whose owner is
alive - another run of the same script at the same time - is left alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale(root: str | os.PathLike, prefix: str) -> list[str]:
    """Remove the folders <root>/<prefix><pid>[_...] whose process <pid> is gone; the folders removed.
    Anything else under the prefix (no pid, a file, a symbolic link) is left as it is."""
    removed = []
    for folder in sorted(Path(root).glob(f"{prefix}*")):
        pid = folder.name.removeprefix(prefix).split("_", 1)[0]
        if not pid.isdigit() or folder.is_symlink() or not folder.is_dir() or _owner_alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    return removed


@contextlib.contextmanager
def scratch(prefix: str, root: str | os.PathLike | None = None):
    """A new folder <root>/<prefix><pid>_<random> (root: the system's temporary directory), removed
    when the block ends however it ends; stale folders of the same prefix are removed first."""
    root = Path(root) if root is not None else Path(tempfile.gettempdir())
    remove_stale(root, prefix)
    folder = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}_", dir=root)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
