"""numdev-bench: the Hydra app of the microbenchmark. Each run appends its records to
results.jsonl in its run directory; a sweep is a Hydra multirun (-m)."""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from numdev.atomic import append_jsonl
from numdev.bench.echo import settings_line
from numdev.bench.runner import run_bench
from numdev.errors import checked_overrides, user_facing
from numdev.provenance import provenance


@checked_overrides("numdev-bench", "bench")
@hydra.main(config_path="pkg://numdev.conf", config_name="bench", version_base="1.3")
@user_facing("numdev-bench")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    with open_dict(cfg):
        cfg.experiment_name = cfg.name
        cfg.overrides = list(hydra_cfg.overrides.task)
    job = hydra_cfg.job.num if hydra_cfg.mode.name == "MULTIRUN" else None
    print(settings_line(cfg, dict(hydra_cfg.runtime.choices), job), flush=True)
    records = run_bench(cfg)
    block = provenance(seeds=[int(s) for s in cfg.seeds])
    records = [{**record, "provenance": block} for record in records]  # each record says where it was measured
    results = Path(hydra_cfg.runtime.output_dir) / "results.jsonl"
    append_jsonl(results, records)
    print(f"{len(records)} records -> {results}")


if __name__ == "__main__":
    main()
