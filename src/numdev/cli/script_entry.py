"""The first import of every script under scripts/: Ctrl-C while the script's own imports load exits 130 with one line.

A script imports torch and numdev's modules before its `run_script(main)` line runs, a few seconds on a loaded
machine. Python's default SIGINT handler raises KeyboardInterrupt wherever it lands: inside an import that is a
traceback of dozens of lines, inside torch's C++ initialisation an abort (`terminate called after throwing an
instance of 'pybind11::error_already_set'`, exit -6), and once a module is half-initialised an ImportError. Nothing
has been written then, so this module's handler says so in one line and exits 130 at once, the code Ctrl-C gives
later too. `numdev.cli.script_args.run_script` puts Python's handler back before main() runs, so from there on
Ctrl-C is its KeyboardInterrupt path (files written whole or not at all).

It acts only when the process's __main__ is a file in a directory named scripts (`python scripts/x.py`), and only
over Python's own handler: a test that loads a script as a module, or a program that set its own handler, is left
as it is. pyproject.toml's ruff isort section `script-entry` keeps this import first in every script.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path


def _interrupted_while_loading(signum, frame) -> None:
    os.write(2, f"{Path(sys.argv[0]).name}: error: interrupted (SIGINT) while starting, before anything was written: "
                "run the same command again\n".encode())
    os._exit(130)


def _run_as_a_script() -> bool:
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return path is not None and Path(path).parent.name == "scripts"


def loaded() -> None:
    """The script's imports are done (run_script calls this before main()): Python's SIGINT handler again."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_loading:
        signal.signal(signal.SIGINT, signal.default_int_handler)


if (_run_as_a_script() and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
    signal.signal(signal.SIGINT, _interrupted_while_loading)
