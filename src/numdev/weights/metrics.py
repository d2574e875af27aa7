"""The weight distances, defined once: name, label, CSV type; and the distance CSV that holds them.

numdev.weights.distances computes them (its docstring gives every formula); the sibling CSVs
(<run_dir>/sibling/<label>.csv, numdev.runs.layout.RunDir.sibling_csv) and numdev-compare's
distances.csv hold one row per step and weight set, one column per metric; the study
(numdev.analysis.study), its figures and the report name them by `LABELS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from numdev.runs import tables


@dataclass(frozen=True)
class Metric:
    name: str
    label: str  # how figures, tables and the report name it
    column: type  # its type in the distance CSV
    finite: bool  # finite whenever the weights are (a ratio over a norm or std that can be 0 is not)


# In the order the distance CSV's columns are written.
METRICS = (
    Metric("numel", "values", int, False),
    Metric("max_abs", "max |ΔW|", float, True),
    Metric("mean_abs", "mean |ΔW|", float, True),
    Metric("rel_frobenius", "‖ΔW‖_F / ‖W_ref‖_F", float, False),
    Metric("wasserstein", "Wasserstein-1", float, True),
    Metric("w1_over_std", "W1 / std (per tensor, weighted)", float, False),
    Metric("pooled_wasserstein", "pooled Wasserstein-1 (paper)", float, True),
)
NAMES = tuple(m.name for m in METRICS)

# The distances in the order a study prefers them as its primary measure (the first one the sibling
# CSVs have). Position-aware metrics see two different initialisations as different models; the
# paper's pooled Wasserstein-1 does not (docs/study.md#metrics).
PREFERENCE = ("rel_frobenius", "w1_over_std", "mean_abs", "wasserstein", "pooled_wasserstein", "max_abs")
# The paper's pooled whole-model W1: its own column, or (CSVs written before that column existed)
# the model row's `wasserstein`, which was the pooled W1.
PAPER_METRIC = ("pooled_wasserstein", "wasserstein")
# The distance the early phase reads (numdev.analysis.early): position-aware, scale-free.
EARLY_METRIC = "rel_frobenius"
LABELS = {name: next(m.label for m in METRICS if m.name == name) for name in PREFERENCE}

# The distance CSV: `tensor` is a parameter name (its trained values), `<name>[unindexed]` (token-
# embedding rows no caption indexes), or MODEL_ROW (numdev.runs.layout: the aggregate over the
# trained values).
DISTANCE_COLUMNS = {"step": int, "tensor": str, **{m.name: m.column for m in METRICS}}
FINITE_DISTANCES = tuple(m.name for m in METRICS if m.finite)


def distances_to_csv(rows: list[dict]) -> str:
    return tables.to_csv(rows, list(DISTANCE_COLUMNS))


def read_distances_csv(path: str | Path) -> list[dict]:
    """Rows of a sibling CSV or distances.csv; a file of another shape, a (step, tensor) row twice, a
    negative step or distance, or a NaN or infinite one where numdev never writes one (FINITE_DISTANCES)
    is a one-line error naming the file and the line."""
    rows = tables.read_csv(path, DISTANCE_COLUMNS, finite=FINITE_DISTANCES)
    seen: dict[tuple, int] = {}
    for line, row in enumerate(rows, start=2):
        key = (row["step"], row["tensor"])
        if key in seen:
            raise ValueError(f"{path}, line {line}: step {row['step']}, tensor {row['tensor']!r} again (first on line {seen[key]}): "
                             "a row twice means the file was edited or two files were joined; restore it, or delete it and "
                             "compare again (numdev-compare, or resume the run)")
        seen[key] = line
        if row["step"] < 0:
            raise ValueError(f"{path}, line {line}: step {row['step']} is negative: the file is corrupt or was edited")
        negative = next((name for name in NAMES if row[name] < 0), None)
        if negative is not None:
            raise ValueError(f"{path}, line {line}: column {negative!r} is {row[negative]}, negative, and a distance never is: "
                             "the file is corrupt or was edited")
    return rows
