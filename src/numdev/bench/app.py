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
from numdev.bench.echo import settings_line
from numdev.bench.runner import run_bench
from numdev.config_schema import BENCH, validate
from numdev.errors import checked_overrides, user_facing
from numdev.provenance import provenance
from numdev.workers import stop_worker_pools


@checked_overrides("numdev-bench", "bench")
@hydra.main(config_path="pkg://numdev.conf", config_name="bench", version_base="1.3")
@user_facing("numdev-bench")
def run(cfg: DictConfig) -> None:
    validate(cfg, BENCH)  # every declared key's type and range (numdev.config_schema)
    hydra_cfg = HydraConfig.get()
    with open_dict(cfg):
        cfg.experiment_name = cfg.name
        cfg.overrides = list(hydra_cfg.overrides.task)
    job = hydra_cfg.job.num if hydra_cfg.mode.name == "MULTIRUN" else None
    print(settings_line(cfg, dict(hydra_cfg.runtime.choices), job), flush=True)
    if cfg.get("threads") is not None:
        torch.set_num_threads(int(cfg.threads))
    run_dir = Path(hydra_cfg.runtime.output_dir)
    results = run_dir / "results.jsonl"
    block = provenance(seeds=[int(s) for s in cfg.seeds])  # each record says where it was measured

    def write(records):
        append_jsonl(results, [{**record, "provenance": block} for record in records])

    if cfg.get("runner") is not None:  # a whole-grid experiment (numdev.figures.reconcile, bias): records at its end
        records = instantiate(cfg.runner)(cfg)
        write(records)
    else:
        # Each record is appended as soon as it is computed (one atomic append: concurrent runs sharing
        # the file keep every record), so a method that fails later loses none of the earlier ones.
        records = run_bench(cfg, emit=lambda record: write([record]))
    skipped = sum(r["kind"] == "skipped" for r in records)
    print(f"{len(records)} records -> {results}" + (f" ({skipped} skipped: not enough memory)" if skipped else ""))
    if cfg.get("figure") and hydra_cfg.mode == RunMode.RUN:  # a sweep draws its figure when it ends
        from numdev.bench.figures import announce, make_figure

        announce(cfg.figure, make_figure(cfg.figure, run_dir), run_dir)


def main() -> None:
    """The console script: the Hydra app (one run, or a -m sweep), then no worker process left behind."""
    try:
        run()
    finally:
        stop_worker_pools()


if __name__ == "__main__":
    main()
