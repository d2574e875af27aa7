"""Scale-out glue: the precision plugin FSDP needs, and the multi-process launches that cannot work.

The strategies themselves are Lightning's (conf/train/trainer/ddp_cpu.yaml, ddp_gpu.yaml, fsdp_gpu.yaml);
how the data and the noise split over ranks is in data/sampler.py and DiffusionModule.draw.
See docs/training.md#scale-out.
"""

from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import DictConfig


def precision_plugin(cfg: DictConfig):
    """The precision config's plugin; under FSDP, FSDPPrecision with the same precision (FSDP needs its own)."""
    plugin = instantiate(cfg.precision.plugin)
    strategy = cfg.trainer.get("strategy")
    target = strategy.get("_target_", "") if isinstance(strategy, DictConfig) else str(strategy or "")
    if "fsdp" not in target.lower():
        return plugin
    from lightning.pytorch.plugins.precision import FSDPPrecision

    if plugin.precision not in ("32-true", "16-mixed", "bf16-mixed", "bf16-true"):
        raise ValueError(f"precision={cfg.precision.name} does not run under FSDP: use fp32, bf16-mixed, fp16-mixed or bf16-true")
    return FSDPPrecision(plugin.precision)  # 16-mixed gets its ShardedGradScaler from Lightning


def check_launch(trainer) -> None:
    """Refuse the DDP launches that cannot work, before anything is written.

    With several devices and no cluster launcher (SLURM, torchrun), Lightning starts the other
    ranks by running the same command line again (with hydra.run.dir pinned to this run). In a
    Hydra multirun (-m) that would re-run the whole sweep in every rank, and without Hydra (train()
    called from Python) it would re-run whatever script called it.
    """
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    launcher = getattr(trainer.strategy, "launcher", None)
    if not isinstance(launcher, _SubprocessScriptLauncher) or launcher.num_processes < 2:
        return
    if launcher.cluster_environment.creates_processes_externally:  # a spawned rank, or SLURM / torchrun
        return
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        raise ValueError(
            f"trainer.strategy with {trainer.num_devices} devices starts its processes by re-running the command line: "
            "run it through numdev-train (or torchrun / SLURM), not train() from Python"
        )
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        raise ValueError(
            f"a -m sweep with trainer.devices={trainer.num_devices}: Lightning's DDP launcher would re-run the whole sweep "
            "in every process; use hydra/launcher=slurm (one task per device) or run each job without -m"
        )
