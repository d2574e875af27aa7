"""Turning a user's mistake into one line on stderr instead of a traceback."""

from __future__ import annotations

import functools
import logging
import re
import sys

from hydra.errors import InstantiationException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, MissingMandatoryValue

from numdev.runs.atomic import WriteError


class UserError(Exception):
    """An error whose message tells the user what to change (a backend that is not installed, say):
    one line and exit 2, like ValueError. Packages below the command line subclass it."""


USER_ERRORS = (ValueError, FileNotFoundError, UserError, WriteError)


class RunFailed(Exception):
    """A run started and did not finish (non-finite values, a signal): one line, and its exit code
    (1, or 128 + the signal's number as a shell reports a process ended by that signal)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class Hangup(BaseException):
    """SIGHUP (the terminal or the SSH session went away) while numdev-train runs: ends the run like
    SIGTERM and SIGINT do, run.json final ("failed", resumable with resume=auto)."""


def user_facing(program: str, unexpected_key=None):
    """Decorate a Hydra task function: user errors print `program: error: ...` and exit 2.
    `unexpected_key(node, name)`: the message for a key added with +node.name=... that the chosen
    option's constructor does not take (numdev.config.groups.unexpected_key)."""

    def decorate(task):
        @functools.wraps(task)
        def wrapper(*args, **kwargs):
            try:
                return task(*args, **kwargs)
            except InstantiationException as error:
                cause = error.__cause__ or error
                if isinstance(cause, ImportError) or "Error locating target" in str(error):
                    found = re.search(r"full_key: (\S+)", str(error))
                    target = re.search(r"Error locating target '([^']+)'", str(error))
                    key = found.group(1) if found else "the config"
                    root = cause
                    while root.__cause__ is not None:  # Hydra's "Error loading ..." wraps the ImportError that says why
                        root = root.__cause__
                    _exit(program, f"{key}._target_={target.group(1) if target else '?'} cannot be imported ({_first_line(root)}): "
                                   "install its package or put it on PYTHONPATH, or fix the name")
                if isinstance(cause, MissingMandatoryValue):
                    _exit(program, _unset(cause))
                if _out_of_memory(cause):
                    found = re.search(r"full_key: (\S+)", str(error))
                    key = found.group(1) if found else "the config"
                    _exit(program, f"{key}: out of memory while building it ({_first_line(cause)}): lower its size", 1)
                if isinstance(cause, TypeError):  # a config value of the wrong type reached a constructor
                    found = re.search(r"full_key: (\S+)", str(error))
                    key = found.group(1) if found else "the config"
                    extra = re.search(r"unexpected keyword argument '(\w+)'", str(cause))
                    if extra and unexpected_key is not None:  # a key added with +key=... that the chosen option does not take
                        _exit(program, unexpected_key(key, extra.group(1)))
                    _exit(program, f"{key}: {cause}: a value under {key} has the wrong type")
                if not isinstance(cause, USER_ERRORS):
                    raise
                _exit(program, cause)
            except MissingMandatoryValue as error:  # a ??? left in an option file (model=custom's model._target_)
                _exit(program, _unset(error))
            except (ConfigAttributeError, ConfigKeyError) as error:  # a key the run reads is not in its config
                _exit(program, missing_key(program, error, sys.argv[1:]))
            except USER_ERRORS as error:
                _exit(program, error)
            except RunFailed as error:
                _exit(program, error, error.exit_code)
            except (MemoryError, RuntimeError) as error:
                if not _out_of_memory(error):
                    raise
                _exit(program, f"out of memory ({_first_line(error)}): lower data.batch_size, the model's size or the shape", 1)
            except Hangup:
                _exit(program, "interrupted by SIGHUP before training started; nothing was trained", 129)

        return wrapper

    return decorate


def missing_key(program: str, error: ConfigAttributeError | ConfigKeyError, args: list[str]) -> str:
    """A key the run reads that its config lacks, as one line (a `~key` on the command line is the usual cause)."""
    deleted = " ".join(a for a in args if a.startswith("~"))
    return (f"the config has no {error.full_key or error.key}, which {program} reads"
            f"{f' ({deleted} deleted it?)' if deleted else ''}: put it back or set it ({program} --cfg job shows every key)")


def _unset(error: MissingMandatoryValue) -> str:
    """A ??? left in an option file, as one line naming the key to give."""
    key = error.full_key or "a value"
    return f"{key} is not set (??? in its option file): give it, e.g. {key}=... on the command line (model=custom: docs/workloads.md#custom)"


def _out_of_memory(error: BaseException) -> bool:
    import torch

    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("can't allocate memory" in text or "DefaultCPUAllocator" in text
                                                or "out of memory" in text.lower())


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


PROBE = ".numdev-write-probe"
PROBE_BYTES = 64 * 1024
NO_OUTPUT = {"--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc"}


def output_dir_problem(args: list[str]) -> str | None:
    """Hydra creates the run (or sweep) directory and writes .hydra/ and its log before numdev runs:
    on a read-only or full disk that ends in Hydra's tracebacks. So the directory the run will land
    in (hydra.run.dir / hydra.sweep.dir / output_root as given, up to its first interpolation) is
    probed first: its nearest existing ancestor must take a small file written and fsynced."""
    from pathlib import Path

    from numdev.runs.atomic import WriteError, write_bytes

    if NO_OUTPUT & set(args):
        return None
    values = dict(a.lstrip("+").split("=", 1) for a in args if "=" in a and not a.startswith("-"))
    key = "hydra.sweep.dir" if {"-m", "--multirun"} & set(args) else "hydra.run.dir"
    target = values.get(key, values.get("output_root", "outputs"))
    static = target.split("${", 1)[0]
    if not static.strip():
        static = "."
    path = Path(static).expanduser()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        return f"{key}: {path} is not a directory, so the run's outputs cannot be written under it: choose another directory ({key}=...)"
    probe = path / PROBE
    try:
        write_bytes(probe, bytes(PROBE_BYTES))  # about what Hydra writes before numdev runs (.hydra/, the log)
    except WriteError as error:
        return (f"cannot write the run's outputs under {path} ({error.strerror}): free some space or fix the permissions, "
                f"or choose another directory ({key}=... or output_root=...)")
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
    return None


def fail(program: str, error: BaseException | str, code: int = 2):
    """Print `program: error: <error>` (one line) on stderr and exit `code` (2: a usage error)."""
    _exit(program, error, code)


def interrupted(program: str):
    """Ctrl-C (SIGINT) during a command that reads runs and writes results: one line and exit 130, no
    traceback (each file numdev writes is written whole or not at all: numdev.runs.atomic)."""
    _exit(program, "interrupted (SIGINT): each file is written whole or not at all, so none is half-written; "
          "run the same command again to write them all", 130)


def one_line(error: BaseException | str) -> str:
    """An error's message on one line. An error re-raised from a DataLoader worker carries the
    worker's whole traceback in its text ("Caught ValueError in DataLoader worker process 0.
    Original Traceback ..."): only the original message, its last line, is kept."""
    text = str(error)
    if "Original Traceback" in text:
        last = next((line for line in reversed(text.splitlines()) if line.strip()), text)
        text = re.sub(r"^[\w.]+(Error|Exception): ", "", last.strip())
    return " ".join(text.split("\n")).strip()


def never_ran(records: list[dict], key: str) -> list[str]:
    """A measuring script's records ({key: a kernel or method, "error": ... where it failed}): one line
    for each `key` whose every record failed, naming how many and the first error. A script that finds
    any exits 1 after writing its report: a kernel that never ran is a failed measurement, not an empty
    row. A record with neither a result nor an error ("skipped") counts as neither."""
    tried: dict[str, list[dict]] = {}
    for record in records:
        if "skipped" not in record:
            tried.setdefault(record[key], []).append(record)
    return [f"{name} failed in all {len(rows)} of its runs (the first: {one_line(rows[0]['error'])})"
            for name, rows in tried.items() if all("error" in r for r in rows)]


_EXISTING_RUN_DIRS: set[str] = set()  # hydra.run.dir given on the command line that existed before: never removed
HYDRA_FILES = {"config.yaml", "hydra.yaml", "overrides.yaml"}


def note_existing_run_dir(args: list[str]) -> None:
    """Remember the hydra.run.dir given on the command line when it exists already: a refused run never removes it."""
    import os

    for arg in args:
        if arg.startswith("hydra.run.dir=") and os.path.isdir(arg.split("=", 1)[1]):
            _EXISTING_RUN_DIRS.add(os.path.realpath(arg.split("=", 1)[1]))


def remove_refused_run_dir() -> None:
    """A single run refused before it started: Hydra created its run directory (with .hydra/ and the
    log) before numdev saw the config; remove it when it holds nothing else and did not exist before,
    so a refused command leaves no empty run behind. Sweeps are checked before Hydra starts (numdev.config.preflight)."""
    import os
    import shutil

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from numdev.runs.lock import LOCK

    if not HydraConfig.initialized():
        return
    config = HydraConfig.get()
    if config.mode != RunMode.RUN:
        return
    run_dir = config.runtime.output_dir
    if not run_dir or not os.path.isdir(run_dir) or os.path.realpath(run_dir) in _EXISTING_RUN_DIRS:
        return
    entries = set(os.listdir(run_dir))
    hydra_dir = os.path.join(run_dir, config.output_subdir or ".hydra")
    only_hydra = all(e.endswith(".log") or e == LOCK or os.path.join(run_dir, e) == hydra_dir for e in entries)
    if only_hydra and (not os.path.isdir(hydra_dir) or set(os.listdir(hydra_dir)) <= HYDRA_FILES):
        shutil.rmtree(run_dir, ignore_errors=True)


def console_line(program: str, text: str) -> None:
    """One line on stderr, `program: text`: how a command tells its user what it did or what was wrong."""
    print(f"{program}: {text}", file=sys.stderr)


def _exit(program: str, error: BaseException | str, code: int = 2):
    message = one_line(error)  # one line, whatever the exception's text
    if code == 2:
        remove_refused_run_dir()
    console_line(program, f"error: {message}")
    if logging.getLogger().hasHandlers():  # the job's log (app.log) ends with it too; the console has it already
        logging.getLogger("numdev.cli.errors").error("%s: error: %s", program, message, extra={"console": False})
    sys.exit(code)
