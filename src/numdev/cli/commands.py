"""How numdev prints a command so that it runs as printed.

`make demo` installs into .venv without activating it, so a bare `numdev-bench` or `tensorboard`
is "command not found" in the user's shell. Printed commands name the console script beside the
running interpreter instead: `.venv/bin/numdev-bench` from the repository root; from an environment
without the scripts beside its interpreter (another venv, a `pip --target` install, as on a lent GPU
machine), `<python> -m <module>`, the module read from the script's entry point.
"""

from __future__ import annotations

import importlib.metadata
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


def _module_of(name: str) -> str | None:
    """The module of an installed console script (numdev's own, from the package's entry points)."""
    for entry in importlib.metadata.entry_points(group="console_scripts", name=name):
        return entry.module
    return None


def argv(name: str, module: str | None = None) -> list[str]:
    """The argument list that runs console script `name` from this interpreter's environment: the
    script beside the interpreter, else `<python> -m <module>` (`module`, or the script's own)."""
    beside = Path(sys.executable).parent / name  # not resolved: the venv's bin/, not the base interpreter's
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    module = module or _module_of(name)
    return [sys.executable, "-m", module] if module is not None else [name]


def script(name: str, module: str | None = None) -> str:
    """`.venv/bin/<name>` as the user can type it; `<python> -m <module>` when the script is not
    beside the interpreter (another environment, an install without scripts)."""
    words = argv(name, module)
    if len(words) == 1:
        return _shown(Path(words[0])) if "/" in words[0] else words[0]
    return f"{_shown(Path(words[0]))} -m {words[2]}"


def command(name: str, *args: str | os.PathLike, module: str | None = None) -> str:
    """A whole command line, quoted for a POSIX shell: command("numdev-gather", sweep_dir)."""
    return " ".join([script(name, module), *(shlex.quote(_shown(Path(a)) if isinstance(a, Path) else str(a)) for a in args)])


def tensorboard(logdir: str | os.PathLike) -> str:
    return command("tensorboard", "--logdir", Path(logdir), module="tensorboard.main")
