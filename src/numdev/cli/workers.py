"""Nothing numdev starts outlives the command.

numdev's own launcher (hydra/launcher=parallel, numdev.cli.launcher) shuts its process pools down and joins
their workers before the sweep returns. Hydra's joblib plugin, if a user picks it (its own config,
hydra/launcher=joblib), leaves joblib's reusable loky pool alive after the sweep (for 300 s of
idleness, so that a next Parallel call starts faster; a sweep has no next call): the console entry
points call `stop_worker_pools()` when Hydra is done, which shuts it down through its public
`shutdown(wait=True)` and so joins its workers. The resource tracker the pool started exits by itself
when this process ends (its pipe closes); stopping it through loky's private API instead made every
sweep end with loky's "leaked folder" warning and a KeyError traceback.

A process numdev starts that must not outlive its parent however the parent dies (SIGKILL, the OOM
killer, a machine's time limit) asks the kernel for a signal at that moment: `die_with_parent`, the one
home of Linux's PR_SET_PDEATHSIG (the launcher's workers, gpu_kernels.py's comparison workers, the GPU
call's steps, the commands the tests start).
"""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h
try:  # resolved here, not after a fork: die_with_parent runs as a subprocess preexec_fn
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:
    _LIBC = None


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies, however it dies (Linux's
    prctl PR_SET_PDEATHSIG). Safe as a subprocess preexec_fn: nothing is imported or loaded after the
    fork. False where there is no prctl (not Linux): the caller's own check of its parent is then all
    there is. A parent that died before this call is not caught by it: check os.getppid() after."""
    if _LIBC is None:
        return False
    return _LIBC.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def stop_worker_pools() -> None:
    """Shut down loky's reusable executor if this process started one (never starts one)."""
    reusable = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(reusable, "_executor", None) if reusable is not None else None
    if executor is not None:
        executor.shutdown(wait=True)


def console_script(app) -> None:
    """An app's console entry point: -v / --verbose read (the libraries' messages and numdev's progress
    lines on the console too: verbose=true), the Hydra app `app` run (one run, or a -m sweep), then
    no worker process left behind. Ctrl-C before the run takes over its signals is one line, exit 130."""
    import os

    from numdev.cli import logs
    from numdev.cli.errors import interrupted

    sys.argv = logs.verbosity_from_argv(sys.argv)
    logs.quiet_libraries()
    try:
        app()
    except KeyboardInterrupt:  # Ctrl-C while Hydra composes, prints --help or checks (a run handles its own): one line, 130
        interrupted(os.path.basename(sys.argv[0]) or "numdev")
    finally:
        stop_worker_pools()
