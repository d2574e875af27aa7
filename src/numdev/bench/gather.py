"""Gather a sweep's results.jsonl files into one table (CSV).

    numdev-gather outputs/bench/fig3/multirun_...   [-o table.csv]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from numdev.atomic import WriteError, read_jsonl, write_text
from numdev.tables import to_csv


def flatten(record: dict, prefix: str = "") -> dict:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists are kept as they are."""
    flat = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def gather(directory: str | Path) -> list[dict]:
    """Flat records of every results.jsonl under `directory`, each with the job dir it came from."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no such sweep directory: {directory}")
    files = sorted(directory.rglob("results.jsonl"))
    if not files:
        raise FileNotFoundError(f"no results.jsonl under {directory}: is it a numdev-bench run or sweep directory?")
    rows = []
    for path in files:
        job = str(path.parent.relative_to(directory)) if path.parent != directory else "."
        rows.extend({"job": job, **flatten(record)} for record in read_jsonl(path))
    return rows


def write_table(directory: str | Path, out: str | Path | None = None) -> Path:
    rows = gather(directory)
    out = Path(out) if out is not None else Path(directory) / "table.csv"
    write_text(out, to_csv(rows))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="numdev-gather", description=__doc__.strip().splitlines()[0])
    parser.add_argument("directory", help="a numdev-bench run or multirun directory")
    parser.add_argument("-o", "--out", help="CSV path (default: <directory>/table.csv)")
    args = parser.parse_args(argv)
    try:
        out = write_table(args.directory, args.out)
    except (FileNotFoundError, ValueError, WriteError) as error:
        from numdev.errors import fail  # imported here: it pulls in hydra and torch

        fail("numdev-gather", error)
    print(out)


if __name__ == "__main__":
    main()
