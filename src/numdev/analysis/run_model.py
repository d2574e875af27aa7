"""A run's model rebuilt from its config.yaml, ready to take any snapshot's weights: what offline
evaluations run on (numdev.analysis.function_level's loss barrier, numdev.analysis.ties).

    with rebuilt(run_dir) as run_model:
        run_model.load(load_snapshot(run_dir, step))
        result = run_model.heldout(run_model.heldout_dataset(64), seed=0, batch_size=64)

The model, optimization, precision, data and attention are the run's (attention="eager" swaps in
numdev.attention.Eager under the run's precision), built as numdev-train builds them, under the
run's thread count (sums split by thread differ); the held-out evaluation is the run's objective's,
as its held-out callback ran it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from numdev.attention import Eager
from numdev.runs import schemas
from numdev.runs.layout import RunDir
from numdev.train.distributed import precision_plugin
from numdev.train.run import build_model, build_module, build_optimization

ATTENTIONS = ("run", "eager")


def saved_config(run: RunDir) -> DictConfig:
    return OmegaConf.create(schemas.read_saved_config(run.config))


@contextlib.contextmanager
def torch_threads(count) -> Iterator[None]:
    """torch's thread count as the run had it (`threads`, checked by `rebuilt`), restored afterwards: sums split by thread differ."""
    if count is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(int(count))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@dataclass
class RunModel:
    run: RunDir
    config: DictConfig
    backend: object  # the attention backend every attention layer calls
    plugin: object  # the run's precision plugin (its forward_context)
    model: torch.nn.Module
    module: object  # the run's Lightning module (its objective's held-out evaluation)

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a snapshot's parameters into the model; its names must be exactly the model's."""
        parameters = dict(self.model.named_parameters())
        if set(parameters) != set(state):
            raise ValueError(f"{self.run.index}: the snapshot's parameters are not the model's of {self.run.config}")
        with torch.no_grad():
            for name, parameter in parameters.items():
                parameter.copy_(state[name])

    def heldout_dataset(self, count: int):
        data = instantiate(self.config.data)
        make = getattr(data, "heldout_dataset", None)
        if make is None:
            raise ValueError(f"{self.run.config}: data {type(data).__name__} has no held-out split: no held-out loss to evaluate")
        return make(count)

    def heldout(self, dataset, *, seed: int, batch_size: int):
        """The run's held-out evaluation of the loaded weights (numdev.train.callbacks.heldout.HeldOutResult)."""
        return self.module.heldout(dataset, seed=seed, batch_size=batch_size, forward_context=self.plugin.forward_context,
                                   keep_predictions=False)


@contextlib.contextmanager
def rebuilt(run_dir: str | Path, attention: str = "run", device: str = "cpu", config: DictConfig | None = None) -> Iterator[RunModel]:
    """The run's model (config: another run's config.yaml to build from, already read), inside the
    run's optimization and thread count."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention={attention!r}: use {' or '.join(ATTENTIONS)}")
    run = RunDir(run_dir)
    cfg = saved_config(run) if config is None else config
    optimization = build_optimization(cfg)
    threads = cfg.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"{run.config}: threads={threads!r} must be a positive integer or null: the saved config was edited")
    with optimization.active(), torch_threads(threads):
        backend = optimization.attention(instantiate(cfg.attention) if attention == "run" else Eager(precision=cfg.precision.name))
        plugin = precision_plugin(cfg)
        model = plugin.convert_module(optimization.model(build_model(cfg, backend))).to(device)
        module = build_module(cfg, model).to(device)  # the run's objective evaluates, as its held-out callback did
        yield RunModel(run, cfg, backend, plugin, model, module)
