"""numdev-report: turn microbenchmark sweeps and/or a study directory into one HTML page.

    numdev-report                         # the latest sweep of every figure under outputs/
    numdev-report --bench outputs/bench/fig4/multirun_... --study outputs/train/flash_stability/multirun_... -o my_report
    numdev-report --study outputs/train/flash_stability_early/multirun_... --catalogue outputs/train/optimizations/multirun_...

Each paper figure is shown next to the paper's claim and our measured numbers, with the
configuration that produced it and the command that reruns it. The page embeds its figures (it is
self-contained) and the PNGs are copied beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
from pathlib import Path

import yaml

from numdev.cli import logs, script_entry
from numdev.cli.commands import script
from numdev.cli.errors import fail, interrupted
from numdev.figures import BENCH_FIGURES, FIGURES
from numdev.figures import BENCH_FIGURES as BENCH_ORDER  # noqa: E402  (the one list of figures)
from numdev.report import provenance as report_provenance
from numdev.report.html import Section, render
from numdev.runs import schemas
from numdev.runs.atomic import WriteError, check_regular_target, read_bounded, write_together
from numdev.runs.harm_summary import is_harm_summary
from numdev.runs.layout import CONFIG, HYDRA_DIR, HYDRA_OVERRIDES, MULTIRUN, RUN_RECORD, SUMMARY, TABLE, RunDir
from numdev.runs.provenance import provenance

log = logging.getLogger(__name__)


def latest_bench_sweeps(output_root: Path, notes: list[str] | None = None) -> list[Path]:
    """The newest finished sweep or single-run grid (one with its figure summary) of every bench figure.
    Where a newer run of that figure has no summary (unfinished, failed, killed), the older one is
    used and `notes` (and a warning) says so."""
    sweeps = []
    for name in BENCH_ORDER:
        done = sorted((p.parent for p in (output_root / "bench" / name).glob(f"*/{name}.json")), key=lambda p: p.stat().st_mtime)
        if done:
            sweeps.append(done[-1])
            newer = [p for p in (output_root / "bench" / name).iterdir() if p.is_dir() and p not in done
                     and p.stat().st_mtime > done[-1].stat().st_mtime]
            if newer:
                _fell_back(notes, f"{name}: the newest run {max(newer, key=lambda p: p.stat().st_mtime)} has no {name}.json "
                           f"(unfinished or failed): reporting the older {done[-1]}")
    return sweeps


def _fell_back(notes: list[str] | None, text: str) -> None:
    log.warning("%s", text)
    if notes is not None:
        notes.append(text)


def bench_section(sweep: Path) -> Section:
    summaries = sorted(sweep.glob("*.json"))
    summaries = [p for p in summaries if p.stem in BENCH_FIGURES]
    if not summaries:
        raise FileNotFoundError(f"{sweep} has no figure summary (fig3.json, ...): run the sweep through an experiment config")
    summary = schemas.read_figure_summary(summaries[0])
    name = summary["figure"]
    if name not in BENCH_FIGURES:
        raise ValueError(f"{summaries[0]}: field 'figure' is {name!r}, not one of {', '.join(BENCH_FIGURES)}: the file was edited")
    for field in ("caption",):
        if field not in summary:
            raise ValueError(f"{summaries[0]}: field '{field}' is missing: the figure summary is incomplete; rerun numdev-figure {name} {sweep}")
    title, claim = FIGURES[name].title, FIGURES[name].claim
    overrides = _task_overrides(sweep / MULTIRUN) or _run_overrides(sweep / HYDRA_DIR / HYDRA_OVERRIDES)
    config = sweep / "0" / HYDRA_DIR / CONFIG
    if not config.exists():  # a single-run grid (experiment=reconcile, bias)
        config = sweep / HYDRA_DIR / CONFIG
    return Section(
        title=title,
        claim=claim,
        measured=summary["caption"],
        figure=sweep / f"{name}.png",
        command=" ".join([script("numdev-bench"), *overrides]),
        config=config.read_text() if config.exists() else "",
        table_markdown=summary.get("table", ""),
        holds=summary.get("claim_holds"),
        verdict=summary.get("verdict", ""),
        status=summary.get("status"),
        rule=summary.get("verdict_rule", ""),
        parts=summary.get("parts") or {},
        deciding_rows=summary.get("deciding_rows") or [],
        files=[("the run", sweep), ("its figure summary", summaries[0]), (TABLE, sweep / TABLE)],
        provenance=summary.get("provenance") or _first_record_provenance(sweep),
    )


def _run_overrides(overrides_yaml: Path) -> list[str]:
    if not overrides_yaml.exists():
        return []
    try:
        return [str(o) for o in (yaml.safe_load(read_bounded(overrides_yaml, what="Hydra overrides.yaml").decode("utf-8")) or [])
                if not str(o).startswith("output_root=")]
    except yaml.YAMLError:
        raise ValueError(f"{overrides_yaml}: not a Hydra overrides.yaml: the file is corrupt") from None


def _first_record_provenance(sweep: Path) -> dict | None:
    """Sweeps made before figure summaries carried provenance: the block of a job's bench records, if any."""
    for results in sorted(sweep.glob("*/results.jsonl"))[:1]:
        try:
            with open(results, encoding="utf-8") as handle:  # the first record only, never the whole file
                first = handle.readline(1 << 20)
            return json.loads(first).get("provenance")
        except (OSError, ValueError, AttributeError):
            return None
    return None


def _task_overrides(multirun_yaml: Path) -> list[str]:
    if not multirun_yaml.exists():
        return []
    try:
        hydra_cfg = (yaml.safe_load(read_bounded(multirun_yaml, what="Hydra multirun.yaml").decode("utf-8")) or {}).get("hydra", {})
    except (yaml.YAMLError, AttributeError) as error:
        raise ValueError(f"{multirun_yaml}: not a Hydra multirun.yaml ({type(error).__name__}): the file is corrupt") from None
    return list(hydra_cfg.get("overrides", {}).get("task", []))


def build_report(bench_sweeps: list[Path], study_dir: Path | None, out_dir: Path, notes: list[str] | None = None,
                 catalogue: Path | None = None, harm: Path | None = None) -> Path:
    """Every section is built (every file read and checked) before anything is written. `catalogue`: an
    optimizations catalogue study (experiment=optimizations) whose table joins the study's sections;
    `harm`: a harm study (experiment=harm), whose answer comes first."""
    sections, sources, lead = [], {}, ""
    if harm is not None:
        from numdev.report.harm import answer_lead, harm_sections
        from numdev.runs.harm_summary import read_harm_summary

        sections += harm_sections(harm)
        lead = answer_lead(read_harm_summary(Path(harm) / SUMMARY))  # the first screen
        sources[f"the harm study ({harm})"] = sections[0].provenance
    bench = [bench_section(sweep) for sweep in bench_sweeps]
    sections += bench
    sources.update({f"{s.title.split(':')[0]} ({sweep})": s.provenance for s, sweep in zip(bench, bench_sweeps)})
    if study_dir is not None:
        from numdev.report.study import study_sections

        study_provenance = _study_provenance(Path(study_dir))
        try:
            built = study_sections(study_dir)
        except (KeyError, TypeError, AttributeError, IndexError) as error:  # a field the schema does not cover
            raise ValueError(f"{Path(study_dir) / 'summary.json'}: a field is missing or of the wrong type "
                             f"({type(error).__name__}: {error}): the study summary was edited; rerun numdev-study {study_dir}") from None
        for section in built:
            section.provenance = section.provenance or study_provenance
            sections.append(section)
        sources[f"the study ({study_dir})"] = study_provenance
    if catalogue is not None:
        from numdev.report.study import catalogue_sections

        sections += catalogue_sections(catalogue)
        sources[f"the optimizations catalogue ({catalogue})"] = _study_provenance(Path(catalogue))
    if not sections:
        raise FileNotFoundError("nothing to report: no finished bench sweep or study found (run `make demo` first)")
    check_regular_target(out_dir / "index.html")  # -o onto a file, a FIFO or a device: one line, nothing written
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise WriteError(out_dir, error) from None
    figures = {out_dir / section.figure.name: section.figure for section in sections
               if section.figure is not None and section.figure.exists()}
    page = render(
        "numdev report",
        f"generated {datetime.datetime.now():%Y-%m-%d %H:%M} — does FlashAttention's numeric deviation matter?",
        sections,
        intro="Each section regenerates a figure of 'Is Flash Attention Stable?' (Golden et al., 2024) or its "
        "neighbours, beside the paper's claim." + "".join(f" Note: {note}." for note in notes or []),
        header=report_provenance.header_html(sources, provenance(), out_dir),
        out_dir=out_dir,
        lead=lead,
    )
    index = out_dir / "index.html"
    write_together({**figures, index: page.encode("utf-8")})  # the page and its figures together, or none of them
    return index


def main(argv: list[str] | None = None) -> None:
    script_entry.loaded()  # the imports are done: from here Ctrl-C is KeyboardInterrupt, caught below
    parser = argparse.ArgumentParser(prog="numdev-report", description=__doc__.strip().splitlines()[0])
    parser.add_argument("--outputs", default="outputs", help="where runs landed (default: outputs)")
    parser.add_argument("--bench", nargs="*", help="bench sweep directories (default: the latest of each figure)")
    parser.add_argument("--study", help="a study directory (default: the latest under OUTPUTS/train/*/multirun_*)")
    parser.add_argument("--catalogue", help="an optimizations catalogue study (experiment=optimizations) whose table joins "
                        "the report (default, without --study: the latest under OUTPUTS/train/*/multirun_*)")
    parser.add_argument("--harm", help="a harm study (experiment=harm) whose answer leads the report (default: the latest "
                        "under OUTPUTS/train/*/multirun_*)")
    parser.add_argument("-o", "--out", help="report directory (default: OUTPUTS/report)")
    args = parser.parse_args(argv)
    logs.console()
    root = Path(args.outputs)
    notes: list[str] = []
    try:
        bench = [Path(p) for p in args.bench] if args.bench is not None else latest_bench_sweeps(root, notes)
        study = Path(args.study) if args.study else latest_study(root, notes)
        catalogue = Path(args.catalogue) if args.catalogue else None if args.study else latest_study(root, catalogue=True)
        if study is None and not args.catalogue:  # only a catalogue was run: it is the study, every section of it
            study, catalogue = catalogue, None
        harm = Path(args.harm) if args.harm else None if args.study else latest_study(root, kind="harm")
        if study is not None and (study / SUMMARY).is_file() and _kind_of(study / SUMMARY, notes) == "harm":
            harm, study = study, None  # --study names a harm study: its sections lead
        index = build_report(bench, study, Path(args.out) if args.out else root / "report", notes, catalogue, harm)
    except (FileNotFoundError, ValueError, WriteError) as error:
        fail("numdev-report", error)
    except KeyboardInterrupt:
        interrupted("numdev-report")
    for note in notes:  # also on the page
        log.info("numdev-report: note: %s", note)
    log.info("report: %s", index.resolve())


def _study_provenance(study_dir: Path) -> dict | None:
    """The study summary's provenance block; older summaries without one: the reference run's, else None."""

    for path in (study_dir / SUMMARY, study_dir / "reference" / RUN_RECORD):
        if path.is_file():
            block = (schemas.read_study_summary(path) if path.name == SUMMARY else RunDir(path.parent).read_record()).get("provenance")
            if block:
                return block
    return None


def latest_study(root: Path, notes: list[str] | None = None, catalogue: bool = False, kind: str | None = None) -> Path | None:
    """The newest analysed study under root/train (numdev-train experiment=flash_stability...), or with
    catalogue=True the newest optimizations catalogue (experiment=optimizations: a summary with an
    optimizations table); where a newer study has no summary.json (unfinished, failed, not analysed),
    `notes` says so."""

    done = sorted((p.parent for p in (root / "train").glob(f"*/multirun_*/{SUMMARY}")), key=lambda p: p.name)
    wanted = kind or ("catalogue" if catalogue else "study")
    done = [p for p in done if _kind_of(p / SUMMARY, notes) == wanted]
    if not done:
        return None
    newer = [p for p in (root / "train").glob("*/multirun_*") if p.is_dir() and not (p / SUMMARY).is_file()
             and p.name > done[-1].name and (p / MULTIRUN).is_file() and any(p.glob(f"r*/*/{CONFIG}"))]
    if newer:
        _fell_back(notes, f"the study: the newest {max(newer, key=lambda p: p.name)} has no summary.json (unfinished, failed "
                   f"or not analysed: numdev-study DIR): reporting the older {done[-1]}")
    return done[-1]


def _kind_of(summary: Path, notes: list[str] | None) -> str | None:
    """"catalogue" (a summary with an optimizations table), "harm" (a harm study's), "study", or None for a
    summary that cannot be read (skipped, and `notes` says so: an older damaged study does not stop the report)."""
    try:
        if is_harm_summary(json.loads(summary.read_text(encoding="utf-8"))):
            return "harm"
    except (OSError, ValueError):
        pass
    try:
        return "catalogue" if schemas.read_study_summary(summary).get("optimizations") else "study"
    except ValueError as error:
        _fell_back(notes, f"skipped {summary.parent}: {error}")
        return None


if __name__ == "__main__":
    main()
