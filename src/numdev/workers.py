"""Nothing numdev starts outlives the command: the process pool a `-m` sweep under
hydra/launcher=joblib leaves behind is shut down before the command returns.

joblib's loky backend keeps a reusable pool of worker processes alive after a Parallel call
(for 300 s of idleness, so a next call starts faster), and each worker may have started
this process a resource tracker (multiprocessing's, loky's); a sweep has no next call. The console
entry points call `stop_worker_pools()` when Hydra is done: it shuts the pool down, stops the
trackers, and waits (up to `timeout` s) until every process descended from this one has exited.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def stop_worker_pools(timeout: float = 30.0) -> None:
    """Shut down loky's reusable executor if this process started one (never starts one)."""
    reusable = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(reusable, "_executor", None) if reusable is not None else None
    if executor is None:
        return
    started = _descendants(os.getpid())
    executor.shutdown(wait=True, kill_workers=False)
    for name in ("joblib.externals.loky.backend.resource_tracker", "multiprocessing.resource_tracker"):
        tracker = getattr(sys.modules.get(name), "_resource_tracker", None)
        if getattr(tracker, "_pid", None) is not None:
            tracker._stop()  # closes its pipe and waits for it: it would otherwise exit a moment after us
    deadline = time.monotonic() + timeout
    while started and time.monotonic() < deadline:
        started = {pid for pid in started if _alive(pid)}
        time.sleep(0.05)


def _descendants(root: int) -> set[int]:
    """Process ids below `root` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
        return state[state.rindex(")") + 2] != "Z"  # a zombie has exited (its parent reaps it)
    except (OSError, ValueError, IndexError):
        return False
