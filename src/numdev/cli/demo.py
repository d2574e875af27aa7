"""numdev-demo: the main job on the embedded defaults (CPU), both phases and the report.

1. the microbenchmark figures (Figs. 3-6, FA3's Table 3, the reconciliation, the bias and the three
   matrix-product figures gemm_formats, gemm_k, gemm_scaling: docs/gemm.md), one
   sweep after another, each at demo size (3 seeds, 5 for the reconciliation; smaller N:
   numdev.figures.<name>.FIGURE's demo_overrides, printed with each command) — `numdev-bench experiment=<name>` runs it at full size;
   from 3 seeds each spread is a range, which carries no verdict (numdev.stats.verdicts): those
   verdicts read "not measurable", and the demo says so;
2. the harm study at demo size (numdev-train experiment=harm_demo: dit_study at 16x16 with Flash in
   key/value blocks of 2, 150 steps, 2 replicates of 7 roles: the reference, Flash, bf16 vs fp32, the
   ulp control, learning rate x10 and two rungs of the noise ladder; from 2 replicates
   every effect is a range and no claim gets a verdict, so the demo's answer is withheld by design:
   the full study, experiment=harm, 5 replicates, is docs/harm.md's);
3. the optimizations catalogue, 3 replicates of the first 16 steps (numdev-train experiment=optimizations
   study.replicate=0,1,2 trainer.max_steps=16: every optimization beside its baseline on the fp32
   low-floor study, eps* read at step 2 as in the full catalogue, held-out loss at step 16; the
   catalogue itself is 5 replicates of 64 steps: docs/optimizations.md);
4. numdev-report over all three, then where the report is and how to open TensorBoard.

Everything goes through the real command lines, so each step can be rerun by hand:

    numdev-demo [--outputs DIR] [--skip-bench] [--skip-study] [--skip-catalogue]
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from numdev.cli import logs, script_entry
from numdev.cli.commands import command, tensorboard
from numdev.cli.errors import fail, interrupted, one_line
from numdev.cli.script_args import ScriptParser
from numdev.figures import BENCH_FIGURES, FIGURES  # noqa: E402  (the one list of figures)
from numdev.stats.intervals import MIN_CI
from numdev.stats.verdicts import RANGE_NO_VERDICT

log = logging.getLogger(__name__)


def latest_run(output_root: Path, app: str, name: str) -> Path:
    """The newest run of a bench figure: a sweep (multirun_*) or a single-run grid (reconcile, bias)."""
    runs = sorted((p.parent for p in (output_root / app / name).glob(f"*/{name}.json")), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise FileNotFoundError(f"no finished run of {name} under {output_root / app / name}")
    return runs[-1]


def latest_sweep(output_root: Path, app: str, name: str) -> Path:
    sweeps = sorted((output_root / app / name).glob("multirun_*"))
    if not sweeps:
        raise FileNotFoundError(f"no sweep of {name} under {output_root / app / name}")
    return sweeps[-1]


def _root(output_root: Path) -> list[str]:
    """The output_root override as the user would type it (nothing for the default)."""
    return [] if output_root == Path("outputs") else [f"output_root={output_root}"]


# What the demo prints: each step as a command that runs as printed (tests/test_readme_commands.py).
def bench_command(experiment: str, output_root: Path) -> str:
    return command("numdev-bench", f"experiment={experiment}", *_root(output_root), *FIGURES[experiment].demo_overrides)


def study_command(output_root: Path) -> str:
    return command("numdev-train", *STUDY, *_root(output_root))


def catalogue_command(output_root: Path) -> str:
    return command("numdev-train", *CATALOGUE, *_root(output_root))


def report_command(output_root: Path) -> str:
    return command("numdev-report", "--outputs", output_root)


def run_bench_figures(output_root: Path) -> dict[str, Path]:
    figures, few = {}, {}
    for i, experiment in enumerate(BENCH_FIGURES, start=1):
        overrides = list(FIGURES[experiment].demo_overrides)
        log.info(f"[bench {i}/{len(BENCH_FIGURES)}] {bench_command(experiment, output_root)}")
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "numdev.bench.app", f"experiment={experiment}", f"output_root={output_root}", *overrides,
             *(["-v"] if logs.VERBOSE else [])],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        sweep = latest_run(output_root, "bench", experiment)
        summary = json.loads((sweep / f"{experiment}.json").read_text())
        log.info(f"    {time.perf_counter() - start:.0f} s: {summary['caption']}\n    verdict: {summary['verdict']}\n"
              f"    -> {sweep / (experiment + '.png')}")
        figures[experiment] = sweep / f"{experiment}.png"
        seeds = len((summary.get("provenance") or {}).get("seeds") or [])
        if 0 < seeds < MIN_CI:
            few[experiment] = seeds
    if few:  # why their verdicts read "not measurable", and what gives one
        counts = "/".join(str(n) for n in sorted(set(few.values())))
        log.info(f"[bench] {', '.join(few)}: {counts} seeds (their experiments' default), so each spread is a range "
                 f"('range of n') and {RANGE_NO_VERDICT}: what rests on it reads '– not measurable'; "
                 f"seeds=[{','.join(map(str, range(MIN_CI)))}] added to a figure's command gives one")
    return figures


STUDY = ("experiment=harm_demo",)  # the harm study at demo size (conf/train/experiment/harm_demo.yaml)
STUDY_NAME = "harm_demo"


def _train_sweep(step: str, overrides: tuple[str, ...], name: str, output_root: Path) -> Path:
    """Run a numdev-train sweep as its printed command does (progress bars off); its sweep directory."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "numdev.train.app", *overrides, f"output_root={output_root}", "trainer.enable_progress_bar=false",
         *(["-v"] if logs.VERBOSE else [])],
        check=True,
    )
    sweep = latest_sweep(output_root, "train", name)
    log.info(f"[{step}] {time.perf_counter() - start:.0f} s -> {sweep}")
    return sweep


def run_study(output_root: Path) -> Path:
    log.info(f"[study] {study_command(output_root)} (the harm study at demo size: 7 roles x 2 replicates of 150 steps; "
             "effects are ranges of 2, so no claim gets a verdict and the answer is withheld: the full study is "
             "experiment=harm)")
    return _train_sweep("study", STUDY, STUDY_NAME, output_root)


# The catalogue at demo size: 3 of its 5 replicates, the first 16 of its 64 steps (eps* is read at step 2).
CATALOGUE = ("experiment=optimizations", "study.replicate=0,1,2", "trainer.max_steps=16")
CATALOGUE_NAME = "optimizations"


def run_catalogue(output_root: Path) -> Path:
    log.info(f"[catalogue] {catalogue_command(output_root)} (every optimization beside its baseline; 3 replicates of 5 "
             f"and 16 steps of 64: intervals are ranges of 3 ({RANGE_NO_VERDICT}), held-out loss is at step 16)")
    return _train_sweep("catalogue", CATALOGUE, CATALOGUE_NAME, output_root)


def main(argv: list[str] | None = None) -> None:
    script_entry.loaded()  # the imports are done: from here Ctrl-C is KeyboardInterrupt, caught below
    try:
        demo(argv)
    except KeyboardInterrupt:  # Ctrl-C reaches the runs too: each stops as its own command does (resumable), and so does this
        interrupted("numdev-demo")


def demo(argv: list[str] | None = None) -> None:
    parser = ScriptParser(prog="numdev-demo", description=__doc__.strip().splitlines()[0])
    parser.add_argument("--outputs", default="outputs", help="where runs land (default: outputs)")
    parser.add_argument("--skip-bench", action="store_true", help="reuse the latest bench sweeps")
    parser.add_argument("--skip-study", action="store_true", help="reuse the latest study")
    parser.add_argument("--skip-catalogue", action="store_true", help="reuse the latest optimizations catalogue")
    parser.add_argument("-v", "--verbose", action="store_true", help="also show the libraries' messages and each run's progress")
    args = parser.parse_args(argv)
    logs.console(args.verbose)
    output_root = Path(args.outputs)
    start = time.perf_counter()
    try:
        if not args.skip_bench:
            run_bench_figures(output_root)
        study = None if args.skip_study else run_study(output_root)
        catalogue = None if args.skip_catalogue else run_catalogue(output_root)
    except subprocess.CalledProcessError as error:
        fail("numdev-demo", f"{' '.join(error.cmd[2:])} failed with exit status {error.returncode} (its message is above)")
    from numdev.report.app import build_report, latest_bench_sweeps, latest_study

    harm = study or latest_study(output_root, kind="harm")
    study = latest_study(output_root)  # a flash-stability study run by hand, if any
    catalogue = catalogue or latest_study(output_root, catalogue=True)
    try:
        index = build_report(latest_bench_sweeps(output_root), study, output_root / "report", catalogue=catalogue, harm=harm)
    except (FileNotFoundError, OSError) as error:  # --skip-* with nothing run before under --outputs, an unwritable folder
        fail("numdev-demo", f"{one_line(error)} (under --outputs {output_root})")
    minutes = (time.perf_counter() - start) / 60
    log.info(f"\ndone in {minutes:.1f} min.\nreport:      {index.resolve()}  (open it in a browser)")
    if harm is not None:
        log.info(f"TensorBoard: {tensorboard(harm)}   then http://localhost:6006")
    log.info(f"again:       {report_command(output_root)}   (the report from the latest runs)")


if __name__ == "__main__":
    main()
