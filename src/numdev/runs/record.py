"""The run's own records: config.yaml (the resolved config) and run.json (what ran, and how it ended)."""

from __future__ import annotations

import time
from pathlib import Path

import lightning
import torch
from omegaconf import DictConfig, OmegaConf

import numdev
from numdev.runs import schemas
from numdev.runs.atomic import write_json, write_text
from numdev.runs.layout import CONFIG, RunDir
from numdev.runs.layout import RUN_RECORD as RUN
from numdev.runs.provenance import provenance

# Keys a resumed run may change: they do not touch the weights' trajectory.
RESUMABLE_CHANGES = ("resume", "trainer.max_steps", "callbacks.instability.policy", "trainer.enable_progress_bar", "trainer.enable_model_summary", "verbose", "callbacks.samples.",
                     # moved or removed by numdev (the snapshot callback's module; the sibling shares its schedule)
                     "callbacks.snapshots._target_", "callbacks.sibling.every_n_steps",
                     # only whether the sorted values are written beside the snapshots (for the runs comparing with this one)
                     "snapshot.sorted_values", "callbacks.snapshots.sorted_values")
# Keys added after runs were made: a saved config without them matches when they hold these values
# (the behaviour the older run had). A prefix entry (ending in ".") accepts its whole subtree.
ADDED_KEYS = {"verbose": False, "trainer.strategy": "auto", "trainer.num_nodes": 1, "callbacks.instability.": None, "init_perturbation": None, "seed.perturbation": 0, "snapshot.schedule": "every", "snapshot.trained_only": False, "callbacks.heldout.": None,
              "attention.mode": "unbiased", "callbacks.tiling.": None,
              "seed.rounding": 0, "optim.cooldown_steps": 0, "objective.": None, "study.harm.learned_below": None}


def resolved(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def write_config(run_dir: Path, cfg: DictConfig) -> None:
    write_text(run_dir / CONFIG, OmegaConf.to_yaml(cfg, resolve=True))


def check_resumable(run_dir: Path, cfg: DictConfig) -> None:
    """The run's saved config must equal this one, except for RESUMABLE_CHANGES."""
    path = run_dir / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"resume=true but {path} does not exist: point hydra.run.dir at the run to resume")
    saved = _flatten(schemas.read_yaml_file(path, schemas.CONFIG))
    now = _flatten(resolved(cfg))
    saved = _relocated(saved, saved.get("run_dir"), now.get("run_dir"))
    differ = sorted(
        k for k in set(saved) | set(now)
        if saved.get(k) != now.get(k) and not any(k == c or k.startswith(c) for c in RESUMABLE_CHANGES)
        and not (k not in saved and _added_key(k, now.get(k)))
    )
    cooldown = now.get("optim.cooldown_steps") or 0
    if cooldown and saved.get("trainer.max_steps") != now.get("trainer.max_steps"):
        raise ValueError(f"resume=true: trainer.max_steps ({saved.get('trainer.max_steps')!r} -> {now.get('trainer.max_steps')!r}) "
                         f"cannot change with optim.cooldown_steps={cooldown}: the learning rate's decay ends at max_steps, so the "
                         "resumed run would not follow any single schedule; start a new run")
    if differ:
        shown = ", ".join(f"{k} ({saved.get(k)!r} -> {now.get(k)!r})" for k in differ[:3])
        raise ValueError(
            f"resume=true: the config differs from the run's {CONFIG} at {shown}"
            f"{' and more' if len(differ) > 3 else ''}: pass the original run's overrides"
        )


def _relocated(flat: dict, old_dir, new_dir) -> dict:
    """The saved config as if written in new_dir: a run directory copied or moved elsewhere stays
    resumable (paths inside it, like callbacks' run_dir and checkpoint dirpath, move with it)."""
    if not isinstance(old_dir, str) or not isinstance(new_dir, str) or old_dir == new_dir:
        return flat
    old = old_dir.rstrip("/")

    def move(value):
        if isinstance(value, str) and (value == old or value.startswith(old + "/")):
            return new_dir.rstrip("/") + value[len(old):]
        return value

    return {k: move(v) for k, v in flat.items()}


def _added_key(key: str, value) -> bool:
    for name, default in ADDED_KEYS.items():
        if key == name and value == default:
            return True
        if name.endswith(".") and key.startswith(name):  # the instability monitor: record-only by default
            return True
    return False


def _flatten(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}


def start_record(run_dir: Path, cfg: DictConfig, backend, resumed_from: int | None, gemm: dict | None = None) -> dict:
    path = run_dir / RUN
    previous = RunDir(run_dir).read_record() if resumed_from is not None and path.is_file() else {}
    record = {
        "numdev_version": numdev.__version__,
        "app": "train",
        "name": cfg.name,
        "status": "running",
        "model": cfg.model.name,
        "backend": backend.name,
        "attention": backend.describe(),
        "precision": cfg.precision.name,
        "precision_gemm": gemm,  # bf16/fp16 products: native kernels or FP32 GEMMs (numdev.train.precision)
        "seeds": {k: int(v) for k, v in cfg.seed.items()},
        "max_steps": int(cfg.trainer.max_steps),
        "device": cfg.trainer.accelerator,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "started": previous.get("started", _now()),
        # machine, versions, git commit + dirty, seeds (init, data, noise), date: numdev.runs.provenance
        "provenance": provenance(seeds=[int(v) for v in cfg.seed.values()]),
    }
    if resumed_from is not None:
        record["resumes"] = [*previous.get("resumes", []), {"from_step": resumed_from, "at": _now()}]
    write_json(path, record)
    return record


def finished_record(run_dir: Path, cfg: DictConfig) -> dict | None:
    """run.json if the run already finished all of cfg's steps (a requeue or a repeated resume), else None.

    A finished run is recognised from run.json and, when the run takes snapshots, the index entry and
    file of its final snapshot, whatever the checkpoint setting: one whose final snapshot is gone is
    refused (ValueError naming the file) rather than trained again over its records."""
    run_dir = Path(run_dir)
    if not (run_dir / RUN).is_file():
        return None
    run = RunDir(run_dir).read_record()
    final = run.get("final_step") or 0
    done = run["status"] == "finished" and final >= int(cfg.trainer.max_steps)
    if not done:
        return None
    callbacks = cfg.get("callbacks") or {}
    if callbacks.get("snapshots") is not None:
        from numdev.runs.layout import snapshot_name

        run_files = RunDir(run_dir)
        index = schemas.read_json_file(run_files.index, schemas.SNAPSHOT_INDEX) if run_files.index.is_file() else None
        steps = {int(e["step"]) for e in index["snapshots"]} if index is not None else set()
        snapshot = run_files.weights / snapshot_name(final)
        if final not in steps or not snapshot.is_file():
            missing = snapshot if final in steps else run_files.index if index is None else f"{run_files.index}'s entry for step {final}"
            raise ValueError(
                f"{run_files.record} says finished at step {final} but {missing} is missing: the run's final snapshot "
                "is gone; restore the weights/ directory from a copy, or move the run aside to train it again"
            )
    return run


def finish_record(run_dir: Path, record: dict, status: str, **fields) -> dict:
    record = {**record, **fields, "status": status, "finished": _now()}
    write_json(run_dir / RUN, record)
    return record


def close_abandoned(run_dir: Path, reason: str) -> bool:
    """A run.json still "running" whose run lock no process holds (its process was killed without a
    word, SIGKILL or the OOM killer): made final, "failed" with `reason`, resumable with resume=auto.
    False (nothing written) for any other record, an unreadable one, or a live run."""
    from numdev.runs.lock import is_held

    run_dir = Path(run_dir)
    if is_held(run_dir):  # first the lock, then the record: a live run writes its record before it lets go
        return False
    try:
        record = RunDir(run_dir).read_record()
    except (ValueError, OSError):
        return False
    if record.get("status") != "running":
        return False
    finish_record(run_dir, record, "failed", error=f"interrupted: {reason}")
    return True


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
