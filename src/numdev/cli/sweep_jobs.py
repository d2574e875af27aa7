"""A sweep that lists a value twice is refused before anything runs; a sweep run one job at a time says
how far it is.

`study.replicate=0,0` would run every job twice: the second copy runs in the first one's directory
(Hydra names a job's directory by its values), refused by the run lock at best, and at worst it
overwrites or kills a real run. A Hydra callback (conf/train/train.yaml, conf/bench/bench.yaml) checks the
sweep's values, from the command line and the config's hydra.sweeper.params, when the multirun
starts, before the sweep directory exists: one line naming the key.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from numdev.cli.errors import fail

log = logging.getLogger(__name__)


def duplicate_values(overrides: list[str]) -> str | None:
    """The first `key=a,b,...` sweep (the later of two for one key wins, as in Hydra's basic sweeper)
    that lists a value more than once: a one-line error, or None."""
    sweeps: dict[str, tuple[str, list[str]]] = {}
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.get_key_element()
        if override.is_sweep_override() and override.is_discrete_sweep():
            sweeps[key] = (override.input_line, list(override.sweep_string_iterator()))
        else:
            sweeps.pop(key, None)
    for key, (line, values) in sweeps.items():
        twice = [value for value, count in Counter(values).items() if count > 1]
        if twice:
            return (f"{line}: lists {', '.join(twice)} more than once, so the sweep would run the same job twice "
                    f"(in one directory): list each value of {key} once")
    return None


def _sweep_overrides(config: DictConfig) -> list[str] | None:
    """The basic sweeper's overrides (its params, then the command line's), or None for another sweeper."""
    sweeper = config.hydra.sweeper
    if "BasicSweeper" not in str(sweeper.get("_target_", "")):
        return None  # another sweeper (optuna, ...) chooses its own values
    params = sweeper.get("params") or {}
    params = OmegaConf.to_container(params) if isinstance(params, DictConfig) else dict(params)
    return [f"{key}={value}" for key, value in params.items()] + list(OmegaConf.to_container(config.hydra.overrides.task))


def job_count(overrides: list[str]) -> int:
    """How many jobs the basic sweeper makes of `overrides`: the product of every swept key's values (the
    later of two for one key wins)."""
    sizes: dict[str, int] = {}
    for override in OverridesParser.create().parse_overrides(overrides):
        sizes[override.get_key_element()] = len(list(override.sweep_string_iterator())) if override.is_sweep_override() else 1
    return math.prod(sizes.values())


class RefuseDuplicateJobs(Callback):
    def __init__(self, program: str):
        self.program = program

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        overrides = _sweep_overrides(config)
        problem = duplicate_values(overrides) if overrides is not None else None
        if problem:
            fail(self.program, problem)


class SweepProgress(Callback):
    """After each job of a sweep that Hydra's basic launcher runs one at a time, in this process: the same
    progress line as numdev's parallel launcher (numdev.cli.launcher.progress_line), which says it itself."""

    def __init__(self):
        self.total, self.started, self.job_started, self.seconds = None, None, None, []

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if "BasicLauncher" not in str(config.hydra.launcher.get("_target_", "")):
            return
        overrides = _sweep_overrides(config)
        try:
            self.total = job_count(overrides) if overrides is not None else None
        except Exception:  # noqa: BLE001 - an override Hydra will refuse itself, with its own message
            self.total = None
        self.started = time.monotonic()

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        self.job_started = time.monotonic()

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        if self.started is None or self.total is None or self.job_started is None:
            return
        from numdev.cli.launcher import progress_line

        self.seconds.append(time.monotonic() - self.job_started)
        log.info(progress_line(len(self.seconds), self.total, time.monotonic() - self.started, 1, self.seconds))
