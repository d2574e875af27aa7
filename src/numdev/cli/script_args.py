"""The command lines of scripts/: every argument checked before the first computation, errors in one line.

A script's run can take minutes to hours (scripts/gpu_kernels.py on a lent GPU): a seed that
torch.manual_seed refuses, or an --out that cannot be written, must not end it after the first
cell with a traceback. `ScriptParser` is argparse with:

- one-line errors: `<script>: error: <what is wrong> (see --help)`, exit 2, no usage block;
- `seed` and `at_least(n)` argument types (a seed is an integer in [0, 2^64), torch's limit);
- after parsing: list-valued seed options (dest `seeds`) listed once each (a seed twice would be
  counted as two independent replicates), and every output option (dest `out`) checked: not a
  directory, FIFO or device, under a directory (or one that can be created), which takes a small
  file written and fsynced (numdev.cli.errors.output_dir_problem's probe).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

SEED_LIMIT = 2**64
OUTPUT_DESTS = ("out", "samples")  # output file arguments: checked writable before any work
SEED_DESTS = ("seeds",)


def seed(text: str) -> int:
    """An argparse type: a seed, an integer in [0, 2^64)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer seed") from None
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"{value} must be a non-negative integer below 2^64 (a 64-bit seed)")
    return value


def at_least(low: int):
    """An argparse type: an integer >= low."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
        return value

    return parse


def output_file_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot take an output file, or None: checked before anything is computed."""
    from numdev.runs.atomic import NotARegularFile, WriteError, check_regular_target, write_bytes

    path = Path(path)
    try:
        check_regular_target(path)
    except NotARegularFile as error:
        return str(error)
    directory = path.parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    if not directory.is_dir():
        return f"{directory} is not a directory, so {path} cannot be written under it: give another path"
    probe = directory / f".numdev-write-probe-{os.getpid()}"
    try:
        write_bytes(probe, bytes(4096))
    except WriteError as error:
        return f"cannot write {path} ({error.strerror}): free some space or fix the permissions, or give another path"
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
    return None


class ScriptParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's usage block and error: one line instead
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")  # argparse's own stderr writer and exit

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        for dest in SEED_DESTS:
            values = getattr(parsed, dest, None)
            if isinstance(values, list):
                twice = sorted({v for v in values if values.count(v) > 1})
                if twice:
                    self.error(f"--{dest.replace('_', '-')} lists {', '.join(map(str, twice))} more than once: each seed is "
                               "one independent replicate; list each once")
        given = {}  # resolved path: the option that names it
        for dest in OUTPUT_DESTS:
            value = getattr(parsed, dest, None)
            if value:
                problem = output_file_problem(value)
                if problem:
                    self.error(f"--{dest} {value}: {problem}")
                twin = given.setdefault(Path(value).resolve(), dest)
                if twin != dest:
                    self.error(f"--{twin} and --{dest} both name {value}: one would overwrite the other; give each its own file")
        return parsed


def run_script(main) -> None:
    """A script's entry point (`if __name__ == "__main__": run_script(main)`): exits with main()'s
    return value (None: 0). A user error that reaches it - a results file that is missing or not
    valid JSON (numdev.runs.atomic.read_json), a doc block that lost its markers
    (numdev.report.docblocks), an output that cannot be written (WriteError) - is one line on stderr
    and exit 2, like the apps (numdev.cli.errors.USER_ERRORS); Ctrl-C is one line and exit 130 (and while the
    script's imports load, numdev.cli.script_entry's); a closed
    pipe on stdout (`script | head`) is exit 1 without a traceback."""
    import sys

    from numdev.cli import script_entry
    from numdev.cli.errors import USER_ERRORS, fail, interrupted

    script_entry.loaded()  # from here Ctrl-C is KeyboardInterrupt again, caught below
    program = Path(sys.argv[0]).name
    try:
        code = main()
    except USER_ERRORS as error:
        fail(program, error)
    except KeyboardInterrupt:
        interrupted(program)
    except BrokenPipeError:  # `script | head`: the reader went away; nothing more to say (Python's docs, signal module)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    sys.exit(code)
