"""hydra/launcher=parallel: a sweep's jobs on this machine, n_jobs at a time, each in a worker process,
with a lifecycle that leaves nothing behind and every run's record final.

- Each of the n_jobs slots has its own one-worker process pool (loky, as joblib uses): a worker that dies
  (SIGKILL, the OOM killer) breaks its own slot only, so the others are not killed with it (loky kills
  every worker of a broken pool) but stopped cleanly, as below. Its job is named in one line.
- SIGINT (Ctrl-C), SIGTERM and SIGHUP to the command stop the sweep: no new job starts and every
  running job is sent SIGTERM (again every second until it ends), which a training run answers by
  writing its run.json ("failed", resumable with resume=auto) and a bench run by keeping its records.
  The workers themselves ignore these signals outside a job's own handlers, so a Ctrl-C that reaches
  the whole process group is answered once, by the job's own handler, not twice.
- A job that fails (or whose worker is killed) stops the sweep the same way: no new job starts and the
  running ones are asked to stop (they are resumable; a study cannot be analysed without every role).
- A sweep's process killed outright (SIGKILL, the OOM killer) takes its workers with it: each worker's
  initializer asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG) and starts a thread that
  checks its parent every second; with the workers gone, loky's resource trackers exit too.
- When the sweep ends, every worker has exited (the pools are shut down and joined) and every run.json
  under the sweep still "running" whose run lock is free (its process died without a word) is made
  final ("failed", numdev.runs.record.close_abandoned).
- The command then exits non-zero with one line saying what happened and how to continue
  (hydra.sweep.dir=<the sweep> and, for training, resume=auto).

The Hydra plugin class (hydra_plugins.numdev_launcher) only holds the configuration; this module does the work.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides, run_job, setup_globals
from omegaconf import DictConfig, open_dict

from numdev.cli.workers import die_with_parent

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FORWARD_EVERY_S = 1.0
WATCHDOG_S = 1.0


# -- in the worker process --------------------------------------------------------------------------------


def _worker_start(parent: int) -> None:
    """The worker's initializer: it dies with the sweep's process (_die_with_parent), and leaves the
    stop signals to it (_ignore_stop_signals)."""
    _die_with_parent(parent)
    _ignore_stop_signals()


def _die_with_parent(parent: int) -> None:
    """A worker outlives a sweep's process killed outright (SIGKILL, the OOM killer): nothing is left to
    read its result, and it would train on for hours, deaf to the SIGTERM a user sends the sweep. So on
    Linux the kernel sends it SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG), and everywhere a
    daemon thread checks every WATCHDOG_S that its parent is still `parent`, else kills it. A parent
    that died before this ran is caught by the same check at once. The run it was training stays
    "running" with its lock free: resume=auto continues it, and the next sweep end closes it."""
    die_with_parent(signal.SIGKILL)  # not Linux: the thread below alone

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(WATCHDOG_S)

    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, name="numdev-parent-watchdog", daemon=True).start()


def _ignore_stop_signals() -> None:
    """The parent decides when a job stops (it forwards SIGTERM), and a
    job's own code installs its handlers while it runs (Lightning's for SIGTERM, numdev's for SIGHUP,
    the bench's), restoring these afterwards: a signal to the whole process group (a terminal's
    Ctrl-C or hangup) reaches an idle worker without killing it, and a job's cleanup is not cut
    short by the parent's SIGTERM once its own handler is gone.

    A Python function that does nothing, not SIG_IGN: Lightning keeps a SIGTERM handler it finds
    beside its own and calls it, reading SIG_IGN (the integer 1) as a signal number, i.e. it would
    call the SIGHUP handler (numdev's, which ends the run as a hangup)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _left_to_the_parent)


def _left_to_the_parent(signum, frame) -> None:
    """A stop signal to an idle worker: nothing to do, the launcher decides."""


def _execute_job(idx: int, overrides: Sequence[str], hydra_context, config: DictConfig, task_function,
                 singleton_state: dict[Any, Any]) -> tuple[str, Any]:
    """One job, as Hydra's launchers run it; ("exit", code) when the task ended with sys.exit
    (numdev's one-line errors), ("done", JobReturn) otherwise."""
    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    try:
        sys.stdout.flush()
        ret = run_job(hydra_context=hydra_context, config=sweep_config, task_function=task_function,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        try:
            _ = ret.return_value  # an exception the task raised (not a numdev one-line error: a bug) is raised here
        except Exception:
            log.exception("job #%d failed", idx)  # its traceback: on the console and in the job's app.log
        return "done", ret
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
        return "exit", code
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


# -- in the command's process -----------------------------------------------------------------------------


class _Stop:
    """While the sweep runs: SIGINT, SIGTERM and SIGHUP are recorded (the first one wins), not raised."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> _Stop:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
            log.warning("%s: stopping the sweep (the running jobs are asked to stop and record where they are)",
                        signal.Signals(signum).name)


def _children(pid: int) -> list[int]:
    """The direct children of `pid` (Linux /proc; none elsewhere): the slots' workers and loky's
    resource tracker (which ignores SIGTERM)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _tell_workers_to_stop() -> None:
    for pid in _children(os.getpid()):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def launch(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    from joblib.externals.loky import ProcessPoolExecutor
    from joblib.externals.loky.process_executor import BrokenProcessPool

    config = launcher.config
    setup_globals()
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    n_jobs = launcher.n_jobs if launcher.n_jobs and launcher.n_jobs > 0 else (os.cpu_count() or 1)
    n_jobs = min(n_jobs, len(job_overrides)) or 1
    log.info("%d job(s), %d at a time -> %s", len(job_overrides), n_jobs, sweep_dir)
    started, job_seconds = time.monotonic(), []  # the progress line after each job (progress_line)
    for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        log.debug("  #%d: %s", idx, " ".join(filter_overrides(overrides)))
    singleton_state = Singleton.get_state()
    todo = list(enumerate(job_overrides, start=initial_job_idx))
    todo.reverse()
    pools: list = [None] * n_jobs
    running: dict = {}  # future -> (slot, idx, overrides)
    results: dict[int, JobReturn] = {}
    failure: tuple[str, int] | None = None  # (one line, exit code) of the first job that failed
    with _Stop() as stop:
        try:
            while todo or running:
                busy = {slot for slot, _, _, _ in running.values()}
                for slot in range(n_jobs):
                    if not todo or stop.signum is not None or failure is not None:
                        break
                    if slot in busy:
                        continue
                    if pools[slot] is None:
                        pools[slot] = ProcessPoolExecutor(max_workers=1, initializer=_worker_start, initargs=(os.getpid(),))
                    idx, overrides = todo.pop()
                    future = pools[slot].submit(_execute_job, idx, overrides, launcher.hydra_context, config,
                                                launcher.task_function, singleton_state)
                    running[future] = (slot, idx, overrides, time.monotonic())
                if not running:
                    break
                done, _ = wait(list(running), timeout=FORWARD_EVERY_S, return_when=FIRST_COMPLETED)
                if stop.signum is not None or failure is not None:
                    _tell_workers_to_stop()  # again every second: a job between its handlers ignores it
                for future in done:
                    slot, idx, overrides, since = running.pop(future)
                    name = f"job #{idx} ({' '.join(filter_overrides(overrides))})"
                    try:
                        kind, value = future.result()
                    except BrokenProcessPool as error:  # its worker died (TerminatedWorkerError)
                        pools[slot].shutdown(wait=True)
                        pools[slot] = None
                        codes = re.search(r"exit codes of the workers are \{(.*?)\}", str(error))
                        how = f"killed ({codes.group(1)})" if codes else "ended without a result"
                        failure = failure or (
                            f"{name}: its worker process was {how}, e.g. by the out-of-memory killer or `kill -9`", 1)
                        log.info("%s: its worker process was %s; stopping the sweep", name, how)
                        continue
                    except Exception as error:  # its result could not come back (e.g. not picklable)
                        failure = failure or (f"{name}: no result came back ({type(error).__name__}: {error})", 1)
                        continue
                    if kind == "exit":
                        if value not in (0, None) and failure is None:
                            failure = (f"{name} failed (exit {value}; its error is above)", value)
                        results[idx] = _exited(value)
                    else:
                        results[idx] = value
                        if value.status.name == "FAILED" and failure is None:
                            try:
                                _ = value.return_value
                            except Exception as error:
                                failure = (f"{name} failed ({type(error).__name__}: {error}; its traceback is above and "
                                           "in its app.log)", 1)
                    job_seconds.append(time.monotonic() - since)
                    if failure is None and stop.signum is None:
                        log.info(progress_line(len(results), len(job_overrides), time.monotonic() - started, n_jobs, job_seconds))
        finally:
            for pool in pools:
                if pool is not None:
                    pool.shutdown(wait=True)
        signum = stop.signum
    closed = _close_abandoned_runs(sweep_dir)
    not_run = len(todo)
    if signum is not None or failure is not None:
        app = config.get("app")
        rerun = f"rerun the same command with hydra.sweep.dir={sweep_dir}" + (" resume=auto" if app == "train" else "")
        extra = []
        if closed:
            extra.append(f"{closed} run.json made final (\"failed\")")
        if not_run:
            extra.append(f"{not_run} job(s) not started")
        extra = f" ({', '.join(extra)})" if extra else ""
        what = (f"the sweep was stopped by {signal.Signals(signum).name}{extra}" if signum is not None
                else f"{failure[0]}; the sweep stopped{extra}")
        text = f"{what}; to continue, {rerun}"
        from numdev.cli.errors import fail

        fail(f"numdev-{app}", text, 128 + signum if signum is not None else failure[1])
    return [results[i] for i in sorted(results)]


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


def progress_line(done: int, total: int, elapsed: float, n_jobs: int, job_seconds: list[float]) -> str:
    """After each job: how many are done, the time since the sweep started and an estimate of the time
    left (the jobs not done x the mean time of those done, shared by the jobs that run at once)."""
    line = f"[{done}/{total} jobs done, {_clock(elapsed)} elapsed"
    left = total - done
    if left and job_seconds:
        line += f", about {_clock(left * (sum(job_seconds) / len(job_seconds)) / max(1, min(n_jobs, left)))} left"
    return line + "]"


def _exited(code) -> JobReturn:
    from hydra.core.utils import JobStatus

    ret = JobReturn()
    ret.status = JobStatus.COMPLETED if code in (0, None) else JobStatus.FAILED
    ret._return_value = None if code in (0, None) else SystemExit(code)
    return ret


def _close_abandoned_runs(sweep_dir: Path) -> int:
    """Every run.json under the sweep still "running" whose lock no process holds: made final."""
    from numdev.runs.record import close_abandoned

    closed = 0
    for path in sorted(sweep_dir.glob("**/run.json")):
        if close_abandoned(path.parent, "its process ended without recording it (killed, or its sweep was stopped)"):
            log.info("%s: the run's process ended without a word: run.json now says failed", path.parent)
            closed += 1
    return closed
