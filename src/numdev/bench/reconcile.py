"""The runner of experiment=reconcile: the factorial grid of numdev.figures.reconcile, one record
per cell and seed (inputs x variant x stage formats x key/value blocks, the two Baselines and the
real kernels), all cells of one seed against one golden value in one process."""

from __future__ import annotations

import math
import time
from dataclasses import asdict

import torch

from numdev.attention import Baseline, FlashEmulated, SdpaFlash, golden_attention
from numdev.attention.tiles import resolve_tiles
from numdev.bench.inputs import GENERATORS, Shape
from numdev.bench.metrics import deviation
from numdev.bench.runner import warn_nonfinite
from numdev.figures.reconcile import PROMOTABLE
from numdev.numerics.stages import stage_formats

# The two Baselines, by the method name their records carry.
BASELINE_METHODS = {"baseline": "paper", "baseline_eager": "eager"}


def formats_for(name: str, precision: str):
    """'paper', 'fa2', or a promoted stage ('stats': the paper preset with stats in fp32)."""
    if name in ("paper", "fa2", "cpu_sdpa"):
        return stage_formats(name, precision)
    if name in PROMOTABLE:
        return stage_formats("paper", precision, **{name: "fp32"})
    raise ValueError(f"reconcile: unknown formats {name!r}: use paper, fa2 or one of {', '.join(PROMOTABLE)} (promoted to fp32)")


class Grid:
    """The numdev-bench runner of experiment=reconcile (conf/bench/experiment/reconcile.yaml)."""

    def __init__(self, inputs, variants, formats, kv_blocks, sram: int, block_r: int = 64, kernels: bool = True,
                 reference_kv_blocks: int = 64):
        self.inputs, self.variants, self.formats = list(inputs), list(variants), list(formats)
        self.kv_blocks, self.sram, self.block_r, self.kernels = [int(b) for b in kv_blocks], int(sram), int(block_r), kernels
        # The block count of the cells the sentences and verdict name (the paper-like and the fa2 cell).
        self.reference_kv_blocks = int(reference_kv_blocks)
        if self.reference_kv_blocks not in self.kv_blocks:
            raise ValueError(f"runner.reference_kv_blocks={reference_kv_blocks} must be one of runner.kv_blocks={self.kv_blocks}")
        unknown = [name for name in self.inputs if name not in GENERATORS]
        if unknown:
            raise ValueError(f"runner.inputs: unknown {unknown}: use {', '.join(GENERATORS)}")
        for name in self.formats:
            formats_for(name, "bf16")

    def tiles(self, n_k: int, dim: int):
        """(label, FlashEmulated tile kwargs, key/value blocks run): the pinned block counts, then FA1's SRAM rule."""
        for b in self.kv_blocks:
            kwargs = {"block_r": self.block_r, "kv_blocks": b, "tile_rule": "kv_blocks"}
            yield str(b), kwargs, _blocks_of(n_k, dim, **kwargs)
        kwargs = {"sram": self.sram, "tile_rule": "sram"}
        yield f"sram {self.sram}", kwargs, _blocks_of(n_k, dim, **kwargs)

    def __call__(self, cfg, log=print, emit=None) -> list[dict]:
        """The records; `emit(record)` gets each as soon as it is computed (numdev-bench appends it then)."""
        shape = Shape(**cfg.shape)
        precision = str(cfg.numerics.precision)
        causal = bool(cfg.causal)
        common = {"experiment": cfg.get("experiment_name"), "shape": asdict(shape), "causal": causal, "precision": precision,
                  "reference_tiles": str(self.reference_kv_blocks)}
        records = []

        def record(method, seed, cell, out, golden, seconds, knobs):
            metrics = deviation(out, golden)
            warn_nonfinite(f"{method} {cell}", metrics, out.numel(), log)
            records.append({**common, "kind": "vs_golden", "method": method, "seed": seed, "cell": cell,
                            "seconds": seconds, "knobs": knobs, "metrics": metrics})
            if emit is not None:
                emit(records[-1])
            return metrics

        def timed(backend, q, k, v):
            start = time.perf_counter()
            with torch.no_grad():
                out = backend(q, k, v, causal=causal)
            return out, time.perf_counter() - start

        n_k = shape.seq_k or shape.seq_q
        for seed in (int(s) for s in cfg.seeds):
            for name in self.inputs:
                base_formats = stage_formats("paper", precision)
                q, k, v = GENERATORS[name](quantize=True)(shape, seed, base_formats.input)
                golden = golden_attention(q, k, v, causal=causal)
                for method, preset in BASELINE_METHODS.items():
                    base = Baseline(stage_formats(preset, precision))
                    out, seconds = timed(base, q, k, v)
                    m = record(method, seed, {"inputs": name, "formats": preset}, out, golden, seconds, base.describe())
                    log(f"seed {seed} {name:>8} baseline ({preset}, {precision}): max {m['max_abs']:.3e}")
                if self.kernels:
                    for method, backend in (
                        ("cpu_sdpa", FlashEmulated(stage_formats("cpu_sdpa", precision), tile_rule="cpu_sdpa")),
                        ("sdpa_flash", SdpaFlash(dtype=precision)),
                    ):
                        out, seconds = timed(backend, q, k, v)
                        record(method, seed, {"inputs": name}, out, golden, seconds, backend.describe())
                for variant in self.variants:
                    for formats in self.formats:
                        for tile_label, tiles, blocks in self.tiles(n_k, shape.dim):
                            flash = FlashEmulated(formats_for(formats, precision), variant=variant, **tiles)
                            out, seconds = timed(flash, q, k, v)
                            cell = {"inputs": name, "variant": variant, "formats": formats, "tiles": tile_label, "kv_blocks": blocks}
                            record("flash", seed, cell, out, golden, seconds, flash.describe())
                    log(f"seed {seed} {name:>8} {variant}: {len(self.formats) * (len(self.kv_blocks) + 1)} cells done")
        return records


def _blocks_of(n_k: int, dim: int, **tiles) -> int:
    """How many key/value blocks a flash call with these tile kwargs runs over n_k keys."""
    t = resolve_tiles(n_k, n_k, dim, tiles.get("block_r"), tiles.get("block_c"), tiles.get("sram"),
                      tiles.get("tile_rule"), tiles.get("kv_blocks"))
    return math.ceil(n_k / t.block_c)
