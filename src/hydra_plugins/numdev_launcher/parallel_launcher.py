"""The Hydra plugin class of hydra/launcher=parallel (conf/hydra/launcher/parallel.yaml).

Hydra instantiates launchers only from the hydra_plugins package, and imports every module here at
start-up: this one stays light (numdev.cli.launcher is imported when a sweep launches).
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class ParallelLauncher(Launcher):
    def __init__(self, n_jobs: int = 2) -> None:
        self.n_jobs = n_jobs
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.task_function = task_function
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from numdev.cli.launcher import launch

        return launch(self, job_overrides, initial_job_idx)
