"""Does Flash move the edge of stability? Reads a learning-rate sweep of experiment=lr_edge (issue 37 item 4).

    numdev-train -m experiment=lr_edge trainer=gpu 'optim.optimizer.lr=3e-3,1e-2,3e-2,1e-1,3e-1,1e-3' \\
        attention=eager,sdpa_flash hydra.sweep.dir=<sweep>
    python scripts/lr_edge.py <sweep> --out lr_edge.json --figure lr_edge.png

Every job of the sweep (or every run directory given) is one (attention backend, learning rate) cell,
one seed each: sibling runs that differ in the backend and the learning rate only (the script refuses
runs whose model, precision, data, steps or seeds differ). Per cell: the run's status and last step,
its held-out next-token loss (heldout.json) beside the held-out text's unigram entropy (for scale:
a model that learnt only byte frequencies scores a little above it), its last training loss, its instability events
(non-finite values, loss spikes) and its median step time. Per backend:
  - failed (diverged): a run that went non-finite (its instability monitor stopped it), did not reach
    its last step, or ended no better than at initialisation, ln 256 (FAIL_RULE); a run that merely
    trains worse than the best is not a failure, the sensitivity below counts it;
  - the edge: the smallest learning rate, above the backend's best, at which a run failed (None: no
    run above the best failed in the sweep);
  - Wortsman et al.'s LR sensitivity (arXiv:2309.14322, section 2.2): the mean over the swept rates of
    min(loss, L0) - the best loss, with L0 = ln 256, a byte model's loss at initialisation.
And per learning rate run by both: the held-out loss of each backend minus eager's. One seed per
cell: observations of one run each, no interval, no verdict.

Replicates (runs that differ in their seeds too, e.g. seed.init=0,1,2,3,4; give several sweeps or one):
each replicate's per-backend summary, and each backend against the reference's runs of the same seeds (eager's,
or --reference's: runs of one backend that differ in their settings are labelled by them), side by
side by the exact sign test and the t test (numdev.stats.equivalence), against a relative margin stated
before the runs (--margin, default the harm study's 3%): the held-out loss at every rate (EFFECT_RULE),
the LR sensitivity (SENSITIVITY_RULE) and the edge in grid steps (EDGE_RULE, margin half a step). Fewer
than 5 replicates: ranges, no verdict. A job that has not written its run.json
(a sweep stopped by a time limit) is listed under `not_run`, and one that did not finish is
reported with its status and kept out of the edge and the sensitivity. Prints JSON.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import math
import shlex
import sys
from pathlib import Path

from numdev.analysis.consistency import config_value
from numdev.cli.script_args import ScriptParser, output_file_problem, run_script
from numdev.runs.atomic import write_bytes, write_text
from numdev.runs.layout import RunDir
from numdev.runs.provenance import machine_line_or_unknown, provenance
from numdev.runs.schemas import read_saved_config

INITIAL_LOSS = math.log(256)  # a byte-level model at initialisation predicts ~uniformly: L0 of the LR sensitivity
FAIL_RULE = ("a run fails (diverges) when it records a non-finite loss, gradient or attention output, stops before "
             "its last step, or ends with a held-out loss no lower than ln 256, a byte model's loss at initialisation")
BYTE_TEXT = "numdev.data.text.TextDataModule"  # byte tokens, a vocabulary of 256
SIBLING_KEYS = ("model", "precision", "data", "trainer.max_steps", "optim.warmup_steps", "optimization")
REFERENCE = "eager"  # the backend every other is judged against (--reference: another label)
MARGIN = 0.03  # the harm study's pre-registered margin (conf/train/experiment/harm.yaml study.harm.margin, docs/harm.md#margin)
EFFECT_RULE = ("per replicate r (the same seeds) and learning rate: (L_backend - L_ref) / L_ref, ref the reference backend, each held-out loss "
               "capped at ln 256 (a failed run counts as a byte model at initialisation: two failed runs are equal); "
               "positive is worse")
SENSITIVITY_RULE = ("per replicate: (S_backend - S_ref) / B_ref, S the replicate's LR sensitivity over the rates both "
                    "ran and B the reference's best held-out loss: the difference in the mean excess loss over the sweep, relative; "
                    "positive is worse")
EDGE_RULE = ("per replicate: the backend's edge minus the reference's, in steps of the learning-rate grid both ran (a backend with "
             "no failure above its best has its edge one step beyond the grid: censored, counted apart)")


def _code(block) -> str:
    """'numdev 0.1.0 @ abc1234567 (uncommitted changes)': the code a run trained with, from its provenance."""
    try:
        git = block["git"]
        return (f"numdev {block['versions']['numdev']} @ {(git.get('commit') or 'no git')[:10]}"
                + (" (uncommitted changes)" if git.get("dirty") else ""))
    except (KeyError, TypeError, AttributeError):
        return "unknown"


def _without_seeds(value):
    """A config node with every `seed` key dropped (data.seed follows seed.data: replicates differ there)."""
    if isinstance(value, dict):
        return {k: _without_seeds(v) for k, v in value.items() if k != "seed"}
    return value


def read_cell(path: Path) -> dict:
    """One run's row; ValueError (naming the file) when a file it needs is missing or not numdev's."""
    run = RunDir(path)
    record = run.read_record()
    config = read_saved_config(run.config)
    if config_value(config, "data._target_") != BYTE_TEXT:
        raise ValueError(f"{run.config}: data._target_ is {config_value(config, 'data._target_')!r}, not {BYTE_TEXT}: the fail rule's ln 256 "
                         "holds for a language model on bytes (experiment=lr_edge's runs)")
    lr = config_value(config, "optim.optimizer.lr")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"{run.config}: optim.optimizer.lr is {lr!r}, not a positive learning rate")
    seed = config_value(config, "seed")
    if not isinstance(seed, dict) or any(isinstance(v, bool) or not isinstance(v, int) for v in seed.values()):
        raise ValueError(f"{run.config}: seed is {seed!r}, not a mapping of integer seeds (seed.init, seed.data, ...)")
    from numdev.models.perturb import parse_perturbation  # numdev.models imports every model: not for --help

    perturbation = config_value(config, "init_perturbation")
    try:
        parse_perturbation(perturbation)
    except ValueError as error:
        raise ValueError(f"{run.config}: {error}: the saved config was edited") from None
    backend = record.get("backend")
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"{run.record}: no 'backend' (the attention backend the run used): not a numdev-train run.json")
    instability = run.read_instability() if run.instability.is_file() else {"events": []}
    kinds = [event.get("kind") for event in instability.get("events", []) if isinstance(event, dict)]
    heldout = run.read_outcome("heldout_loss") if run.heldout.is_file() else None
    if run.heldout.is_file() and heldout is None:  # numdev writes the file with its loss; without it, it was edited
        raise ValueError(f"{run.heldout}: field 'heldout_loss' is missing: the outcome record is incomplete or was edited")
    entropy = run.read_outcome("unigram_entropy") if run.heldout.is_file() else None
    final_step, max_steps = record.get("final_step"), record.get("max_steps")
    nonfinite = sum(str(kind).startswith("nonfinite") for kind in kinds)
    status = record["status"]
    complete = status in ("finished", "stopped")  # stopped: ended by its own monitor (a non-finite value)
    failed = bool(nonfinite or heldout is None or not math.isfinite(heldout)
                  or (isinstance(final_step, int) and isinstance(max_steps, int) and final_step < max_steps)
                  or heldout >= INITIAL_LOSS)
    step_seconds = record.get("step_seconds") if isinstance(record.get("step_seconds"), dict) else {}
    return {
        "run": str(path), "backend": backend, "lr": float(lr), "status": status, "complete": complete,
        "final_step": final_step, "max_steps": max_steps, "heldout_loss": heldout, "unigram_entropy": entropy,
        "final_train_loss": record.get("final_loss"), "nonfinite_events": nonfinite,
        "loss_spikes": sum(kind == "loss_spike" for kind in kinds), "failed": failed,
        "step_seconds_median": step_seconds.get("median"),
        "seed": seed, "siblings": {key: _without_seeds(config_value(config, key)) for key in SIBLING_KEYS},
        "machine": machine_line_or_unknown(record.get("provenance"), commit=False), "code": _code(record.get("provenance")),
        "attention": record.get("attention"),
        "init_perturbation": perturbation,  # a negative control: eager with weights one ulp apart
        "device": record.get("device"),
    }


def _loss(cell: dict) -> float:
    """The cell's held-out loss; inf for a run that has none (heldout.json missing: it never got there)."""
    loss = cell["heldout_loss"]
    return loss if loss is not None and math.isfinite(loss) else math.inf


def per_backend(cells: list[dict]) -> dict:
    out = {}
    for backend in sorted({c["backend"] for c in cells}):
        rows = sorted((c for c in cells if c["backend"] == backend and c["complete"]), key=lambda c: c["lr"])
        losses = [_loss(c) for c in rows]
        if not rows:
            out[backend] = {"runs": 0}
            continue
        best = min(range(len(rows)), key=lambda i: losses[i])
        best_loss = losses[best]
        edge = next((rows[i]["lr"] for i in range(best + 1, len(rows)) if rows[i]["failed"]), None)
        sensitivity = (sum(min(loss, INITIAL_LOSS) for loss in losses) / len(losses) - best_loss
                       if math.isfinite(best_loss) else None)
        out[backend] = {"runs": len(rows), "best_lr": rows[best]["lr"], "best_heldout_loss": best_loss if math.isfinite(best_loss) else None,
                        "edge_lr": edge, "failed_lrs": [c["lr"] for c in rows if c["failed"]],
                        "lr_sensitivity": sensitivity, "lrs": [c["lr"] for c in rows]}
    return out


def against_eager(cells: list[dict], reference: str = REFERENCE) -> list[dict]:
    by = {(c["backend"], c["lr"]): c for c in cells if c["complete"]}
    rows = []
    for (backend, lr), cell in sorted(by.items(), key=lambda item: (item[0][1], item[0][0])):
        eager = by.get((reference, lr))
        if backend == reference or eager is None:
            continue
        diff = _loss(cell) - _loss(eager) if math.isfinite(_loss(cell) + _loss(eager)) else None
        rows.append({"lr": lr, "backend": backend, "heldout_minus_eager": diff,
                     "failed": cell["failed"], "eager_failed": eager["failed"]})
    return rows


def _capped(cell: dict) -> float:
    """The held-out loss the sweep's summaries read: a failed run's (or none) counts as ln 256."""
    return min(_loss(cell), INITIAL_LOSS)


def label_replicates(cells: list[dict]) -> list[str]:
    """Give each cell its replicate: the seeds that vary across the cells ('init=1,data=1'), or 'one seed'
    when none vary. The labels, in the order of their seeds."""
    varying = [key for key in sorted({k for c in cells for k in c["seed"]}) if len({c["seed"].get(key) for c in cells}) > 1]
    order = {}
    for cell in cells:
        values = tuple(cell["seed"].get(key) for key in varying)
        cell["replicate"] = ",".join(f"{key}={value}" for key, value in zip(varying, values)) or "one seed"
        order[cell["replicate"]] = values
    return sorted(order, key=lambda label: [(v is None, v or 0) for v in order[label]])


FAILURES_RULE = ("failed runs of the backend against the reference's at one rate: Fisher's exact test (scipy.stats.fisher_exact, "
                 "two-sided) on the 2 x 2 counts; descriptive, not one of the study's registered tests")


def _failures(by: dict, backend: str, lr: float, labels: list[str], reference: str = REFERENCE) -> dict:
    """The backend's and the reference's failed runs at `lr` (of the runs each finished there) and FAILURES_RULE's p-value."""
    from scipy.stats import fisher_exact

    counts = {}
    for name in (backend, reference):
        runs = [by[name, lr, r] for r in labels if (name, lr, r) in by]
        counts[name] = {"failed": sum(c["failed"] for c in runs), "runs": len(runs)}
    table = [[c["failed"], c["runs"] - c["failed"]] for c in counts.values()]
    p = float(fisher_exact(table).pvalue) if all(c["runs"] for c in counts.values()) else None
    return {**counts, "fisher_p": p}


MOVED_RULE = ("per replicate, a backend's edge 'moved' when it differs from the reference's by any number of grid steps; "
              "two backends compared on the replicates both have: the exact McNemar test on the replicates where one moved and "
              "the other did not (scipy.stats.binomtest, p = 1/2, two-sided); 'moves it more often' needs p < 0.05")


def edge_moved(against: dict) -> dict:
    """MOVED_RULE over the backends judged against the reference: how many replicates each one's edge moved in, and each
    pair's McNemar test (does one backend move the edge in more seeds than the other, e.g. Flash than a one-ulp nudge?)."""
    from itertools import combinations

    from scipy.stats import binomtest

    moved = {b: {r: e["earlier_by_steps"] != 0 for r, e in a["edge"]["per_replicate"].items()} for b, a in against.items()}
    pairs = []
    for a, b in combinations(sorted(moved), 2):
        common = sorted(set(moved[a]) & set(moved[b]))
        only_a = sum(moved[a][r] and not moved[b][r] for r in common)
        only_b = sum(moved[b][r] and not moved[a][r] for r in common)
        p = float(binomtest(only_a, only_a + only_b, 0.5).pvalue) if only_a + only_b else 1.0
        pairs.append({"a": a, "b": b, "replicates": len(common), "a_only": only_a, "b_only": only_b,
                      "both": sum(moved[a][r] and moved[b][r] for r in common), "mcnemar_p": p,
                      "more_often": (a if only_a > only_b else b) if p < 0.05 else None})
    return {"rule": MOVED_RULE, "per_backend": {b: {"moved": sum(m.values()), "replicates": len(m)} for b, m in moved.items()},
            "pairs": pairs}


def _no_reference(reference: str, backends) -> str:
    return (f"no {reference} runs among these: nothing to judge the backends against (give its sweep too, or name another "
            f"reference with --reference: {', '.join(sorted(backends))})")


def replicated(cells: list[dict], labels: list[str], margin: float, reference: str = REFERENCE) -> dict:
    """The sweep over replicates: each replicate's per-backend summary, and each backend against the reference's runs of
    the same replicate: the held-out loss at every rate, the LR sensitivity and the edge (EFFECT_RULE,
    SENSITIVITY_RULE, EDGE_RULE), judged by the sign test and the t test side by side against the margin."""
    from numdev.analysis.harm.effects import judged

    done = [c for c in cells if c["complete"]]
    by = {(c["backend"], c["lr"], c["replicate"]): c for c in done}
    backends = sorted({c["backend"] for c in cells})
    grid = sorted({c["lr"] for c in cells})
    result = {
        "n": len(labels), "labels": labels, "margin": margin, "reference": reference,
        "rules": {"effect": EFFECT_RULE, "sensitivity": SENSITIVITY_RULE, "edge": EDGE_RULE, "failures": FAILURES_RULE,
                  "edge_margin": "0.5 grid steps: an edge that moves by one step or more is outside"},
        "per_replicate": {r: per_backend([c for c in done if c["replicate"] == r]) for r in labels},
        "failures": {b: {f"{lr:g}": {"failed": sum(by[b, lr, r]["failed"] for r in labels if (b, lr, r) in by),
                                     "runs": sum((b, lr, r) in by for r in labels)} for lr in grid} for b in backends},
        "against_eager": {},
    }
    if reference not in backends:
        result["note"] = _no_reference(reference, backends)
    for backend in backends if reference in backends else []:
        if backend == reference:
            continue
        rows = []
        for lr in grid:
            values = {r: (_capped(by[backend, lr, r]) - _capped(by[reference, lr, r])) / _capped(by[reference, lr, r])
                      for r in labels if (backend, lr, r) in by and (reference, lr, r) in by}
            rows.append({"lr": lr, "heldout": judged(values, margin), "failures": _failures(by, backend, lr, labels, reference)})
        sensitivity, edges = {}, {}
        for r in labels:
            common = sorted({lr for lr in grid if (backend, lr, r) in by and (reference, lr, r) in by})
            if len(common) < 2:  # one rate: no sensitivity (always 0) and no edge (nothing above the best)
                continue
            mine = per_backend([by[backend, lr, r] for lr in common])[backend]
            eager = per_backend([by[reference, lr, r] for lr in common])[reference]
            if mine["lr_sensitivity"] is not None and eager["lr_sensitivity"] is not None:
                sensitivity[r] = (mine["lr_sensitivity"] - eager["lr_sensitivity"]) / eager["best_heldout_loss"]
            step = {name: common.index(s["edge_lr"]) if s["edge_lr"] is not None else len(common) for name, s in
                    ((reference, eager), (backend, mine))}
            edges[r] = {reference: eager["edge_lr"], backend: mine["edge_lr"], "earlier_by_steps": step[reference] - step[backend],
                        "censored": [name for name, s in ((reference, eager), (backend, mine)) if s["edge_lr"] is None]}
        shifts = {r: e["earlier_by_steps"] for r, e in edges.items()}
        result["against_eager"][backend] = {
            "heldout": rows,
            "lr_sensitivity": judged(sensitivity, margin),
            "edge": {"per_replicate": edges,
                     "counts": {"earlier": sum(v > 0 for v in shifts.values()), "same": sum(v == 0 for v in shifts.values()),
                                "later": sum(v < 0 for v in shifts.values())},
                     "judged": judged({r: float(v) for r, v in shifts.items()}, 0.5)},
        }
    if result["against_eager"]:
        result["edge_moved"] = edge_moved(result["against_eager"])
    return result


def label_backends(cells: list[dict]) -> None:
    """Each cell's backend label: its backend's name, and where runs of one name differ in their attention settings
    (eager with and without attention.scores=fp32), the settings that are not null that set them apart: 'eager' beside
    'eager (scores fp32)'. Settings named seed are left out (replicates may differ there). A run whose initial weights
    were perturbed always says so ('eager (init_perturbation ulp)'), even with no unperturbed run beside it."""
    def flat(node, prefix=""):
        if not isinstance(node, dict):
            return {}
        out = {}
        for key, value in node.items():
            if key in ("backend", "seed"):
                continue
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out

    names = {}
    for cell in cells:
        names.setdefault(cell["backend"], []).append(cell)
    for name, group in names.items():
        settings = [flat(cell["attention"]) for cell in group]
        keys = sorted({k for f in settings for k in f})
        apart = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True) for f in settings}) > 1]
        for cell, f in zip(group, settings):
            perturbed = flat({"init_perturbation": cell.get("init_perturbation")})
            shown = [f"{k} {f[k]}" for k in apart if f.get(k) is not None] + [f"{k} {v}" for k, v in sorted(perturbed.items()) if v is not None]
            cell["backend"] = f"{name} ({', '.join(shown)})" if shown else name


def gather(paths: list[Path], margin: float = MARGIN, reference: str = REFERENCE) -> dict:
    jobs: list[Path] = []
    if len({p.resolve() for p in paths}) < len(paths):
        raise ValueError("a directory is given twice: give each sweep or run once")
    for path in paths:
        if not path.exists():
            raise ValueError(f"{path}: no such directory (a sweep that has not started its first job has none yet)")
        if not path.is_dir():
            raise ValueError(f"{path}: not a directory (give a sweep directory or run directories)")
        if (path / "config.yaml").is_file() or (path / "run.json").is_file():
            jobs.append(path)
        else:
            children = sorted((p for p in path.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
            if not children:
                raise ValueError(f"{path}: neither a run directory (no config.yaml) nor a sweep's (no numbered job directories)")
            jobs.extend(children)
    cells, not_run = [], []
    for job in jobs:
        if not (job / "run.json").is_file():
            not_run.append(str(job))  # the sweep stopped before this job wrote its record
            continue
        cells.append(read_cell(job))
    if not cells:
        raise ValueError(f"no run in {', '.join(map(str, paths))} has written its run.json yet")
    label_backends(cells)
    labels = label_replicates(cells)
    seen: dict[tuple, str] = {}
    for cell in cells:
        key = (cell["backend"], cell["lr"], cell["replicate"])
        if key in seen:
            raise ValueError(f"{cell['run']} and {seen[key]} are both backend {key[0]} with the same settings at lr {key[1]:g} with "
                             "the same seeds: the same run twice, or two sweeps mixed; give each run once (replicates differ in seed.init)")
        seen[key] = cell["run"]
        for name, value in cell["siblings"].items():
            if value != cells[0]["siblings"][name]:
                raise ValueError(f"{cell['run']} differs from {cells[0]['run']} in {name}: the cells of an LR sweep "
                                 "are sibling runs that differ in attention, init_perturbation, optim.optimizer.lr and their seeds only")
    result = {
        "what": "learning-rate sweep, attention backends against a reference (eager unless --reference names another): where "
                "each backend starts to fail (issue 37 item 4)",
        "fail_rule": FAIL_RULE,
        "initial_loss": INITIAL_LOSS,
        "cells": [{k: v for k, v in c.items() if k != "siblings"}
                  for c in sorted(cells, key=lambda c: (c["backend"], c["lr"], labels.index(c["replicate"])))],
        "siblings": cells[0]["siblings"],
        "not_run": not_run,
    }
    if len(labels) == 1:
        result["replicates"] = "one seed per cell: observations, no interval, no verdict"
        result["per_backend"] = per_backend(cells)
        result["reference"] = reference
        result["against_eager"] = against_eager(cells, reference)
        if reference not in {c["backend"] for c in cells}:
            result["note"] = _no_reference(reference, {c["backend"] for c in cells})
    else:
        result["replicates"] = (f"{len(labels)} replicates (seeds {', '.join(labels)}): each backend against {reference}'s run of the "
                                "same replicate; the sign test and the t test side by side (numdev.stats.equivalence)")
        result["replicated"] = replicated(cells, labels, margin, reference)
    return result


REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "gpu.md"
BLOCK = "lr-edge-cpu"
RESULTS = DOC.parent / "results"
PATTERN = "lr_edge_cpu*.json"  # each replicated sweep's summary, a table each


def _verdicts(entry: dict | None) -> str:
    """A judged effect's five cells of the block's table: '+0.11 [95% t: +0.09, +0.13] | 5 / 0 / 0 | ✓ ✗ | ✓ ✗ | 0.02'
    (mean [interval or range], the sign test's counts above / inside / below the margin, its harm and equivalence
    verdicts, the t test's, the t test's MDE)."""
    if not entry:
        return "no pair of runs | | | |"
    from numdev.stats.verdicts import SYMBOLS

    sign, c = entry["sign"], entry["sign"]["counts"]
    interval = entry["interval"]
    if interval["method"] == "range":
        spread = f"range of {entry['n']}: {interval['low']:+.3g}, {interval['high']:+.3g}"
    else:
        spread = f"95% t: {interval['low']:+.3g}, {interval['high']:+.3g}"
    mde = "n/a" if entry["mde"] is None else f"{entry['mde']:.2g}"
    return (f"{entry['mean']:+.3g} [{spread}] | {c['above']} / {c['inside']} / {c['below']} | "
            f"{SYMBOLS[sign['harm']['status']]} {SYMBOLS[sign['equivalence']['status']]} | "
            f"{SYMBOLS[entry['harm']['status']]} {SYMBOLS[entry['equivalence']['status']]} | {mde}")


def block_text(result: dict) -> str:
    """docs/gpu.md's block from a replicated sweep's JSON (RESULT): the failures and losses per rate, then each
    backend against the reference (eager, unless --reference named another) by both tests."""
    rep = result["replicated"]
    reference = rep.get("reference", REFERENCE)  # results written before --reference judged against eager
    backends = sorted(rep["failures"])
    machines = sorted({c["machine"] for c in result["cells"]})
    codes = sorted({c["code"] for c in result["cells"]})
    attention = {c["backend"]: c["attention"] for c in result["cells"]}
    described = "; ".join(f"{b}: {', '.join(f'{k} {v}' for k, v in sorted(attention[b].items()) if k != 'backend' and v is not None) or 'as configured'}"
                          for b in backends if isinstance(attention.get(b), dict))
    lines = [f"`{result['command']}`: {len(result['cells'])} runs, {rep['n']} replicates (seeds {', '.join(rep['labels'])}), "
             f"trained on {'; '.join(machines)} with {', '.join(codes)}. Backends: {described or 'as named'}. "
             f"Margin {rep['margin']:g} (relative), "
             f"stated before the runs; {FAIL_RULE}.", "",
             "Held-out loss (nats/byte, capped at ln 256 = 5.55: a failed run counts as a byte model at initialisation), "
             "mean over the replicates and their range, and failed runs:", "",
             "| lr | " + " | ".join(backends) + " |", "| --- |" + " --- |" * len(backends)]
    for lr in sorted({c["lr"] for c in result["cells"]}):
        row = []
        for backend in backends:
            values = [_capped(c) for c in result["cells"] if c["backend"] == backend and c["lr"] == lr and c["complete"]]
            fails = rep["failures"][backend][f"{lr:g}"]
            row.append(f"{sum(values) / len(values):.3f} ({min(values):.3f}-{max(values):.3f}), {fails['failed']} of "
                       f"{fails['runs']} failed" if values else "not run")
        lines.append(f"| {lr:g} | " + " | ".join(row) + " |")
    lines += ["", f"Each backend against {reference}'s run of the same seeds (paired; " + EFFECT_RULE + "; " + SENSITIVITY_RULE +
              "; " + EDGE_RULE + ", margin 0.5 steps). Columns: the mean effect [its 95% t interval, or the range below 5 "
              "replicates] | the sign test's counts above / inside / below the margin | the sign test's verdicts, harms and "
              "no more than a seed | the t test's, the same two | the t test's minimum detectable effect (power 0.8). "
              "✓ holds, ✗ fails, – not measurable.", "",
              "| backend | measure | effect | above / inside / below | sign: harms, no more | t: harms, no more | MDE | "
              f"failed runs, backend vs {reference} (Fisher p) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for backend, against in sorted(rep["against_eager"].items()):
        for row in against["heldout"]:
            f = row["failures"]
            p = "n/a" if f["fisher_p"] is None else f"{f['fisher_p']:.2g}"
            lines.append(f"| {backend} | held-out loss at lr {row['lr']:g} | " + _verdicts(row["heldout"]) +
                         f" | {f[backend]['failed']} of {f[backend]['runs']} vs {f[reference]['failed']} of {f[reference]['runs']} ({p}) |")
        if against["lr_sensitivity"] is None:  # a sweep of one rate
            lines.append(f"| {backend} | LR sensitivity and edge | not defined: one learning rate | | | | | |")
            continue
        lines.append(f"| {backend} | LR sensitivity | " + _verdicts(against["lr_sensitivity"]) + " | |")
        counts = against["edge"]["counts"]
        lines.append(f"| {backend} | edge, steps earlier ({counts['earlier']} earlier, {counts['same']} same, "
                     f"{counts['later']} later) | " + _verdicts(against["edge"]["judged"]) + " | |")
    lines += ["", f"Failed runs: {FAILURES_RULE}."]
    moved = rep.get("edge_moved")  # results written before MOVED_RULE have none
    if moved and moved["pairs"]:
        counts = ", ".join(f"{b} {m['moved']} of {m['replicates']}" for b, m in sorted(moved["per_backend"].items()))
        tests = "; ".join(f"{p['a']} only {p['a_only']}, {p['b']} only {p['b_only']}, both {p['both']}: McNemar p {p['mcnemar_p']:.2g}"
                          + (f", {p['more_often']} moves it more often" if p["more_often"] else ", not told apart")
                          for p in moved["pairs"])
        lines += ["", f"Seeds whose edge moved against {reference}'s: {counts}. {tests}. Rule: {MOVED_RULE}."]
    return "\n".join(lines)


def render(results: list[dict]) -> str:
    return "\n\n".join(block_text(result) for result in results)


def write_docs() -> int:
    """docs/gpu.md's block from every committed RESULTS/PATTERN: 0, or one line on stderr naming what was wrong and 2
    (the block untouched)."""
    from numdev.report.docblocks import write_results_table

    return write_results_table("lr_edge.py", RESULTS, PATTERN, render, DOC, BLOCK, REPO)


def figure(result: dict, path: Path) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    against = (result.get("replicated") or {}).get("against_eager") or {}
    if against:  # beside the sweep: where each seed's edge moved, per backend (MOVED_RULE's counts as a picture)
        fig, (ax, moved_ax) = plt.subplots(1, 2, figsize=(11.8, 4.2), dpi=110, gridspec_kw={"width_ratios": [1.25, 1]})
    else:
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    colours = {}
    styles = [dict(marker="o", linestyle="-", markersize=7), dict(marker="s", linestyle="--", markersize=5, markerfacecolor="none"),
              dict(marker="^", linestyle=":", markersize=6, markerfacecolor="none")]  # backends that agree stay visible
    replicates = sorted({c.get("replicate", "one seed") for c in result["cells"]})
    for index, backend in enumerate(sorted({c["backend"] for c in result["cells"]})):
        rows = [c for c in result["cells"] if c["backend"] == backend and c["complete"]]
        xs = sorted({c["lr"] for c in rows})
        means = [sum(_capped(c) for c in rows if c["lr"] == x) / sum(c["lr"] == x for c in rows) for x in xs]
        seeds = len({c.get("replicate") for c in rows})
        label = backend if len(replicates) == 1 else f"{backend} (mean of {seeds} seed{'s' * (seeds > 1)})"
        (line,) = ax.plot(xs, means, label=label, **styles[index % len(styles)])
        colours[backend] = line.get_color()
        if len(replicates) > 1:  # every replicate's run, faint, beside the mean
            ax.scatter([c["lr"] for c in rows], [_capped(c) for c in rows], s=12, alpha=0.35, color=line.get_color())
        failed = [(c["lr"], _capped(c)) for c in rows if c["failed"]]
        if failed:
            ax.scatter(*zip(*failed), marker="x", s=80, color=line.get_color(), zorder=3)
    entropies = [c["unigram_entropy"] for c in result["cells"] if c["unigram_entropy"] is not None]
    if entropies:
        ax.axhline(entropies[0], color="grey", linestyle=":", label="held-out unigram entropy")
    ax.axhline(INITIAL_LOSS, color="grey", linestyle="--", linewidth=0.8, label="ln 256 (initial loss; failed runs capped)")
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate (AdamW)")
    ax.set_ylabel("final held-out loss (nats/byte)")
    ax.set_title("LR sweep, one seed per point (x: failed run)" if len(replicates) == 1 else
                 "LR sweep: the mean over seeds as a line, each run a dot (x: failed run)")
    ax.legend(fontsize=8)
    if against:
        shifts = {b: [e["earlier_by_steps"] for e in a["edge"]["per_replicate"].values()] for b, a in sorted(against.items())}
        seen = [v for values in shifts.values() for v in values]
        steps = list(range(min(seen, default=0), max(seen, default=0) + 1))
        width = 0.8 / len(shifts)
        for index, (backend, values) in enumerate(shifts.items()):
            moved_ax.bar([x - 0.4 + width * (index + 0.5) for x in steps], [values.count(x) for x in steps], width,
                         color=colours.get(backend), label=f"{backend} ({sum(v != 0 for v in values)} of {len(values)} moved)")
        moved_ax.set_xticks(steps)
        moved_ax.set_xlabel(f"edge against {result['replicated'].get('reference', REFERENCE)}'s, grid steps earlier")
        moved_ax.set_ylabel("seeds")
        moved_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        moved_ax.set_title("Where each seed's edge moved (0: the same rate)")
        moved_ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    write_bytes(path, buffer.getvalue())


def main(argv=None) -> int:
    parser = ScriptParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="a sweep directory (its numbered jobs) or run directories")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--figure", type=Path, help="held-out loss against learning rate per backend (PNG)")
    parser.add_argument("--margin", type=float, default=MARGIN,
                        help=f"with replicates: the relative margin of the held-out loss and the LR sensitivity, stated "
                             f"before the runs (default {MARGIN:g}, the harm study's)")
    parser.add_argument("--reference", default=REFERENCE,
                        help="the backend every other is judged against, by its label (default eager; runs of one backend "
                             "that differ in their settings are labelled by them, e.g. 'eager (scores fp32)')")
    parser.add_argument("--write-docs", action="store_true",
                        help=f"write docs/gpu.md's {BLOCK} block from the committed docs/results/{PATTERN} and stop")
    args = parser.parse_args(argv)
    if args.write_docs:
        if args.paths or args.out or args.figure:
            parser.error("--write-docs renders the committed result alone: give no sweep, --out or --figure with it")
        return write_docs()
    if not args.paths:
        parser.error("give a sweep directory (its numbered jobs) or run directories")
    if not (math.isfinite(args.margin) and 0 < args.margin < 1):
        parser.error(f"--margin {args.margin:g}: a relative margin in (0, 1), e.g. 0.03 for 3%")
    if args.figure and (problem := output_file_problem(args.figure)):
        parser.error(f"--figure {args.figure}: {problem}")
    try:
        result = gather(args.paths, args.margin, args.reference)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    result["command"] = shlex.join(["python", "scripts/lr_edge.py", *(sys.argv[1:] if argv is None else argv)])
    result["provenance"] = provenance(threads=None)
    text = json.dumps(result, indent=1, allow_nan=False)
    print(text)
    if args.out:
        write_text(args.out, text + "\n")
    if args.figure:
        figure(result, args.figure)
    return 0


if __name__ == "__main__":
    run_script(main)
