"""numdev-figure: (re)make a paper figure from a numdev-bench sweep's records; list the figures.

    numdev-figure --list [bench|study]     the figures, one per line (the Makefile loops over these)
    numdev-figure NAME SWEEP_DIR           gather SWEEP_DIR, write table.csv, NAME.png and NAME.json

Each figure's aggregation, plot, claim and verdict rule live in numdev.figures.<NAME>; the list of
figures is numdev.figures.FIGURES. numdev-bench makes the figure when a sweep ends (numdev.bench.sweep_end).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
from pathlib import Path

from numdev.bench.gather import read_sweep
from numdev.cli import logs, script_entry
from numdev.cli.errors import fail, interrupted
from numdev.runs.atomic import WriteError, write_together
from numdev.runs.layout import TABLE
from numdev.runs.tables import to_csv

log = logging.getLogger(__name__)


def make_figure(name: str, sweep_dir: str | Path) -> dict:
    """Gather the sweep, write table.csv, <name>.png and <name>.json (caption, verdict, numbers).

    Nothing is written unless everything succeeds: every record is checked first
    (numdev.bench.gather.read_sweep), the figure is drawn into a staging directory, and only then
    are table.csv, the figure and the summary put in place. The summary's provenance is the
    records' own (where they were measured); when jobs were measured on different machines or
    commits it is null, `provenance_by_job` lists them and the caption says so.
    """
    from numdev.figures import get

    figure = get(name)
    sweep_dir = Path(sweep_dir)
    sweep = read_sweep(sweep_dir)
    rows = sweep.rows
    from numdev.figures import FIGURES

    others = sorted({str(r["experiment"]) for r in rows if r.get("experiment") in FIGURES and r["experiment"] != name})
    if others:
        raise ValueError(f"{sweep_dir}: records of experiment {others[0]!r}, not of {name}: make the {others[0]} figure from it, "
                         f"or run numdev-bench experiment={name}")
    staging = Path(tempfile.mkdtemp(dir=sweep_dir, prefix=f".{name}-staging-"))
    try:
        summary = {"figure": name, "sweep": str(sweep_dir), "jobs": len({r["job"] for r in rows}), **figure.summarise(rows, staging)}
        _records_provenance(summary, sweep)
        # table.csv, the figure and its summary together or none (every destination checked first)
        write_together({sweep_dir / TABLE: to_csv(rows).encode("utf-8"),
                        **{sweep_dir / drawn.name: drawn for drawn in sorted(staging.iterdir())},
                        sweep_dir / f"{name}.json": (json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8")})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return summary


def _records_provenance(summary: dict, sweep) -> None:
    blocks = sweep.provenance_by_job
    if not blocks or all(b is None for b in blocks.values()):
        return  # records from before they carried provenance: the summary keeps the figure's own
    seeds = (summary.get("provenance") or {}).get("seeds")
    common = sweep.common_provenance()
    if common is not None:
        summary["provenance"] = {**common, "seeds": seeds}
        return
    from numdev.runs.provenance import machine_line_or_unknown

    summary["provenance"] = None
    summary["provenance_by_job"] = blocks
    lines = sorted({machine_line_or_unknown(b) for b in blocks.values()})
    summary["caption"] = (f"{summary.get('caption', '')} (measured on {len(lines)} different machines or commits: "
                          f"{'; '.join(lines)}; see provenance_by_job.)").strip()


def announce(name: str, summary: dict, directory: Path) -> None:
    log.info(f"{name}: {summary['caption']}\n  verdict: {summary['verdict']}\n  -> {directory / (name + '.png')}")


def main(argv: list[str] | None = None) -> None:
    from numdev.figures import FIGURES

    script_entry.loaded()  # the imports are done: from here Ctrl-C is KeyboardInterrupt, caught below
    parser = argparse.ArgumentParser(prog="numdev-figure", description="Make a paper figure from a numdev-bench sweep, or list the figures.")
    parser.add_argument("--list", nargs="?", const="all", choices=("all", "bench", "study"), help="print the figures' names and exit")
    parser.add_argument("figure", nargs="?", choices=sorted(FIGURES))
    parser.add_argument("sweep_dir", nargs="?")
    args = parser.parse_args(argv)
    logs.console()
    if args.list:
        for name, figure in FIGURES.items():
            if args.list in ("all", figure.phase):
                log.info(name)
        return
    if not args.figure or not args.sweep_dir:
        parser.error("give a FIGURE and a SWEEP_DIR (or --list)")
    if FIGURES[args.figure].phase != "bench":
        fail("numdev-figure", f"{args.figure} is a study figure: run numdev-study STUDY_DIR")
    try:
        summary = make_figure(args.figure, args.sweep_dir)
    except KeyError as error:
        fail("numdev-figure", f"{args.sweep_dir}: the records lack the field {error}: is it a sweep of the {args.figure} experiment?")
    except (TypeError, IndexError, AttributeError, ArithmeticError) as error:  # fields of another experiment's shape
        fail("numdev-figure", f"{args.sweep_dir}: the records cannot make {args.figure} ({type(error).__name__}: {error}): "
             f"is it a sweep of the {args.figure} experiment? Nothing was written")
    except (FileNotFoundError, ValueError, WriteError) as error:
        fail("numdev-figure", error)
    except KeyboardInterrupt:
        interrupted("numdev-figure")
    log.info(summary["caption"])
    log.info(f"verdict: {summary['verdict']}")


if __name__ == "__main__":
    main()
