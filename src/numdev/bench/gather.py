"""Gather a sweep's results.jsonl files into one table (CSV).

    numdev-gather outputs/bench/fig3/multirun_...   [-o table.csv]

Every record is checked before anything is written (`read_sweep`): each line a whole JSON object
(no torn, corrupt or blank line) with the fields of a bench record (numdev.runs.schemas.BENCH_RECORD)
and finite metrics (unless the record says how many values were not finite); within one job,
no measurement twice (a rerun that appended to the same file) and every record from one run (the
same experiment and overrides) on one machine and commit (numdev.runs.provenance.origin); in a
Hydra sweep, every job of multirun.yaml's grid present. A violation is one ValueError naming the
file, the line and what to do. A job stopped by a signal (interrupted.json beside its records, until
a rerun completes it) is refused too: its records are incomplete.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from numdev.cli import logs
from numdev.runs import schemas
from numdev.runs.atomic import WriteError, read_bounded, read_jsonl_numbered, write_text
from numdev.runs.layout import HYDRA_DIR, HYDRA_OVERRIDES, INTERRUPTED, MULTIRUN, RESULTS, TABLE
from numdev.runs.tables import to_csv

log = logging.getLogger(__name__)

# Fields that differ between two measurements of the same thing (timings, results, where and when).
VOLATILE = ("seconds", "metrics", "provenance", "reason", "estimated_bytes", "limit_bytes")
SAME_RUN = ("experiment", "overrides")  # every record of a job shares these


def record_key(record: dict) -> str:
    """What a record measures (its settings without results, timings or provenance): two records of
    one job with the same key measured the same thing twice."""
    return json.dumps({k: v for k, v in record.items() if k not in VOLATILE}, sort_keys=True, default=str)


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


@dataclass
class Sweep:
    """A sweep's records, every one checked; `origins` maps each job to where it was measured."""

    directory: Path
    rows: list[dict]
    provenance_by_job: dict[str, dict | None] = field(default_factory=dict)

    def common_provenance(self) -> dict | None:
        """The records' provenance block when every job was measured on one machine and commit; else None."""
        from numdev.runs.provenance import origin

        blocks = list(self.provenance_by_job.values())
        if not blocks or any(b is None for b in blocks) or len({origin(b) for b in blocks}) != 1:
            return None
        return blocks[0]


def read_sweep(directory: str | Path) -> Sweep:
    """Every results.jsonl under `directory`, checked as the module doc says."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no such sweep directory: {directory}")
    files = sorted(directory.rglob(RESULTS))
    if not files:
        raise FileNotFoundError(f"no results.jsonl under {directory}: is it a numdev-bench run or sweep directory?")
    _check_jobs_present(directory, files)
    sweep = Sweep(directory, [])
    measured: dict[str, str] = {}  # record key -> the job that measured it
    for path in files:
        job = str(path.parent.relative_to(directory)) if path.parent != directory else "."
        _check_not_interrupted(path.parent)
        records = _checked_job(path)
        for number, record in records:
            other = measured.setdefault(record_key(record), job)
            if other != job:
                raise ValueError(
                    f"{path}, line {number}: job {job} holds the same measurement as job {other} (the same settings): one of "
                    "them was copied from the other; remove the copy, or rerun the sweep in a new directory"
                )
        sweep.provenance_by_job[job] = records[0][1].get("provenance") if records else None
        sweep.rows.extend({"job": job, **flatten(record)} for _, record in records)
    return sweep


def gather(directory: str | Path) -> list[dict]:
    """Flat records of every results.jsonl under `directory`, each with the job dir it came from."""
    return read_sweep(directory).rows


def _checked_job(path: Path) -> list[tuple[int, dict]]:
    from numdev.runs.provenance import origin

    records = read_jsonl_numbered(path)
    seen: dict[str, int] = {}
    first_line, first = records[0] if records else (0, {})
    job_overrides = _job_overrides(path.parent)
    for number, record in records:
        where = f"{path}, line {number}"
        schemas.BENCH_RECORD.check(where, record)
        _check_metrics(where, record)
        key = record_key(record)
        if key in seen:
            raise ValueError(
                f"{where}: the same measurement as line {seen[key]} ({record.get('kind')} {record.get('method')}, seed "
                f"{record.get('seed')}): a rerun appended to this job's file; remove the repeated records, or rerun the job "
                "in a new directory"
            )
        seen[key] = number
        for name in SAME_RUN:
            if record.get(name) != first.get(name):
                raise ValueError(
                    f"{where}: {name} {record.get(name)!r} differs from line {first_line}'s {first.get(name)!r}: this job's "
                    "file mixes records of different runs; keep one run's records per job directory"
                )
        if job_overrides is not None and isinstance(record.get("overrides"), list) and record["overrides"] != job_overrides:
            raise ValueError(
                f"{where}: its overrides {record['overrides']} are not this job's ({path.parent / '.hydra' / 'overrides.yaml'}: "
                f"{job_overrides}): records of another run were put in this job's file; keep only the job's own records"
            )
        if origin(record.get("provenance")) != origin(first.get("provenance")):
            raise ValueError(
                f"{where}: measured on another machine or commit than line {first_line} (its provenance differs): this job's "
                "file mixes records of different runs; rerun the job in a new directory"
            )
    return records


def _check_not_interrupted(job_dir: Path) -> None:
    marker = job_dir / INTERRUPTED
    if marker.is_file():
        try:
            what = json.loads(read_bounded(marker, what="interruption marker").decode("utf-8"))
            how = f"by {what['signal']} after {int(what['records'])} record(s)"
        except (OSError, ValueError, KeyError, TypeError):
            how = "(its marker is unreadable)"
        raise ValueError(
            f"{job_dir}: the job was interrupted {how} ({marker.name}): its records are incomplete; rerun the same command "
            f"with hydra.run.dir={job_dir} to complete it (records already there are not written twice)"
        )


def _job_overrides(job_dir: Path) -> list[str] | None:
    """The overrides Hydra recorded for the job (its .hydra/overrides.yaml), None if unreadable or absent."""
    path = job_dir / HYDRA_DIR / HYDRA_OVERRIDES
    try:
        overrides = yaml.safe_load(read_bounded(path, what="Hydra overrides.yaml").decode("utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    return [str(o) for o in overrides] if isinstance(overrides, list) else None


def _check_metrics(where: str, record: dict) -> None:
    metrics = record.get("metrics")
    if not isinstance(metrics, dict):
        if record.get("kind") in ("vs_golden", "pair"):
            raise ValueError(f"{where}: field 'metrics' is missing: a {record['kind']} record holds its metrics; the file was edited")
        return
    if metrics.get("nonfinite"):  # the record itself says its output had NaN/Inf (numdev.bench.runner)
        return
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
            if value is None:
                continue
            raise ValueError(f"{where}: field 'metrics.{name}' is {value!r}, not a finite number: the file is corrupt or was edited")


def _check_jobs_present(directory: Path, files: list[Path]) -> None:
    """A Hydra sweep (multirun.yaml) has jobs 0..N-1, N the size of its grid: each must have records."""
    multirun = directory / MULTIRUN
    if not multirun.is_file():
        return
    expected = _grid_size(multirun)
    jobs = {p.parent.name for p in files if p.parent.parent == directory}
    numbered = {int(d.name) for d in directory.iterdir() if d.is_dir() and d.name.isdigit()}
    count = expected if expected is not None else (max(numbered) + 1 if numbered else 0)
    extra = sorted(n for n in numbered if n >= count and str(n) in jobs)
    if extra:
        raise ValueError(
            f"{directory}/{extra[0]}: job {extra[0]} is not one of the sweep's {count} jobs (multirun.yaml): it was copied "
            "from elsewhere; move it out of the sweep"
        )
    missing = [str(i) for i in range(count) if str(i) not in jobs]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(
            f"{directory}: job(s) {shown} of the sweep's {count} have no results.jsonl (not run, failed or killed before "
            "their first record): rerun the sweep (or those jobs) before gathering, so that no point is silently missing"
        )


def _grid_size(multirun: Path) -> int | None:
    """The number of jobs of the sweep that multirun.yaml describes: Hydra's basic sweeper runs the
    product of its params (hydra.sweeper.params, from the experiment) and the command line's sweeps,
    the command line's value replacing a param's. None when it cannot be told (another sweeper)."""
    try:
        hydra_cfg = (yaml.safe_load(read_bounded(multirun, what="Hydra multirun.yaml").decode("utf-8")) or {}).get("hydra", {})
        sweeper = hydra_cfg.get("sweeper") or {}
        if "BasicSweeper" not in str(sweeper.get("_target_", "BasicSweeper")):
            return None
        from hydra.core.override_parser.overrides_parser import OverridesParser

        lines = {str(k): f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()}
        parsed = OverridesParser.create().parse_overrides(list(hydra_cfg.get("overrides", {}).get("task", [])))
        for override in parsed:
            lines[override.key_or_group] = override.input_line
        overrides = OverridesParser.create().parse_overrides(list(lines.values()))
        sizes = [len(list(o.sweep_string_iterator())) for o in overrides if o.is_sweep_override()]
    except Exception:  # noqa: BLE001 (unreadable: the job directories alone decide)
        return None
    return math.prod(sizes) if sizes else 1


def write_table(directory: str | Path, out: str | Path | None = None) -> Path:
    rows = gather(directory)
    out = Path(out) if out is not None else Path(directory) / TABLE
    write_text(out, to_csv(rows))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="numdev-gather", description=__doc__.strip().splitlines()[0])
    parser.add_argument("directory", help="a numdev-bench run or multirun directory")
    parser.add_argument("-o", "--out", help="CSV path (default: <directory>/table.csv)")
    args = parser.parse_args(argv)
    logs.console()
    try:
        out = write_table(args.directory, args.out)
    except (FileNotFoundError, ValueError, WriteError) as error:
        from numdev.cli.errors import fail  # imported here: it pulls in hydra and torch

        fail("numdev-gather", error)
    except KeyboardInterrupt:
        from numdev.cli.errors import interrupted

        interrupted("numdev-gather")
    log.info(out)


if __name__ == "__main__":
    main()
