"""Quiet by default, everything in the log.

numdev's messages go through `logging` (loggers named numdev.*). Hydra configures the handlers from
conf/hydra/job_logging/numdev.yaml (each job: its app.log in the run directory, with everything at
INFO and numdev's DEBUG lines) and conf/hydra/hydra_logging/numdev.yaml (the sweep's own process):

- the console shows numdev's messages (INFO and up, plain text: stdout, warnings and errors on stderr)
  and only the warnings and errors of the libraries;
- `-v` (or verbose=true) shows everything on the console as well: the libraries' INFO lines (Lightning's
  "GPU available", its hints) and numdev's DEBUG lines (per-run progress of the study's analysis).

Library noise is fixed where it starts (`quiet_libraries`): Lightning's own console handler (added
when it is imported before logging is configured) is removed so its INFO lines reach the job's log
instead of the console; two warnings that say nothing about a numdev run are filtered (Lightning's
"`srun` command is available ... but is not used" on any machine with SLURM's client tools, and its
`LeafSpec` deprecation, which is Lightning's own call into torch); every other warning goes through
logging (py.warnings), so it is shown and kept in the log.
"""

from __future__ import annotations

import logging
import sys
import warnings

VERBOSE = False  # set by setup() (verbose=true) and by the console scripts' -v
VERBOSE_FLAGS = ("-v", "--verbose")


class Console(logging.Filter):
    """What the console shows: numdev's INFO and up, the rest's WARNING and up; everything when verbose."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "console", True) is False:  # already printed (numdev.cli.errors' one-line errors)
            return False
        if VERBOSE:
            return True
        if record.name in ("numdev", "__main__") or record.name.startswith("numdev."):  # __main__: python -m numdev.<tool>
            return record.levelno >= logging.INFO
        return record.levelno >= logging.WARNING


class BelowWarning(logging.Filter):
    """The stdout handler's share: information; warnings and errors go to the stderr handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING


class NoCudaNotice(logging.Filter):
    """torch.compile on a CPU-only machine: torch.utils.cpp_extension warns that no CUDA runtime is
    found (it looks for one to build with), which says nothing about a CPU run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No CUDA runtime is found")


def quiet_libraries() -> None:
    cpp_extension = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, NoCudaNotice) for f in cpp_extension.filters):
        cpp_extension.addFilter(NoCudaNotice())
    for name in ("lightning.pytorch", "lightning.fabric", "lightning", "pytorch_lightning", "mlflow", "alembic"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    logging.captureWarnings(True)  # the other warnings: shown, and kept in the job's log


def setup(verbose: bool | None = False) -> None:
    """At the start of a task (every job of a sweep): verbosity from the config, libraries quieted."""
    global VERBOSE
    VERBOSE = VERBOSE or bool(verbose)
    logging.getLogger("numdev").setLevel(logging.DEBUG)  # numdev's DEBUG lines reach the job's log
    quiet_libraries()


def verbosity_from_argv(argv: list[str]) -> list[str]:
    """A console script's -v / --verbose: `verbose=true` for Hydra (the jobs), VERBOSE for this process."""
    global VERBOSE
    if not any(arg in VERBOSE_FLAGS for arg in argv):
        VERBOSE = VERBOSE or "verbose=true" in argv
        return argv
    VERBOSE = True
    return [arg for arg in argv if arg not in VERBOSE_FLAGS] + ["verbose=true"]


def console(verbose: bool = False) -> None:
    """The argparse commands (numdev-study, numdev-compare, ...): numdev's messages on the console,
    as plain lines, through the same filter."""
    global VERBOSE
    VERBOSE = VERBOSE or verbose
    out = logging.StreamHandler(sys.stdout)
    out.addFilter(BelowWarning())
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.WARNING)
    for handler in (out, err):
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(Console())
    root = logging.getLogger()
    root.handlers[:] = [out, err]
    root.setLevel(logging.INFO)
    setup(verbose)
