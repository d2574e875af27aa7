"""How numdev's programs start: Ctrl-C while their imports load is one line and exit 130, not a traceback.

A script under scripts/, or an app whose module imports torch and numpy at its top (APPS), spends a few seconds of a
loaded machine in imports before its main() runs. Python's default SIGINT handler raises KeyboardInterrupt wherever
it lands: inside an import that is a traceback of dozens of lines, inside torch's C++ initialisation an abort
(`terminate called after throwing an instance of 'pybind11::error_already_set'`, exit -6), and once a module is
half-initialised an ImportError. Nothing has been written then, so this module's handler says so in one line and
exits 130 at once, the code Ctrl-C gives later too. The program's entry puts Python's handler back before it does
anything (`loaded()`: numdev.cli.script_args.run_script for a script, main() for an app), so from there on Ctrl-C
is its KeyboardInterrupt path (files written whole or not at all).

The handler is set when this module is first imported, by `import numdev` (numdev/__init__.py) or by a script's
first line, and only when the process's __main__ is one of those programs: a file in this checkout's scripts/
(`python scripts/x.py`) or the console script of an app in APPS. Any other program that imports numdev - a test, a
notebook, numdev-train - keeps its own handler. pyproject.toml's ruff isort section `script-entry` keeps the import
first in every script, before torch.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"  # the checkout's scripts/ (an editable install's)
APPS = ("numdev-study", "numdev-compare", "numdev-figure", "numdev-report", "numdev-demo")  # each main() calls loaded() first


def _interrupted_while_loading(signum, frame) -> None:
    os.write(2, f"{Path(sys.argv[0]).name}: error: interrupted (SIGINT) while starting, before anything was written: "
                "run the same command again\n".encode())
    os._exit(130)


def _starting_one_of_ours() -> bool:
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path is None:
        return False
    path = Path(path)
    return path.name in APPS or (path.suffix == ".py" and path.resolve().parent == SCRIPTS)


def loaded() -> None:
    """The program's imports are done (its entry calls this before anything else): Python's SIGINT handler again."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_loading:
        signal.signal(signal.SIGINT, signal.default_int_handler)


if (_starting_one_of_ours() and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
    signal.signal(signal.SIGINT, _interrupted_while_loading)
