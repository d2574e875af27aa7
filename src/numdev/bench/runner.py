"""One microbenchmark run: identical inputs through every method, each compared with the FP64
golden value and with its paired method."""

from __future__ import annotations

import time
from dataclasses import asdict

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from numdev.attention import golden_attention
from numdev.attention.checks import count_nonfinite
from numdev.bench.inputs import Shape
from numdev.bench.metrics import deviation
from numdev.numerics import round_input


def run_bench(cfg: DictConfig, log=print) -> list[dict]:
    """Records (dicts) of one run: one per method per seed against the golden, one per pair."""
    shape = Shape(**cfg.shape)
    formats = instantiate(cfg.numerics)
    generator = instantiate(cfg.inputs)
    methods = {label: instantiate(node) for label, node in cfg.methods.items() if node is not None}
    pairs = [tuple(pair) for pair in cfg.pairs]
    for pair in pairs:
        missing = [label for label in pair if label not in methods]
        if len(pair) != 2 or missing:
            raise ValueError(f"pair {list(pair)} must name two of the methods {', '.join(methods)}")
    if not cfg.seeds:
        raise ValueError("seeds is empty: give at least one seed, e.g. seeds=[0]")

    common = {
        "experiment": cfg.get("experiment_name"),
        "shape": asdict(shape),
        "causal": bool(cfg.causal),
        "inputs": generator.describe(),
        "numerics": formats.describe(),
        "tiles": dict(cfg.get("tiles") or {}),
        "variant": cfg.get("variant"),
        "setting": cfg.get("setting_name"),
        "overrides": list(cfg.get("overrides") or []),
    }
    records = []
    for seed in cfg.seeds:
        q, k, v = generator(shape, int(seed), formats.input)
        _check_inputs(q, k, v, formats)
        golden = golden_attention(q, k, v, causal=cfg.causal)
        outputs = {}
        for label, method in methods.items():
            start = time.perf_counter()
            with torch.no_grad():
                outputs[label] = method(q, k, v, causal=cfg.causal)
            seconds = time.perf_counter() - start
            metrics = deviation(outputs[label], golden)
            records.append(
                {**common, "kind": "vs_golden", "method": label, "seed": int(seed), "seconds": seconds,
                 "knobs": method.describe(), "metrics": metrics}
            )
            log(f"seed {seed} {label:>12} vs golden: max {metrics['max_abs']:.3e}  rmse {metrics['rmse']:.3e}  ({seconds:.2f} s)")
            warn_nonfinite(label, metrics, outputs[label].numel(), log)
        for a, b in pairs:
            metrics = deviation(outputs[a], outputs[b])
            records.append(
                {**common, "kind": "pair", "method": f"{a}-{b}", "a": a, "b": b, "seed": int(seed),
                 "knobs": {"a": methods[a].describe(), "b": methods[b].describe()}, "metrics": metrics}
            )
            log(f"seed {seed} {a} vs {b}: max {metrics['max_abs']:.3e}  mean {metrics['mean_abs']:.3e}")
    return records


def _check_inputs(q, k, v, formats) -> None:
    with torch.no_grad():
        rounded = {name: round_input(t, formats) for name, t in (("q", q), ("k", k), ("v", v))}
    bad = count_nonfinite(**rounded)
    if bad:
        counts = ", ".join(f"{name}: {n} of {rounded[name].numel()}" for name, n in bad.items())
        raise ValueError(
            f"inputs overflow the input format {formats.input.name} ({counts} values became inf/NaN): "
            "lower inputs.scale, or set numerics.input_scaling=tensor"
        )




def warn_nonfinite(label: str, metrics: dict, size: int, log=print) -> None:
    """Say loudly when an output holds NaN/Inf: its metrics cover only the finite values."""
    if metrics.get("nonfinite"):
        log(f"WARNING: {label}: {metrics['nonfinite']} of {size} output values are NaN/Inf; "
            "the metrics above use the finite ones only, and no claim is judged on this record")
