"""How closely the Triton kernel agrees with flash_emulated (same tiles, formats, formula) and how
far both are from the golden value, over a grid of knobs and shapes. JSON lines on stdout.

    python scripts/triton_agreement.py                  # CPU: Triton's interpreter, fp32 and fp16 (~2 min)
    python scripts/triton_agreement.py --device cuda    # GPU: the compiled kernel, fp16 and bf16

Errors are max|difference| in units of eps(dtype) * max|reference|; `differ` is the fraction of
output elements that are not bit-identical to the emulator's. The kernel runs with exp2=False
(the emulator's formula) unless --exp2 is given.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import itertools
import json
import sys

import torch

from numdev.attention import FlashEmulated, golden_attention
from numdev.cli.script_args import ScriptParser, run_script
from numdev.cli.script_args import seed as seed_type
from numdev.kernels import flash_attention as fa
from numdev.numerics.stages import stage_formats

_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def main(argv=None) -> int:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--exp2", action="store_true", help="run the kernel with exp2 (FA2's formula)")
    parser.add_argument("--seed", type=seed_type, default=0)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("triton_agreement: error: --device cuda needs a CUDA GPU", file=sys.stderr)
        return 2
    interpret = args.device == "cpu"
    dtypes = (torch.float32, torch.float16) if interpret else (torch.float16, torch.bfloat16)
    shapes = ((100, 100), (70, 150), (150, 40)) if interpret else ((1000, 1000), (700, 1300), (1500, 400))
    tiles = ((32, 16), (16, 64)) if interpret else ((128, 64), (64, 128))
    knob_sets = (("fp32", "fp32"), ("input", "fp32"), ("fp32", "input"), ("input", "input"))
    worst: dict[tuple, dict] = {}
    gen = torch.Generator().manual_seed(args.seed)
    for dtype, variant, (stats, accum), causal, (n_q, n_k), (block_r, block_c) in itertools.product(
        dtypes, ("fa2", "fa1"), knob_sets, (False, True), shapes, tiles
    ):
        q, k, v = (torch.randn(1, 2, n, 32 if interpret else 64, generator=gen) for n in (n_q, n_k, n_k))
        q, k, v = (t.to(device=args.device, dtype=dtype) for t in (q, k, v))
        knobs = fa.Knobs(block_m=block_r, block_n=block_c, variant=variant, stats=stats, accum=accum, exp2=args.exp2)
        out, _ = fa.forward(q, k, v, causal=causal, knobs=knobs, interpret=interpret)
        run = _NAMES[dtype]
        formats = stage_formats(
            "fa2", run, stats=run if stats == "input" else "fp32", accum=run if accum == "input" else "fp32"
        )
        emulated = FlashEmulated(formats, block_r=block_r, block_c=block_c, variant=variant)(q, k, v, causal=causal)
        golden = golden_attention(q, k, v, causal=causal)
        unit = torch.finfo(dtype).eps * golden.abs().max().item()
        row = worst.setdefault(
            (run, variant, stats, accum), {"vs_emulator": 0.0, "differ": 0.0, "kernel_vs_golden": 0.0, "emulator_vs_golden": 0.0}
        )
        row["vs_emulator"] = max(row["vs_emulator"], (out.double() - emulated.double()).abs().max().item() / unit)
        row["differ"] = max(row["differ"], (out != emulated.to(dtype)).double().mean().item())
        row["kernel_vs_golden"] = max(row["kernel_vs_golden"], (out.double() - golden).abs().max().item() / unit)
        row["emulator_vs_golden"] = max(row["emulator_vs_golden"], (emulated.double() - golden).abs().max().item() / unit)
    for (run, variant, stats, accum), row in worst.items():
        record = {"dtype": run, "variant": variant, "stats": stats, "accum": accum, "exp2": args.exp2}
        record.update({key: round(value, 4) for key, value in row.items()})
        print(json.dumps(record))
    return 0


if __name__ == "__main__":
    run_script(main)
