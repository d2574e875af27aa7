"""Generated blocks in README.md and docs/: numbers are written by scripts, never typed.

A document marks a block with two HTML comments (invisible when rendered):

    <!-- numdev:begin NAME -->
    ... generated text, replaced whole ...
    <!-- numdev:end NAME -->

`replace_block` rewrites the text between them and nothing else, and refuses (naming the file and
the block) when the markers are missing, repeated or out of order, so a script never silently
writes nowhere. A script that will write blocks calls `check_blocks` before it computes anything,
so a doc that lost its markers (or cannot be written) ends the run in its first second, not after
its measurement. Both raise `DocBlockError`, a one-line user error (numdev.cli.script_args.run_script
prints it). Each generated block should name the command that produced it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from numdev.cli.errors import UserError, one_line
from numdev.runs.atomic import write_text


class DocBlockError(UserError, ValueError):
    """A doc block cannot be read or written: the file is missing or unreadable, its markers are
    missing, repeated or out of order, or it cannot be written. One line naming the file, the
    block and what to do."""


def _markers(name: str) -> tuple[str, str]:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"block name {name!r}: use letters, digits, '.', '_' and '-'")
    return f"<!-- numdev:begin {name} -->", f"<!-- numdev:end {name} -->"


def _read(path: Path, name: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        why = error.strerror if isinstance(error, OSError) and error.strerror else "not UTF-8 text"
        raise DocBlockError(f"{path}: cannot read it to write block {name!r} ({why}): restore the file "
                            f"(git checkout -- {path}, if it is a committed doc) and run again") from None


def _split(path: Path, name: str, content: str) -> tuple[str, str, str]:
    """(the text before the begin marker, the body between the markers, the text after the end marker) of
    block NAME, or DocBlockError."""
    begin, end = _markers(name)
    if content.count(begin) != 1 or content.count(end) != 1 or content.index(begin) > content.index(end):
        found = f"{content.count(begin)} begin and {content.count(end)} end marker(s)"
        raise DocBlockError(f"{path}: block {name!r} needs exactly one '{begin}' followed by one '{end}' "
                            f"(found {found}{', the end first' if content.count(begin) == content.count(end) == 1 else ''}): "
                            f"put the two marker lines back (git checkout -- {path}, if it is a committed doc) and run again")
    head, rest = content.split(begin, 1)
    body, tail = rest.split(end, 1)
    return head, body, tail


def check_blocks(*blocks: tuple[Path, str]) -> None:
    """Before a script computes anything: each (path, name) block can be rewritten (the file reads,
    has the block's markers once each and in order, and is writable), else DocBlockError."""
    for path, name in blocks:
        _split(path, name, _read(path, name))
        if not os.access(path, os.W_OK) or not os.access(Path(path).parent, os.W_OK | os.X_OK):
            raise DocBlockError(f"{path}: not writable (its permissions, a read-only mount or an immutable flag), so "
                                f"block {name!r} could not be rewritten: make it writable and run again")


def replace_block(path: Path, name: str, text: str) -> None:
    """Replace the body of block NAME in PATH with TEXT (atomically)."""
    begin, end = _markers(name)
    head, _, tail = _split(path, name, _read(path, name))
    write_text(Path(path), f"{head}{begin}\n{text.strip()}\n{end}{tail}")


def read_block(path: Path, name: str) -> str:
    return _split(path, name, _read(path, name))[1].strip()


def read_results(results: Path, pattern: str, render, shown_from: Path | None = None) -> list[dict]:
    """The committed results `<results>/<pattern>` a doc block is rendered from, each read as input that may
    be edited, truncated or forged: `render([result])` must succeed on each alone (its own ValueError, a
    field missing or of the wrong type) before the block is written. A file that fails, or none at all, is a
    ValueError naming it (relative to `shown_from`, if given) and saying to rerun the command that wrote it."""
    def shown(path: Path) -> Path:
        return path.relative_to(shown_from) if shown_from is not None and path.is_relative_to(shown_from) else path

    files = sorted(Path(results).glob(pattern))
    if not files:
        raise ValueError(f"no {shown(Path(results))}/{pattern} to write the table from: run with --out there first")
    found = []
    for file in files:
        try:
            result = json.loads(file.read_text(encoding="utf-8"))
            render([result])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            why = f"a field the table reads is missing ({error})" if isinstance(error, KeyError) else one_line(error) or type(error).__name__
            raise ValueError(f"{shown(file)}: {why}: rerun the command that wrote it") from None
        found.append(result)
    return found


def write_results_block(results: Path, pattern: str, render, doc: Path, block: str, shown_from: Path | None = None) -> int:
    """Rewrite `block` of `doc` with `render(results)` from every committed result (read_results): how many
    there were. A result that fails, or a doc that cannot be written or lost its markers, is one ValueError
    (the block untouched)."""
    found = read_results(results, pattern, render, shown_from)
    try:
        replace_block(doc, block, render(found))
    except (OSError, ValueError) as error:  # cannot be written (WriteError); moved or lost its markers (DocBlockError)
        why = error.strerror if isinstance(error, OSError) and error.strerror else one_line(error).replace(f"{doc}: ", "")
        raise ValueError(f"{doc}: {why}: the table was not written") from None
    return len(found)


def write_results_table(program: str, results: Path, pattern: str, render, doc: Path, block: str, repo: Path) -> int:
    """A script's --write-docs: write_results_block, then one line on stderr saying what was written (exit 0), or
    saying what was wrong (exit 2, the block untouched)."""
    from numdev.cli.errors import console_line, one_line

    try:
        count = write_results_block(results, pattern, render, doc, block, repo)
    except ValueError as error:
        console_line(program, f"error: {one_line(error)}")
        return 2
    console_line(program, f"{doc.relative_to(repo) if doc.is_relative_to(repo) else doc}: the table of {count} result(s) written")
    return 0
