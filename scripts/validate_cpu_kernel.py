"""How closely the emulator models PyTorch's CPU flash kernel (sdpa_flash) on bf16 inputs,
compared with the paper-style bf16 baseline. Prints JSON.

    python scripts/validate_cpu_kernel.py
"""

from __future__ import annotations

import json

import torch

from numdev.attention import Baseline, FlashEmulated, build_backend
from numdev.numerics import stage_formats

SHAPES = [(2, 3, 256, 256, 64, False), (1, 4, 1000, 1000, 64, True), (2, 2, 700, 300, 64, False),
          (1, 2, 130, 1500, 32, True), (1, 2, 4096, 4096, 64, False)]


def main() -> None:
    rows = []
    for batch, heads, n_q, n_k, dim, causal in SHAPES:
        g = torch.Generator().manual_seed(0)
        q = torch.randn(batch, heads, n_q, dim, generator=g).bfloat16()
        k, v = (torch.randn(batch, heads, n_k, dim, generator=g).bfloat16() for _ in range(2))
        kernel = build_backend("sdpa_flash")(q, k, v, causal=causal).double()
        emulated = FlashEmulated(stage_formats("cpu_sdpa", "bf16"), tile_rule="cpu_sdpa")(q, k, v, causal=causal).double()
        baseline = Baseline(stage_formats("paper", "bf16"))(q, k, v, causal=causal).double()
        emu_gap, base_gap = (emulated - kernel).abs(), (baseline - kernel).abs()
        rows.append({
            "shape": [batch, heads, n_q, n_k, dim], "causal": causal,
            "emulator_vs_kernel_mean_abs": float(emu_gap.mean()), "baseline_vs_kernel_mean_abs": float(base_gap.mean()),
            "mean_ratio": float(base_gap.mean() / emu_gap.mean()),
            "emulator_vs_kernel_max_abs": float(emu_gap.max()), "baseline_vs_kernel_max_abs": float(base_gap.max()),
            "bit_identical_fraction": float((emulated == kernel).double().mean()),
        })
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "shapes": rows}, indent=2))


if __name__ == "__main__":
    main()
