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
cell: observations of one run each, no interval, no verdict. A job that has not written its run.json
(a sweep stopped by a time limit) is listed under `not_run`, and one that did not finish is
reported with its status and kept out of the edge and the sensitivity. Prints JSON.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from numdev.analysis.consistency import config_value
from numdev.cli.script_args import ScriptParser, output_file_problem, run_script
from numdev.runs.atomic import write_bytes, write_text
from numdev.runs.layout import RunDir
from numdev.runs.provenance import provenance
from numdev.runs.schemas import read_saved_config

INITIAL_LOSS = math.log(256)  # a byte-level model at initialisation predicts ~uniformly: L0 of the LR sensitivity
FAIL_RULE = ("a run fails (diverges) when it records a non-finite loss, gradient or attention output, stops before "
             "its last step, or ends with a held-out loss no lower than ln 256, a byte model's loss at initialisation")
BYTE_TEXT = "numdev.data.text.TextDataModule"  # byte tokens, a vocabulary of 256
SIBLING_KEYS = ("model", "precision", "data", "trainer.max_steps", "seed", "optim.warmup_steps", "optimization")


def read_cell(path: Path) -> dict:
    """One run's row; ValueError (naming the file) when a file it needs is missing or not numdev's."""
    run = RunDir(path)
    record = run.read_record()
    config = read_saved_config(run.config)
    if config_value(config, "data._target_") != BYTE_TEXT:
        raise ValueError(f"{run.config}: data is {config_value(config, 'data._target_')!r}, not {BYTE_TEXT}: the fail rule's ln 256 "
                         "holds for a language model on bytes (experiment=lr_edge's runs)")
    lr = config_value(config, "optim.optimizer.lr")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"{run.config}: optim.optimizer.lr is {lr!r}, not a positive learning rate")
    backend = record.get("backend")
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"{run.record}: no 'backend' (the attention backend the run used): not a numdev-train run.json")
    instability = run.read_instability() if run.instability.is_file() else {"events": []}
    kinds = [event.get("kind") for event in instability.get("events", []) if isinstance(event, dict)]
    heldout = run.read_outcome("heldout_loss") if run.heldout.is_file() else None
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
        "siblings": {key: config_value(config, key) for key in SIBLING_KEYS},
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


def against_eager(cells: list[dict]) -> list[dict]:
    by = {(c["backend"], c["lr"]): c for c in cells if c["complete"]}
    rows = []
    for (backend, lr), cell in sorted(by.items(), key=lambda item: (item[0][1], item[0][0])):
        eager = by.get(("eager", lr))
        if backend == "eager" or eager is None:
            continue
        diff = _loss(cell) - _loss(eager) if math.isfinite(_loss(cell) + _loss(eager)) else None
        rows.append({"lr": lr, "backend": backend, "heldout_minus_eager": diff,
                     "failed": cell["failed"], "eager_failed": eager["failed"]})
    return rows


def gather(paths: list[Path]) -> dict:
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
    seen: dict[tuple, str] = {}
    for cell in cells:
        key = (cell["backend"], cell["lr"])
        if key in seen:
            raise ValueError(f"{cell['run']} and {seen[key]} are both backend {key[0]} at lr {key[1]:g}: "
                             "two sweeps mixed; give one sweep's jobs")
        seen[key] = cell["run"]
        for name, value in cell["siblings"].items():
            if value != cells[0]["siblings"][name]:
                raise ValueError(f"{cell['run']} differs from {cells[0]['run']} in {name}: the cells of an LR sweep "
                                 "are sibling runs that differ in attention and optim.optimizer.lr only")
    return {
        "what": "learning-rate sweep, eager attention against Flash: where each backend starts to fail (issue 37 item 4)",
        "fail_rule": FAIL_RULE,
        "initial_loss": INITIAL_LOSS,
        "replicates": "one seed per cell: observations, no interval, no verdict",
        "cells": [{k: v for k, v in c.items() if k != "siblings"} for c in sorted(cells, key=lambda c: (c["backend"], c["lr"]))],
        "siblings": cells[0]["siblings"],
        "not_run": not_run,
        "per_backend": per_backend(cells),
        "against_eager": against_eager(cells),
    }


def figure(result: dict, path: Path) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    styles = [dict(marker="o", linestyle="-", markersize=7), dict(marker="s", linestyle="--", markersize=5, markerfacecolor="none"),
              dict(marker="^", linestyle=":", markersize=6, markerfacecolor="none")]  # backends that agree stay visible
    for index, backend in enumerate(sorted({c["backend"] for c in result["cells"]})):
        rows = [c for c in result["cells"] if c["backend"] == backend and c["complete"]]
        xs = [c["lr"] for c in rows]
        ys = [min(_loss(c), INITIAL_LOSS) for c in rows]
        (line,) = ax.plot(xs, ys, label=backend, **styles[index % len(styles)])
        failed = [(x, y) for x, y, c in zip(xs, ys, rows) if c["failed"]]
        if failed:
            ax.scatter(*zip(*failed), marker="x", s=80, color=line.get_color(), zorder=3)
    entropies = [c["unigram_entropy"] for c in result["cells"] if c["unigram_entropy"] is not None]
    if entropies:
        ax.axhline(entropies[0], color="grey", linestyle=":", label="held-out unigram entropy")
    ax.axhline(INITIAL_LOSS, color="grey", linestyle="--", linewidth=0.8, label="ln 256 (initial loss; failed runs capped)")
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate (AdamW)")
    ax.set_ylabel("final held-out loss (nats/byte)")
    ax.set_title("LR sweep, one seed per point (x: failed run)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    write_bytes(path, buffer.getvalue())


def main(argv=None) -> int:
    parser = ScriptParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="a sweep directory (its numbered jobs) or run directories")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--figure", type=Path, help="held-out loss against learning rate per backend (PNG)")
    args = parser.parse_args(argv)
    if args.figure and (problem := output_file_problem(args.figure)):
        parser.error(f"--figure {args.figure}: {problem}")
    try:
        result = gather(args.paths)
    except (OSError, ValueError) as error:
        parser.error(str(error))
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
