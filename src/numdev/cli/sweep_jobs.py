"""A sweep that lists a value twice is refused before anything runs.

`study.replicate=0,0` would run every job twice: the second copy runs in the first one's directory
(Hydra names a job's directory by its values), refused by the run lock at best, and at worst it
overwrites or kills a real run. A Hydra callback (conf/train/train.yaml, conf/bench/bench.yaml) checks the
sweep's values, from the command line and the config's hydra.sweeper.params, when the multirun
starts, before the sweep directory exists: one line naming the key.
"""

from __future__ import annotations

from collections import Counter

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from numdev.cli.errors import fail


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


class RefuseDuplicateJobs(Callback):
    def __init__(self, program: str):
        self.program = program

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweeper = config.hydra.sweeper
        if "BasicSweeper" not in str(sweeper.get("_target_", "")):
            return  # another sweeper (optuna, ...) chooses its own values
        params = sweeper.get("params") or {}
        params = OmegaConf.to_container(params) if isinstance(params, DictConfig) else dict(params)
        overrides = [f"{key}={value}" for key, value in params.items()]
        overrides += list(OmegaConf.to_container(config.hydra.overrides.task))
        problem = duplicate_values(overrides)
        if problem:
            fail(self.program, problem)
