"""Offline comparison of two runs' weight snapshots: the same curves the sibling callback logs,
from the saved safetensors files, on any machine, whatever launched the runs.

    numdev-compare RUN_A RUN_B [-o OUT_DIR] [--strict]

Writes distances.csv (one row per step and weight set, plus `__model__` for the model: the
columns of numdev.weights.metrics.DISTANCE_COLUMNS, defined in numdev.weights.distances) and
distances.png (the model's curves over training) into OUT_DIR (default: RUN_A/compare_<B>).
Token-embedding rows that neither run's captions index (their token_rows.json) are their own set.
Steps that only one run has are reported and skipped; --strict makes them an error. Also writes
compare.json (the runs, the final distances and provenance). The same run twice is refused; two runs
whose weights are bit-identical at every step get a loud warning (all curves are zero).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

from numdev.cli import logs, script_entry
from numdev.cli.errors import fail, interrupted
from numdev.runs.atomic import WriteError, check_regular_target, write_together
from numdev.runs.layout import (
    COMPARE_JSON,
    DISTANCES_CSV,
    DISTANCES_PNG,
    INDEX,
    MODEL_ROW,
    TOKEN_ROWS,
    WEIGHTS_DIR,
    RunDir,
    indexed_rows,
)
from numdev.runs.provenance import provenance
from numdev.weights.distances import check_same_architecture, compare, distance_rows, prepare
from numdev.weights.metrics import distances_to_csv
from numdev.weights.store import list_snapshots, load_snapshot

logger = logging.getLogger(__name__)


def compare_runs(run_a: str | Path, run_b: str | Path, strict: bool = False, log=print) -> list[dict]:
    """Rows (numdev.weights.metrics.DISTANCE_COLUMNS) for every snapshot step both runs have; run_b is the reference."""
    if _same_directory(run_a, run_b):
        raise ValueError(
            f"{run_a} and {run_b} are the same run directory: its distance to itself is zero at every step; "
            "give two different runs (e.g. .../reference and .../flash of a study)"
        )
    for run in (run_a, run_b):
        _not_a_sweep(Path(run))
    steps_a, steps_b = set(list_snapshots(run_a)), set(list_snapshots(run_b))
    common = sorted(steps_a & steps_b)
    only_a, only_b = sorted(steps_a - steps_b), sorted(steps_b - steps_a)
    if not common:
        raise ValueError(f"{run_a} and {run_b} share no snapshot step: steps {sorted(steps_a)} vs {sorted(steps_b)}")
    if only_a or only_b:
        message = f"snapshot steps only in {run_a}: {only_a}; only in {run_b}: {only_b}"
        if strict:
            raise ValueError(message + " (drop --strict to compare the common steps)")
        log(f"warning: {message}; comparing the {len(common)} common steps")
    token_rows = [RunDir(run_a).read_token_rows(), RunDir(run_b).read_token_rows()]
    if sum(r is None for r in token_rows) == 1:  # (runs made before token_rows.json existed have none)
        log(f"warning: only one run has {TOKEN_ROWS}: every token-embedding row is compared as trained")
    rows = []
    for step in common:
        try:
            a, b = load_snapshot(run_a, step), load_snapshot(run_b, step)
            check_same_architecture(a, b)
            indexed = indexed_rows(token_rows, step)
            rows.extend(distance_rows(step, compare(prepare(a, indexed), prepare(b, indexed))))
        except ValueError as error:
            raise ValueError(f"step {step}: {error}") from None
    return rows


def identical_warning(run_a, run_b, rows: list[dict]) -> str | None:
    """Two runs whose weights are bit-identical at every step: all curves are 0. Say it loudly."""
    if not all(r["max_abs"] == 0 for r in rows):
        return None
    steps = len({r["step"] for r in rows})
    return (
        f"WARNING: the weights of {run_a} and {run_b} are bit-identical at every compared step ({steps} steps): "
        "every distance is 0. Expected only for the same config run twice (a determinism check) or copies of "
        "one run; otherwise check the two paths."
    )


def _not_a_sweep(path: Path) -> None:
    """A sweep or study directory holds runs: name them instead of 'no snapshots here'."""
    if (path / WEIGHTS_DIR).is_dir() or not path.is_dir():
        return
    runs = sorted(p.parent.parent.name for p in path.glob(f"*/{WEIGHTS_DIR}/{INDEX}"))
    if runs:
        shown = ", ".join(str(path / r) for r in runs[:4]) + (", ..." if len(runs) > 4 else "")
        raise ValueError(
            f"{path / WEIGHTS_DIR / INDEX} does not exist: {path} is a sweep holding {len(runs)} run(s), "
            f"not one run: compare two runs ({shown})"
        )


def _same_directory(run_a: str | Path, run_b: str | Path) -> bool:
    a, b = Path(run_a), Path(run_b)
    try:
        return a.resolve() == b.resolve() or a.samefile(b)  # symlinks, bind mounts, ./x vs x
    except OSError:
        return False  # a missing run: list_snapshots names it


def main(argv: list[str] | None = None) -> None:
    script_entry.loaded()  # the imports are done: from here Ctrl-C is KeyboardInterrupt, caught below
    parser = argparse.ArgumentParser(prog="numdev-compare", description=__doc__.strip().splitlines()[0])
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("-o", "--out", help="output directory (default: RUN_A/compare_<name of RUN_B>)")
    parser.add_argument("--strict", action="store_true", help="steps missing from either run are an error")
    args = parser.parse_args(argv)
    logs.console()
    out = Path(args.out) if args.out else Path(args.run_a) / f"compare_{Path(args.run_b).name}"
    outputs = [out / DISTANCES_CSV, out / DISTANCES_PNG, out / COMPARE_JSON]
    try:
        for path in outputs:  # every destination before anything is computed or written
            check_regular_target(path)
        rows = compare_runs(args.run_a, args.run_b, strict=args.strict, log=logger.warning)
        from numdev.figures.distances import plot_curves  # matplotlib only when a figure is made

        last = [r for r in rows if r["tensor"] == MODEL_ROW][-1]
        steps = sorted({r["step"] for r in rows})
        record = {
            "run_a": str(Path(args.run_a).resolve()), "run_b": str(Path(args.run_b).resolve()), "steps": steps,
            "final": {k: v for k, v in last.items() if k != "tensor"},
            "bit_identical": all(r["max_abs"] == 0 for r in rows), "provenance": provenance(),
        }
        with tempfile.TemporaryDirectory(prefix="numdev-compare-") as staging:
            figure = Path(staging) / DISTANCES_PNG
            plot_curves({f"{Path(args.run_a).name} vs {Path(args.run_b).name}": rows}, figure, "weight distance over training")
            # the three together or none: an earlier comparison's files in OUT are replaced together, never mixed
            write_together({outputs[0]: distances_to_csv(rows).encode("utf-8"), outputs[1]: figure,
                            outputs[2]: (json.dumps(record, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8")})
    except (FileNotFoundError, ValueError, WriteError) as error:
        fail("numdev-compare", error)
    except KeyboardInterrupt:
        interrupted("numdev-compare")
    if warning := identical_warning(args.run_a, args.run_b, rows):
        logger.warning(warning)
    logger.info(
        f"{len(steps)} steps compared; at step {last['step']}: max |Δ| {last['max_abs']:.3e}, "
        f"mean |Δ| {last['mean_abs']:.3e}, W1/std {last['w1_over_std']:.3e}, pooled W1 {last['pooled_wasserstein']:.3e}"
    )
    logger.info(f"-> {out / 'distances.csv'}\n-> {out / 'distances.png'}\n-> {out / 'compare.json'}")


if __name__ == "__main__":
    main()
