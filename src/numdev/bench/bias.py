"""The runner of experiment=bias: for each N and seed, Flash with every stage rounded, Baseline, and
Flash with one stage (or numdev.figures.bias.PAIR_LABEL's two) rounded and the rest in fp64; the
figure (numdev.figures.bias) attributes the mean signed error to stages."""

from __future__ import annotations

import time
from dataclasses import asdict

import torch

from numdev.attention import Baseline, FlashEmulated, golden_attention
from numdev.bench.inputs import GENERATORS, Shape
from numdev.bench.metrics import deviation
from numdev.bench.runner import warn_nonfinite
from numdev.figures.bias import PAIR_LABEL, STAGES
from numdev.numerics.formats import stream_seed
from numdev.numerics.stages import stage_formats


def single_stage(stage: str, precision: str, seed: int = 0):
    """Every stage in fp64 except `stage` (or 'stats+accum': both), which is in the run precision."""
    return stage_formats("paper", "fp64", seed=seed, **{s: precision for s in stage.split("+")})


class Sweep:
    """The numdev-bench runner of experiment=bias (conf/bench/experiment/bias.yaml)."""

    def __init__(self, inputs: str, variant: str, lengths, block_c: int = 64, block_r: int = 64):
        if inputs not in GENERATORS:
            raise ValueError(f"runner.inputs={inputs!r}: use one of {', '.join(GENERATORS)}")
        self.inputs, self.variant, self.lengths = inputs, variant, [int(n) for n in lengths]
        self.block_c, self.block_r = int(block_c), int(block_r)

    def __call__(self, cfg, log=print, emit=None) -> list[dict]:
        """The records; `emit(record)` gets each as soon as it is computed (numdev-bench appends it then)."""
        precision = str(cfg.numerics.precision)
        causal = bool(cfg.causal)
        records = []
        for n in self.lengths:
            shape = Shape(**{**cfg.shape, "seq_q": n, "seq_k": None})
            common = {"experiment": cfg.get("experiment_name"), "shape": asdict(shape), "causal": causal,
                      "precision": precision, "inputs": self.inputs, "variant": self.variant}
            for seed in (int(s) for s in cfg.seeds):
                stream = stream_seed(cfg.numerics.get("seed") or 0, seed)  # stochastic stages: each seed its own random integers
                q, k, v = GENERATORS[self.inputs](quantize=True)(shape, seed, stage_formats("paper", precision, seed=stream).input)
                golden = golden_attention(q, k, v, causal=causal)
                runs = {"whole": FlashEmulated(stage_formats("paper", precision, seed=stream), self.block_r, self.block_c, variant=self.variant),
                        "baseline": Baseline(stage_formats("paper", precision, seed=stream))}
                runs.update({s: FlashEmulated(single_stage(s, precision, stream), self.block_r, self.block_c, variant=self.variant)
                             for s in (*STAGES, PAIR_LABEL)})
                for label, backend in runs.items():
                    start = time.perf_counter()
                    with torch.no_grad():
                        out = backend(q, k, v, causal=causal)
                    metrics = deviation(out, golden)
                    warn_nonfinite(label, metrics, out.numel(), log)
                    records.append({**common, "kind": "vs_golden", "method": label, "seed": seed,
                                    "seconds": time.perf_counter() - start, "metrics": metrics})
                    if emit is not None:
                        emit(records[-1])
                log(f"N={n} seed {seed}: whole flash mean signed error {records[-len(runs)]['metrics']['mean_signed']:+.3e}")
        return records
