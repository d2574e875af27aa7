"""numdev-figure: (re)make a paper figure from a numdev-bench sweep's records; list the figures.

    numdev-figure --list [bench|study]     the figures, one per line (the Makefile loops over these)
    numdev-figure NAME SWEEP_DIR           gather SWEEP_DIR, write table.csv, NAME.png and NAME.json

Each figure's aggregation, plot, claim and verdict rule live in numdev.figures.<NAME>; the list of
figures is numdev.figures.FIGURES. A Hydra callback (SweepFigure) makes the figure when a sweep ends.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hydra.experimental.callback import Callback

from numdev.atomic import WriteError, write_json, write_text
from numdev.bench.gather import gather
from numdev.errors import fail
from numdev.tables import to_csv


def make_figure(name: str, sweep_dir: str | Path) -> dict:
    """Gather the sweep, write table.csv, <name>.png and <name>.json (caption, verdict, numbers)."""
    from numdev.figures import get

    figure = get(name)
    sweep_dir = Path(sweep_dir)
    rows = gather(sweep_dir)
    write_text(sweep_dir / "table.csv", to_csv(rows))
    summary = {"figure": name, "sweep": str(sweep_dir), "jobs": len({r["job"] for r in rows}), **figure.summarise(rows, sweep_dir)}
    write_json(sweep_dir / f"{name}.json", summary)
    return summary


def announce(name: str, summary: dict, directory: Path) -> None:
    print(f"{name}: {summary['caption']}\n  verdict: {summary['verdict']}\n  -> {directory / (name + '.png')}")


class SweepFigure(Callback):
    """Hydra callback: when a multirun ends, make its figure in the sweep directory."""

    def __init__(self, figure: str):
        from numdev.figures import get

        get(figure)  # an unknown name fails here, before the sweep runs
        self.figure = figure

    def on_multirun_end(self, config, **kwargs) -> None:
        directory = Path(config.hydra.sweep.dir)
        announce(self.figure, make_figure(self.figure, directory), directory)


def main(argv: list[str] | None = None) -> None:
    from numdev.figures import FIGURES

    parser = argparse.ArgumentParser(prog="numdev-figure", description="Make a paper figure from a numdev-bench sweep, or list the figures.")
    parser.add_argument("--list", nargs="?", const="all", choices=("all", "bench", "study"), help="print the figures' names and exit")
    parser.add_argument("figure", nargs="?", choices=sorted(FIGURES))
    parser.add_argument("sweep_dir", nargs="?")
    args = parser.parse_args(argv)
    if args.list:
        for name, figure in FIGURES.items():
            if args.list in ("all", figure.phase):
                print(name)
        return
    if not args.figure or not args.sweep_dir:
        parser.error("give a FIGURE and a SWEEP_DIR (or --list)")
    if FIGURES[args.figure].phase != "bench":
        fail("numdev-figure", f"{args.figure} is a study figure: run numdev-study STUDY_DIR")
    try:
        summary = make_figure(args.figure, args.sweep_dir)
    except KeyError as error:
        fail("numdev-figure", f"{args.sweep_dir}: the records lack the field {error}: is it a sweep of the {args.figure} experiment?")
    except (FileNotFoundError, ValueError, WriteError) as error:
        fail("numdev-figure", error)
    print(summary["caption"])
    print(f"verdict: {summary['verdict']}")


if __name__ == "__main__":
    main()
