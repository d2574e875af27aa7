"""numdev-bench: the Hydra app of the microbenchmark. Each run appends its records to
results.jsonl in its run directory; a sweep is a Hydra multirun (-m)."""

from __future__ import annotations

from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, open_dict

from numdev.atomic import append_jsonl
from numdev.bench.runner import run_bench
from numdev.errors import user_facing


@hydra.main(config_path="pkg://numdev.conf", config_name="bench", version_base="1.3")
@user_facing("numdev-bench")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    with open_dict(cfg):
        cfg.experiment_name = cfg.name
        cfg.overrides = list(hydra_cfg.overrides.task)
    if cfg.get("threads") is not None:
        torch.set_num_threads(int(cfg.threads))
    runner = instantiate(cfg.runner) if cfg.get("runner") is not None else run_bench
    records = runner(cfg)
    run_dir = Path(hydra_cfg.runtime.output_dir)
    results = run_dir / "results.jsonl"
    append_jsonl(results, records)
    print(f"{len(records)} records -> {results}")
    if cfg.get("figure") and hydra_cfg.mode == RunMode.RUN:  # a sweep draws its figure when it ends
        from numdev.bench.figures import announce, make_figure

        announce(cfg.figure, make_figure(cfg.figure, run_dir), run_dir)


if __name__ == "__main__":
    main()
