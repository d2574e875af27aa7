"""What numdev-bench tells the user: the settings each job runs with, and what to run after a sweep.

A sweep of many jobs is only readable when each job says in one line what it computed, and a
finished sweep is only useful when the user knows the next command (numdev-gather, the figure).
"""

from __future__ import annotations

from pathlib import Path

from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig

from numdev.commands import command


def _stages(numerics: DictConfig) -> str:
    """'bf16 everywhere' or 'bf16: input score prob output; fp32: stats rescale accum'."""
    from numdev.numerics import STAGES

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
    prefix = "numdev-bench" + (f" job {job}" if job is not None else "")
    return f"{prefix}: " + " | ".join(p for p in parts if p)


class NextSteps(Callback):
    """Hydra callback (conf/bench.yaml): at the end of a run or sweep, print what to run next."""

    def on_run_end(self, config: DictConfig, **kwargs) -> None:
        run_dir = Path(config.hydra.run.dir)
        print(f"next: {command('numdev-gather', run_dir)}   (the records as {run_dir / 'table.csv'})")

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep = Path(config.hydra.sweep.dir)
        jobs = sum(1 for p in sweep.glob("*/results.jsonl"))
        lines = [f"sweep done: {jobs} job(s) in {sweep}"]
        table = sweep / "table.csv"
        if table.is_file():  # an experiment's figure callback gathered it already
            lines.append(f"      table:  {table}")
        else:
            lines.append(f"next: {command('numdev-gather', sweep)}   (one table of every job: {table})")
        figures = sorted(sweep.glob("*.png"))
        for figure in figures:
            lines.append(f"      figure: {figure}")
        if figures:
            lines.append(f"      {command('numdev-report', '--bench', sweep)}   (the figure beside the paper's claim, as HTML)")
        print("\n".join(lines))
