"""The numdev-bench runner of the matrix-product experiments (conf/bench/experiment/gemm_*.yaml).

For every K and seed: activations A (M x K) and weights B (K x N) drawn in float64 by the bench's
input generators (numdev.bench.inputs) and rounded to float32 (the operands of an FP32 model: what
torchao's casts and torch._scaled_mm see), the FP64 golden product of those float32 operands, then
every method (numdev.gemm.kernels) against it: one `vs_golden` record per method, K and seed. A
real kernel's record also says how many of its output bits equal its emulation's
(`metrics.bit_identical_to_model`, a fraction, with `metrics.max_abs_vs_model`).
"""

from __future__ import annotations

import time

import torch
from omegaconf import DictConfig, OmegaConf

from numdev.bench.inputs import GENERATORS
from numdev.bench.metrics import deviation
from numdev.bench.runner import warn_nonfinite
from numdev.gemm.emulated import emulated_matmul
from numdev.gemm.golden import golden_matmul
from numdev.gemm.kernels import method


class Sweep:
    def __init__(self, methods, ks, m: int = 32, n: int = 32, activations=None, weights=None):
        self.methods = _plain(methods)
        self.labels = [label for label, spec in self.methods.items() if spec is not None]
        if not self.labels:
            raise ValueError("runner.methods is empty: name at least one method (label: {kind: ..., ...})")
        for label in self.labels:  # an unknown kind or field fails here, before anything runs
            method(**self.methods[label])
        self.ks = [int(k) for k in ks]
        if not self.ks or min(self.ks) < 1 or min(m, n) < 1:
            raise ValueError(f"runner.ks={self.ks}, m={m}, n={n}: give positive sizes")
        self.m, self.n = int(m), int(n)
        self.activations = _generator(activations or {"generator": "normal"}, "activations")
        self.weights = _generator(weights or {"generator": "normal"}, "weights")

    @staticmethod
    def settings(runner) -> str:
        """The job's settings in one line (numdev.bench.echo), from the runner's config."""
        methods = [label for label, spec in (runner.get("methods") or {}).items() if spec is not None]
        return (f"gemm M{runner.get('m')} N{runner.get('n')} K {list(runner.get('ks') or [])} | "
                f"activations {dict(runner.get('activations') or {})} | methods {', '.join(methods)}")

    def __call__(self, cfg, log=print, emit=None) -> list[dict]:
        records = []
        for k in self.ks:
            shape = {"m": self.m, "k": k, "n": self.n}
            for seed in (int(s) for s in cfg.seeds):
                a, b = self.operands(k, seed)
                golden = golden_matmul(a, b)
                common = {"experiment": cfg.get("experiment_name"), "shape": shape, "seed": seed,
                          "inputs": {"activations": self.activations.describe(), "weights": self.weights.describe()}}
                for label in self.labels:
                    m = method(**self.methods[label])
                    start = time.perf_counter()
                    with torch.no_grad():
                        out = m(a, b)
                    seconds = time.perf_counter() - start
                    metrics = deviation(out, golden)
                    metrics["max_abs_relative"] = metrics["max_abs"] / float(golden.abs().max())
                    if m.kind != "emulated":
                        model = emulated_matmul(a, b, m.model).to(out.dtype)
                        metrics["bit_identical_to_model"] = float((out == model).double().mean())
                        metrics["max_abs_vs_model"] = float((out.double() - model.double()).abs().max())
                    warn_nonfinite(label, metrics, out.numel(), log)
                    records.append({**common, "kind": "vs_golden", "method": label, "seconds": seconds,
                                    "knobs": m.describe(), "model": m.model.describe(), "metrics": metrics})
                    if emit is not None:
                        emit(records[-1])
                log(f"K={k} seed {seed}: " + ", ".join(f"{r['method']} {r['metrics']['max_abs']:.2e}" for r in records[-len(self.labels):]))
        return records

    def operands(self, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A (M, K) and B (K, N) in float32, from one seeded generator per seed and K."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + k)
        a = self.activations.draw(self.m * k, g).view(self.m, k)
        b = self.weights.draw(k * self.n, g).view(k, self.n)
        return a.float(), b.float()


def _plain(node):
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def _generator(spec, where: str):
    spec = dict(_plain(spec))
    name = spec.pop("generator", "normal")
    if name not in GENERATORS:
        raise ValueError(f"runner.{where}.generator={name!r}: use one of {', '.join(GENERATORS)}")
    return GENERATORS[name](quantize=False, **spec)
