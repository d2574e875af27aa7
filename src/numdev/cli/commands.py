"""How numdev prints a command so that it runs as printed.

`make demo` installs into .venv without activating it, so a bare `numdev-bench` or `tensorboard`
is "command not found" in the user's shell. Printed commands name the console script beside the
running interpreter instead: `.venv/bin/numdev-bench` from the repository root.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path


def _shown(path: Path) -> str:
    """The path relative to the current directory when it lies under it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def script(name: str, module: str | None = None) -> str:
    """`.venv/bin/<name>` as the user can type it; `<python> -m <module>` when the script is missing."""
    beside = Path(sys.executable).parent / name  # not resolved: the venv's bin/, not the base interpreter's
    if beside.is_file() and os.access(beside, os.X_OK):
        return _shown(beside)
    if module is not None:
        return f"{_shown(Path(sys.executable))} -m {module}"
    return name


def command(name: str, *args: str | os.PathLike, module: str | None = None) -> str:
    """A whole command line, quoted for a POSIX shell: command("numdev-gather", sweep_dir)."""
    return " ".join([script(name, module), *(shlex.quote(_shown(Path(a)) if isinstance(a, Path) else str(a)) for a in args)])


def tensorboard(logdir: str | os.PathLike) -> str:
    return command("tensorboard", "--logdir", Path(logdir), module="tensorboard.main")
