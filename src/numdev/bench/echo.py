"""What numdev-bench echoes: the settings each job runs with, in one compact line.

A sweep of many jobs is only readable when each job says in one line what it computed
(what to run after it: numdev.cli.next_steps).
"""

from __future__ import annotations

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig


def _stages(numerics: DictConfig) -> str:
    """'bf16 everywhere' or 'bf16: input score prob output; fp32: stats rescale accum'."""
    from numdev.numerics.stages import STAGES

    described = instantiate(numerics).describe()
    by_format: dict[str, list[str]] = {}
    for stage in STAGES:
        by_format.setdefault(described[stage], []).append(stage)
    if len(by_format) == 1:
        return f"{next(iter(by_format))} everywhere"
    return "; ".join(f"{fmt}: {' '.join(stages)}" for fmt, stages in by_format.items())


def settings_line(cfg: DictConfig, choices: dict, job: int | None) -> str:
    """One compact line: the group choices, the stage formats, shape, tiles, seeds and the methods."""
    shape = cfg.shape
    seq_k = shape.seq_k if shape.get("seq_k") is not None else shape.seq_q
    groups = " ".join(f"{g}={o}" for g, o in choices.items() if o is not None and not g.startswith("hydra"))
    prefix = "numdev-bench" + (f" job {job}" if job is not None else "")
    runner = get_class(cfg.runner._target_) if cfg.get("runner") is not None else None
    if hasattr(runner, "settings"):  # a runner whose grid is not the bench's shape and methods (numdev.bench.gemm)
        return f"{prefix}: " + " | ".join(p for p in (groups, runner.settings(cfg.runner), f"seeds {list(cfg.seeds)}") if p)
    tiles = cfg.get("tiles") or {}
    tile_text = "x".join(str(tiles.get(k)) for k in ("block_r", "block_c")) + (f" sram={tiles.get('sram')}" if tiles.get("sram") else "")
    parts = [
        groups,
        f"stages {_stages(cfg.numerics)}" if "numerics" in cfg else "",
        f"shape B{shape.batch} H{shape.heads} Nq{shape.seq_q} Nk{seq_k} d{shape.dim}{' causal' if cfg.get('causal') else ''}",
        f"tiles {tile_text} {cfg.get('variant') or ''}".rstrip(),
        f"seeds {list(cfg.seeds)}",
        f"methods {', '.join(cfg.get('methods') or {})}",
    ]
    return f"{prefix}: " + " | ".join(p for p in parts if p)
