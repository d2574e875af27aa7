"""A study's runs, read: which runs it has, which it lacks, and every role's distance curves.

A study directory holds one run per replicate and role, `r<replicate>/<role>/` (the roles: conf/train/study/,
each run's config.yaml carries its `study` block: role, kind, label, replicate, and where it has one
its ladder rung, paper proxy, pre-registered claim). Both analyses read them here: the flash-stability
study's (numdev.analysis.study) and the harm study's (numdev.analysis.harm). A curve comes from the run's
live sibling CSV (numdev.train.callbacks.sibling) when it covers every snapshot step, else from the
snapshots (numdev.analysis.compare).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from numdev.analysis.compare import compare_runs
from numdev.runs.atomic import read_bounded
from numdev.runs.layout import MODEL_ROW as MODEL
from numdev.runs.layout import MULTIRUN, RUN_RECORD, RunDir
from numdev.weights.metrics import PREFERENCE
from numdev.weights.metrics import read_distances_csv as read_csv
from numdev.weights.store import list_snapshots

REFERENCE, TRUTH, UNDER_TEST = "reference", "truth", "under_test"  # kinds (conf/train/study/*.yaml: study.kind)
KIND_ORDER = (TRUTH, REFERENCE, UNDER_TEST, "control", "proxy", "optimization", "ladder")
# kinds of the harm study (experiment=harm): controls whose role file states a pre-registered claim
POSITIVE_CONTROL = "positive_control"
KIND_ORDER = (*KIND_ORDER, POSITIVE_CONTROL)


def discover(study_dir: Path) -> dict[str, dict[int, dict]]:
    """role -> replicate -> {dir, role, kind, label, replicate, record, config}."""
    runs: dict[str, dict[int, dict]] = {}
    for config_path in sorted(study_dir.glob("r*/*/config.yaml")):
        config = read_yaml(config_path)
        block = config.get("study") or {}
        if "role" not in block:
            continue
        run_dir = config_path.parent
        record = read_json(run_dir / RUN_RECORD, "run record")
        if record.get("status") != "finished":
            raise ValueError(f"{run_dir / RUN_RECORD}: status {record.get('status')!r}, not finished: rerun that role")
        replicate = int(block.get("replicate", 0))
        runs.setdefault(block["role"], {})[replicate] = {
            "dir": run_dir, "role": block["role"], "kind": block.get("kind", "control"), "label": block.get("label", block["role"]),
            "replicate": replicate, "record": record, "config": config, "ladder": block.get("ladder"), "paper": block.get("paper"),
            "claim": block.get("claim"), "claim_than": block.get("claim_than"), "analysis": block.get("analysis"),
        }
    kinds = {run["kind"] for by_rep in runs.values() for run in by_rep.values()}
    if REFERENCE not in kinds:
        experiment = "harm" if any(run["analysis"] == "harm" for by_rep in runs.values() for run in by_rep.values()) else "flash_stability"
        raise FileNotFoundError(
            f"{study_dir} is not a finished study: no run of kind 'reference' under r*/<role>/ "
            f"(run its reference: numdev-train experiment={experiment} study=reference hydra.sweep.dir={study_dir})"
        )
    return dict(sorted(runs.items(), key=lambda item: (kind_rank(kind_of(item[1])), item[0])))


def missing_jobs(study_dir: Path, runs: dict) -> list[str]:
    """The r<replicate>/<role> jobs of this study that have no run here: every role at every replicate
    another role has, and every role and replicate the sweep lists (multirun.yaml: the experiment's
    sweeper params, overridden by the command line's), parsed with Hydra's own override grammar."""
    roles, replicates = set(runs), {r for by_rep in runs.values() for r in by_rep}
    sweep = swept(Path(study_dir) / MULTIRUN)
    roles |= set(sweep.get("study", []))
    replicates |= {int(r) for r in sweep.get("study.replicate", []) if str(r).lstrip("-").isdigit()}
    return [f"r{r}/{role}" for r in sorted(replicates) for role in sorted(roles) if r not in runs.get(role, {})]


def swept(path: Path) -> dict[str, list[str]]:
    """{"study": [...], "study.replicate": [...]} as the multirun swept them; {} without a readable multirun.yaml."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if not path.is_file():
        return {}
    config = read_yaml(path)
    hydra = (config.get("hydra") or {}) if isinstance(config, dict) else {}
    params = {str(k): str(v) for k, v in ((hydra.get("sweeper") or {}).get("params") or {}).items()}
    for override in (hydra.get("overrides") or {}).get("task") or []:
        key, _, value = str(override).partition("=")
        params[key.lstrip("+~")] = value
    out = {}
    parser = OverridesParser.create()
    for key in ("study", "study.replicate"):
        if key not in params:
            continue
        try:
            (override,) = parser.parse_overrides([f"{key}={params[key]}"])
        except HydraException as error:
            raise ValueError(f"{path}: its sweep of {key} ({params[key]!r}) cannot be read ({error}): the file is corrupt") from None
        out[key] = list(override.sweep_string_iterator()) if override.is_sweep_override() else [str(override.value())]
    return out


def first_run(by_replicate: dict) -> dict:
    return by_replicate[min(by_replicate)]


def kind_of(by_replicate: dict) -> str:
    return next(iter(by_replicate.values()))["kind"]


def kind_rank(kind: str) -> int:
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)


def role_of_kind(runs: dict, kind: str) -> str | None:
    return next((role for role, by_rep in runs.items() if kind_of(by_rep) == kind), None)


def read_yaml(path: Path) -> dict:
    try:
        return yaml.safe_load(read_bounded(path, what="run config").decode("utf-8")) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML ({type(error).__name__}): the run's config is corrupt") from None


def read_json(path: Path, what: str, required: bool = True) -> dict | None:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} is missing: {path.parent} is not a finished numdev-train run ({what})")
        return None
    try:
        return json.loads(read_bounded(path, what=what).decode("utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}): the {what} is corrupt") from None


def pair_rows(run: Path, sibling: Path, label: str, log=print) -> list[dict]:
    """Distance rows of `run` against `sibling`: the live CSV if complete (every snapshot step of the sibling in
    it: after --keep-snapshots ends the sibling keeps two, the CSV all), else from the snapshots."""
    live = RunDir(run).sibling_csv(label)
    rows = read_csv(live) if live.is_file() else []
    if not rows or not set(list_snapshots(sibling)) <= {r["step"] for r in rows}:
        log(f"[study] {run.parent.name}/{run.name} vs {label}: computing the distances from the snapshots")
        rows = compare_runs(run, sibling, log=log)
    return rows


def model_curves(rows: list[dict]) -> tuple[list[int], dict[str, list[float]]]:
    """steps and metric -> values of the whole-model rows (metrics: the ones the rows have)."""
    model = sorted((r for r in rows if r["tensor"] == MODEL), key=lambda r: r["step"])
    metrics = [m for m in PREFERENCE if model and m in model[0]]
    return [int(r["step"]) for r in model], {m: [float(r[m]) for r in model] for m in metrics}


def study_curves(study_dir: Path, runs: dict, log=print, against_truth: bool = True) -> dict[str, dict[str, dict[int, tuple]]]:
    """against ('reference' | 'truth') -> role -> replicate -> (steps, metric -> values).

    Pairs are read (or computed from snapshots) on two threads: NumPy's sorts, safetensors reads
    and sha256 release the GIL, so the offline comparisons against the truth run overlap.
    """
    from concurrent.futures import ThreadPoolExecutor

    reference, truth = role_of_kind(runs, REFERENCE), role_of_kind(runs, TRUTH)
    jobs = []  # (against, role, replicate, run dir, anchor dir, anchor label)
    for against, anchor in (("reference", reference), ("truth", truth)):
        if anchor is None:
            continue
        for role, by_rep in runs.items():
            if role == anchor or (against == "reference" and role == truth):
                continue
            if against == "truth" and not against_truth and role != reference:
                continue  # the early study: only the reference's live comparison with the truth (no offline ones)
            for replicate, run in by_rep.items():
                if replicate in runs[anchor]:
                    jobs.append((against, role, replicate, run["dir"], runs[anchor][replicate]["dir"], anchor))
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda job: model_curves(pair_rows(job[3], job[4], job[5], log)), jobs))
    curves: dict[str, dict] = {"reference": {}, "truth": {}}
    for (against, role, replicate, *_), curve in zip(jobs, results):
        curves[against].setdefault(role, {})[replicate] = curve
    return curves


def prunable(study_dir: Path) -> None:
    """A study whose runs are compared with a truth run offline (from every snapshot, at analysis time) needs them
    all: ValueError saying so. A study whose comparisons ran live (sibling/*.csv: the harm study) does not."""
    runs = discover(Path(study_dir))
    truth = role_of_kind(runs, TRUTH)
    if truth is not None:
        raise ValueError(f"{study_dir}: --keep-snapshots ends: this study compares its runs with its {truth} run from their "
                         "snapshots when it is analysed, so it needs every one of them; keep them (the default, all)")


def prune_study(study_dir: Path, log) -> int:
    """After the analysis: every run's snapshots but step 0 and its last removed (numdev.weights.store.prune_snapshots),
    its sorted values with them; what a re-analysis reads stays (sibling/*.csv, the final weights). Returns bytes freed."""
    from numdev.weights.store import list_snapshots, prune_snapshots

    prunable(study_dir)
    freed = 0
    for by_rep in discover(Path(study_dir)).values():
        for run in by_rep.values():
            steps = list_snapshots(run["dir"])
            if steps:
                freed += prune_snapshots(run["dir"], {steps[0], steps[-1]})
    log(f"{study_dir}: kept each run's first and last snapshot, {freed / 1e9:.2f} GB freed (--keep-snapshots ends)")
    return freed
