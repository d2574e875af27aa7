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
from numdev.bench import memory
from numdev.bench.inputs import Shape
from numdev.bench.metrics import deviation
from numdev.config.schema import BENCH, validate
from numdev.numerics.stages import StageFormats, round_input
from numdev.runs.provenance import gib


def run_bench(cfg: DictConfig, log=print, emit=None) -> list[dict]:
    """Records (dicts) of one run: one per method per seed against the golden, one per pair.

    `emit(record)` is called with each record as soon as it is computed (numdev-bench appends it to
    results.jsonl then, so a later failure loses nothing). A method whose estimated peak memory
    (numdev.bench.memory) exceeds memory_limit_gb (null: the memory available now) is not run: its
    record is `"kind": "skipped"` with the reason, and so are the pairs that involve it.
    """
    shape, formats, generator, methods, pairs = _build(cfg)

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
    limit = memory.limit_bytes(cfg.get("memory_limit_gb"))
    base = memory.inputs_and_golden_bytes(shape)
    if limit is not None and base > limit:
        raise ValueError(
            f"shape {shape.batch}x{shape.heads}x{shape.seq_q}x{shape.dim}: the inputs and the FP64 golden value alone need "
            f"~{gib(base)}, more than the {gib(limit)} available (memory_limit_gb): use a smaller shape"
        )
    records = []

    def add(record: dict) -> None:
        records.append(record)
        if emit is not None:
            emit(record)

    for seed in cfg.seeds:
        for stochastic in (formats, *(getattr(m, "formats", None) for m in methods.values())):
            if isinstance(stochastic, StageFormats):
                stochastic.reseed(int(seed))  # each seed's random integers (stochastic stages) its own stream
        q, k, v = generator(shape, int(seed), formats.input)
        _check_inputs(q, k, v, formats)
        golden = golden_attention(q, k, v, causal=cfg.causal)
        outputs, skipped = {}, {}
        for label, method in methods.items():
            need = base + memory.method_bytes(method, shape)
            if limit is not None and need > limit:
                skipped[label] = (
                    f"estimated peak memory {gib(need)} exceeds the {gib(limit)} available (memory_limit_gb)"
                )
                add({**common, "kind": "skipped", "method": label, "seed": int(seed), "reason": skipped[label],
                     "estimated_bytes": need, "limit_bytes": limit, "knobs": method.describe()})
                log(f"seed {seed} {label:>12} skipped: {skipped[label]}")
                continue
            start = time.perf_counter()
            with torch.no_grad():
                outputs[label] = method(q, k, v, causal=cfg.causal)
            seconds = time.perf_counter() - start
            metrics = deviation(outputs[label], golden)
            add(
                {**common, "kind": "vs_golden", "method": label, "seed": int(seed), "seconds": seconds,
                 "knobs": method.describe(), "metrics": metrics}
            )
            log(f"seed {seed} {label:>12} vs golden: max {metrics['max_abs']:.3e}  rmse {metrics['rmse']:.3e}  ({seconds:.2f} s)")
            warn_nonfinite(label, metrics, outputs[label].numel(), log)
        for a, b in pairs:
            if a in skipped or b in skipped:
                add({**common, "kind": "skipped", "method": f"{a}-{b}", "a": a, "b": b, "seed": int(seed),
                     "reason": f"{a if a in skipped else b} was skipped: {skipped.get(a) or skipped[b]}"})
                continue
            metrics = deviation(outputs[a], outputs[b])
            add(
                {**common, "kind": "pair", "method": f"{a}-{b}", "a": a, "b": b, "seed": int(seed),
                 "knobs": {"a": methods[a].describe(), "b": methods[b].describe()}, "metrics": metrics}
            )
            log(f"seed {seed} {a} vs {b}: max {metrics['max_abs']:.3e}  mean {metrics['mean_abs']:.3e}")
    return records


def check_config(cfg: DictConfig) -> None:
    """Every value a run reads is valid: the schema's types and ranges, then what the run builds
    from them (formats, inputs, methods, pairs). Called on every job before a sweep starts (numdev.config.preflight)."""
    validate(cfg, BENCH)
    if cfg.get("figure") is not None:  # drawn when the run or sweep ends (numdev.bench.sweep_end): refused now, not then
        from numdev.figures import get

        try:
            figure = get(str(cfg.figure))
        except ValueError as error:
            raise ValueError(f"figure={cfg.figure}: {error}") from None
        if figure.phase != "bench":
            raise ValueError(f"figure={cfg.figure} is made by the study (numdev-train experiment=flash_stability), "
                             "not from bench records: choose a bench figure (numdev-figure --list bench)")
    _build(cfg)


def _build(cfg: DictConfig):
    """The shape, number formats, input generator, methods and pairs of a run, each checked."""
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
    seeds = [int(s) for s in cfg.seeds]
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:  # a seed twice would be counted as two independent replicates of one measurement
        raise ValueError(f"seeds={seeds} lists {', '.join(map(str, twice))} more than once: each seed is one replicate; list each once")
    _check_methods_run_here(shape, formats, generator, methods)
    return shape, formats, generator, methods, pairs


def _check_methods_run_here(shape: Shape, formats, generator, methods: dict) -> None:
    """Every method can run on this machine with the run's inputs (device, dtype, head dim), checked on a
    one-token probe before the first record: a method that cannot run is refused now, not after the
    others' records were written."""
    probe = Shape(batch=1, heads=1, seq_q=1, seq_k=1, dim=shape.dim)
    q, _, _ = generator(probe, 0, formats.input)
    for label, method in methods.items():
        reason = method.unsupported_reason(q)
        if reason is not None:
            raise ValueError(f"methods.{label}: attention backend {method.name!r} cannot run here: {reason}; "
                             f"drop it (methods.{label}=null) or run on a machine that has it; nothing was computed")


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
