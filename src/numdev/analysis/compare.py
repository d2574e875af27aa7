"""Offline comparison of two runs' weight snapshots: the same curves the sibling callback logs,
from the saved safetensors files, on any machine, whatever launched the runs.

    numdev-compare RUN_A RUN_B [-o OUT_DIR] [--strict]

Writes distances.csv (one row per step and weight set, plus `__model__` for the model: the
columns of numdev.run_layout.DISTANCE_COLUMNS, defined in numdev.analysis.distances) and
distances.png (the model's curves over training) into OUT_DIR (default: RUN_A/compare_<B>).
Token-embedding rows that neither run's captions index (their token_rows.json) are their own set.
Steps that only one run has are reported and skipped; --strict makes them an error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from numdev.analysis.distances import check_same_architecture, compare, distance_rows, prepare
from numdev.atomic import WriteError, write_text
from numdev.errors import fail
from numdev.run_layout import MODEL_ROW, TOKEN_ROWS, distances_to_csv, indexed_rows, read_token_rows
from numdev.snapshot_store import list_snapshots, load_snapshot

PANELS = (
    ("max_abs", "max |Δ| (trained weights)"),
    ("mean_abs", "mean |Δ| (trained weights)"),
    ("w1_over_std", "W1 / std, numel-weighted mean"),
    ("pooled_wasserstein", "pooled W1 (whole model, the paper's)"),
)


def compare_runs(run_a: str | Path, run_b: str | Path, strict: bool = False, log=print) -> list[dict]:
    """Rows (numdev.run_layout.DISTANCE_COLUMNS) for every snapshot step both runs have; run_b is the reference."""
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
    token_rows = [read_token_rows(run_a), read_token_rows(run_b)]
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


def model_curve(rows: list[dict], metric: str) -> tuple[list[int], list[float]]:
    model_rows = [r for r in rows if r["tensor"] == MODEL_ROW]
    return [int(r["step"]) for r in model_rows], [float(r[metric]) for r in model_rows]


def plot_curves(curves: dict[str, list[dict]], path: Path, title: str) -> None:
    """One panel per metric; one line per named comparison (rows as compare_runs returns)."""
    from numdev.plotting import plt, save_png  # matplotlib only when a figure is made

    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4))
    for ax, (metric, label) in zip(axes, PANELS):
        for name, rows in curves.items():
            steps, values = model_curve(rows, metric)
            ax.plot(steps, values, "o-", ms=3, label=name)
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.set_yscale("symlog", linthresh=1e-12)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    save_png(fig, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="numdev-compare", description=__doc__.strip().splitlines()[0])
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("-o", "--out", help="output directory (default: RUN_A/compare_<name of RUN_B>)")
    parser.add_argument("--strict", action="store_true", help="steps missing from either run are an error")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else Path(args.run_a) / f"compare_{Path(args.run_b).name}"
    try:
        rows = compare_runs(args.run_a, args.run_b, strict=args.strict, log=lambda m: print(m, file=sys.stderr))
        write_text(out / "distances.csv", distances_to_csv(rows))
        plot_curves({f"{Path(args.run_a).name} vs {Path(args.run_b).name}": rows}, out / "distances.png", "weight distance over training")
    except (FileNotFoundError, ValueError, WriteError) as error:
        fail("numdev-compare", error)
    last = [r for r in rows if r["tensor"] == MODEL_ROW][-1]
    print(
        f"{len({r['step'] for r in rows})} steps compared; at step {last['step']}: max |Δ| {last['max_abs']:.3e}, "
        f"mean |Δ| {last['mean_abs']:.3e}, W1/std {last['w1_over_std']:.3e}, pooled W1 {last['pooled_wasserstein']:.3e}"
    )
    print(f"-> {out / 'distances.csv'}\n-> {out / 'distances.png'}")


if __name__ == "__main__":
    main()
