"""Small CSV tables: rows of dicts to text, and back with typed columns.

A file that does not parse (truncated, edited, another program's) is a ValueError naming it.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

TABLE_LIMIT = 1 << 30


def to_csv(rows: list[dict], columns: list[str] | None = None) -> str:
    """CSV text with a header; columns default to every key of the rows, in first-seen order."""
    columns = columns if columns is not None else list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def read_csv(path: str | Path, types: dict[str, type], finite=(), optional=()) -> list[dict]:
    """The rows of `path`, each column converted with its type in `types`; a NaN or infinite number in
    a column of `finite` (where numdev never writes one) is a ValueError naming file, line and column.
    A column of `optional` (one added after files were written) that the header lacks reads as None."""
    size = Path(path).stat().st_size
    if size > TABLE_LIMIT:  # a table numdev writes is MB; an extended (sparse) file is not read
        raise ValueError(f"{path}: {size} bytes, far more than a table holds (at most {TABLE_LIMIT >> 20} MiB): the file is "
                         "corrupt or was extended; restore it from a copy or delete it (nothing was read)")
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            absent = {key for key in optional if key not in (reader.fieldnames or ())}
            rows = [{key: None if key in absent else kind(row[key]) for key, kind in types.items()} for row in reader]
    except (KeyError, ValueError, TypeError, csv.Error) as error:  # a missing column, a short or non-numeric row
        reason = "not UTF-8" if isinstance(error, UnicodeDecodeError) else f"{type(error).__name__}: {error}"
        raise ValueError(
            f"{path}: not a table with the columns {', '.join(types)} ({reason}); "
            "the file is truncated or was not written by numdev"
        ) from None
    if finite:
        for number, row in enumerate(rows, start=2):
            for key in finite:
                value = row[key]
                if isinstance(value, float) and not math.isfinite(value):
                    raise ValueError(f"{path}, line {number}: column {key!r} is {value}, not a finite number: the file is corrupt or was edited")
    return rows
