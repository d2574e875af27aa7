"""Generated blocks in README.md and docs/: numbers are written by scripts, never typed.

A document marks a block with two HTML comments (invisible when rendered):

    <!-- numdev:begin NAME -->
    ... generated text, replaced whole ...
    <!-- numdev:end NAME -->

`replace_block` rewrites the text between them and nothing else, and refuses (naming the file and
the block) when the markers are missing, repeated or out of order, so a script never silently
writes nowhere. Each generated block should name the command that produced it.
"""

from __future__ import annotations

import re
from pathlib import Path

from numdev.runs.atomic import write_text


def _markers(name: str) -> tuple[str, str]:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"block name {name!r}: use letters, digits, '.', '_' and '-'")
    return f"<!-- numdev:begin {name} -->", f"<!-- numdev:end {name} -->"


def replace_block(path: Path, name: str, text: str) -> None:
    """Replace the body of block NAME in PATH with TEXT (atomically)."""
    begin, end = _markers(name)
    content = Path(path).read_text(encoding="utf-8")
    if content.count(begin) != 1 or content.count(end) != 1 or content.index(begin) > content.index(end):
        raise ValueError(f"{path}: needs exactly one '{begin}' followed by one '{end}' to write block {name!r} into")
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    write_text(Path(path), f"{head}{begin}\n{text.strip()}\n{end}{tail}")


def read_block(path: Path, name: str) -> str:
    begin, end = _markers(name)
    content = Path(path).read_text(encoding="utf-8")
    if begin not in content or end not in content:
        raise ValueError(f"{path}: no block {name!r}")
    return content.split(begin, 1)[1].split(end, 1)[0].strip()
