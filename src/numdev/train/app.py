"""numdev-train: the Hydra app of the training study (phase 2). One run = one run directory.

    numdev-train                                            dit_tiny on 32x32 shapes, CPU, minutes
    numdev-train attention=sdpa_flash precision=bf16-mixed
    numdev-train -m attention=baseline,sdpa_flash seed.init=0,1
    numdev-train hydra.run.dir=<run dir> resume=true        continue a run from checkpoints/last.ckpt

See docs/training.md and docs/run_layout.md.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from numdev.cli import logs
from numdev.cli.errors import RunFailed, user_facing
from numdev.cli.workers import console_script
from numdev.config.groups import unexpected_key
from numdev.config.preflight import checked_overrides
from numdev.train.sweep_checks import check_sweep

log = logging.getLogger("numdev.train.app")  # by name: also when run as python -m numdev.train.app


# torch and Lightning are imported when a run needs them, not before: `--help`, a misspelled key, an
# unknown option or a missing sibling.reference come back in about a second (scripts/bench_startup.py).
def check_config(cfg: DictConfig) -> None:
    """numdev.train.run.check_config, imported when a composed config is checked."""
    from numdev.train.run import check_config as check

    check(cfg)


@checked_overrides("numdev-train", "train", check_config, check_sweep)
@hydra.main(config_path="pkg://numdev.conf.train", config_name="train", version_base="1.3")
@user_facing("numdev-train", unexpected_key)
def run(cfg: DictConfig) -> None:
    from numdev.train.evaluation import agreement_text
    from numdev.train.run import train

    logs.setup(cfg.get("verbose"))
    run = train(cfg)
    if run.get("global_rank", 0) != 0:  # DDP: rank 0 reports
        return
    if run["status"] == "failed":  # non-finite values under callbacks.instability.policy=fail
        raise RunFailed(
            f"run failed: {run.get('error')}; {cfg.run_dir}/run.json says failed "
            "(callbacks.instability.policy=record only records non-finite values)"
        )
    if run["status"] == "stopped":
        said = f"run stopped at step {run['final_step']}: {run.get('stop_reason')}; {cfg.run_dir}/run.json says stopped"
        if not _in_a_sweep():
            raise RunFailed(said)
        # a learning-rate sweep's diverged run is one of its results: the sweep goes on, and the command exits 1 when
        # it ends, naming every stopped run (numdev.analysis.sweep_end.SweepEnd)
        log.warning("%s; the sweep goes on", said)
        return
    summary = f"{run['status']} at step {run['final_step']} -> {cfg.run_dir}"
    if run.get("eval", {}).get("scored"):
        e = run["eval"]
        summary += f"  (samples match their captions: {agreement_text(e)})"
    if run.get("stop_reason"):
        summary += f"  (stopped: {run['stop_reason']})"
    if run.get("already_finished"):
        summary = f"already finished at step {run['final_step']}: nothing to do -> {cfg.run_dir}"
    log.info(summary)


def _in_a_sweep() -> bool:
    """Whether this run is a job of a sweep (-m), whose other jobs should still run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def main() -> None:
    """numdev-train: the Hydra app, as a console script (numdev.cli.workers.console_script)."""
    console_script(run)


if __name__ == "__main__":
    main()
