"""OmegaConf resolvers that numdev's configs use; registered when numdev is imported (numdev.conf
is a subpackage, so every way of composing a numdev config registers them first).

- `${numdev_run_id:}`: a token fixed for the life of this process, unique among processes started
  in the same second (process id + random bits). conf/hydra/default.yaml appends it to the
  one-second time stamp of default run directories, so processes started together never share one.
- `${numdev_gpus:${trainer.accelerator},${trainer.devices}}`: the GPUs a SLURM job asks for
  (conf/hydra/launcher/slurm.yaml): the trainer's devices on a GPU trainer, none (null)
  on a CPU one, so the same launcher works on a CPU partition without a gres configured.
- `${numdev_times:${study.lr},10}`: a number times a factor (a role that scales an experiment's
  setting, e.g. conf/train/study/lr_x10.yaml: the harm study's learning rate x10, whatever it is).
"""

from __future__ import annotations

import os
import secrets

from omegaconf import OmegaConf

RUN_ID = f"{os.getpid()}{secrets.token_hex(2)}"


GPU_ACCELERATORS = ("cuda", "gpu")


def gpus(accelerator, devices) -> int | None:
    """GPUs per node for a trainer: its device count on CUDA (1 where it is not a count), else None."""
    if str(accelerator) not in GPU_ACCELERATORS:
        return None
    return devices if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0 else 1


def times(value, factor) -> float:
    """value x factor, both numbers (a one-line error naming them otherwise)."""
    for name, x in (("value", value), ("factor", factor)):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"numdev_times: {name} {x!r} is not a number")
    return float(value) * float(factor)


def register() -> None:
    if not OmegaConf.has_resolver("numdev_run_id"):
        OmegaConf.register_new_resolver("numdev_run_id", lambda: RUN_ID)
    if not OmegaConf.has_resolver("numdev_gpus"):
        OmegaConf.register_new_resolver("numdev_gpus", gpus)
    if not OmegaConf.has_resolver("numdev_times"):
        OmegaConf.register_new_resolver("numdev_times", times)
