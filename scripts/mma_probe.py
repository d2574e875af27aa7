"""Measure how the GPU's tensor cores sum, bit for bit: one instruction, D = A B + C, against numdev's hypotheses.

FlashAttention-2's products are HMMA.16816.F32 (mma.sync m16n8k16: scripts/kernel_sass.py read them in its
machine code); each output is C + the sum of 16 products of 16-bit inputs, summed inside one instruction in a way
NVIDIA does not document. numdev's FA2 CUDA model has three hypotheses for it (`cuda_kernel.tensor_core_matmul`):
`aten` (a float32 matmul), `mma16` (the 16 products' exact sum added to C with one rounding to nearest) and
`mma16_rz` (C and the products aligned to the largest with 25 bits kept, cut toward zero, the sum cut toward
zero). This script runs exactly one such instruction per case (a Triton kernel of one 16 x 16 by 16 x 8 dot with
the accumulator as its C operand: HMMA.16816.F32 and nothing else, compiled and checked for sm_90 here), and
also Hopper's HGMMA.64x16x16 (wgmma: what cuBLAS and Triton's own large tiles use), on inputs whose exact sums
span up to 2^28 (so that alignment and rounding show) and are exact in float64. It reports per dtype and
instruction each hypothesis's share of bit-identical outputs and the ulp distances, and keeps the outputs
(--out-arrays; the inputs regenerate from the seed). On the CPU (--device cpu) torch's float32
matmul stands in for the instruction: a rehearsal of the code paths, not a measurement. The arrays keep each
output's distance in ulps from the correctly rounded exact sum (int32), from which the output is recovered.

    python scripts/mma_probe.py --out mma.json --out-arrays mma.npz              # on a GPU
    python scripts/mma_probe.py --device cpu --cases 64 --out /tmp/mma.json       # here: a rehearsal
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import functools
import json
import sys
import time

import numpy as np
import torch

from numdev.attention.cuda_kernel import tensor_core_matmul
from numdev.cli.script_args import ScriptParser, at_least, run_script
from numdev.numerics.formats import float32_ulps
from numdev.runs.atomic import write_npz, write_text
from numdev.runs.provenance import provenance

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# instruction: (rows, cols, warps) of the one dot a case is; K = 16, one instruction's depth
SHAPES = {"hmma": (16, 8, 1), "hgmma": (64, 16, 4)}
K = 16
HYPOTHESES = ("aten", "mma16", "mma16_rz")


def inputs(precision: str, instruction: str, cases: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A (cases, M, 16) and B (cases, 16, N) in `precision`, C (cases, M, N) float32: signs random, magnitudes
    log-uniform (A and B in [2^-6, 2^6), C in [2^-16, 2^16)), so a case's terms span up to 2^28 and every sum is
    exact in float64; from torch's CPU generator seeded `seed`, alike wherever it runs."""
    rows, cols, _ = SHAPES[instruction]
    generator = torch.Generator().manual_seed(seed)

    def draw(shape, low, high):
        sign = torch.randint(0, 2, shape, generator=generator) * 2 - 1
        return sign * torch.exp2(torch.rand(shape, generator=generator, dtype=torch.float64) * (high - low) + low)

    a = draw((cases, rows, K), -6, 6).to(DTYPES[precision])
    b = draw((cases, K, cols), -6, 6).to(DTYPES[precision])
    c = draw((cases, rows, cols), -16, 16).to(torch.float32)
    return a, b, c


@functools.lru_cache(maxsize=1)
def kernel():
    """The Triton kernel: D = dot(A, B, C) for one case per program, C the instruction's accumulator operand."""
    import triton
    import triton.language as tl

    @triton.jit
    def mma_kernel(A, B, C, D, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        case = tl.program_id(0)
        rm, rn, rk = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
        a = tl.load(A + case * BM * BK + rm[:, None] * BK + rk[None, :])
        b = tl.load(B + case * BK * BN + rk[:, None] * BN + rn[None, :])
        c = tl.load(C + case * BM * BN + rm[:, None] * BN + rn[None, :])
        tl.store(D + case * BM * BN + rm[:, None] * BN + rn[None, :], tl.dot(a, b, c))

    return mma_kernel


def run(instruction: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, device: str) -> torch.Tensor:
    """D per case: the instruction on CUDA, torch's float32 matmul on the CPU (the rehearsal's stand-in)."""
    if device == "cpu":
        return torch.baddbmm(c, a.float(), b.float())
    rows, cols, warps = SHAPES[instruction]
    a, b, c = (t.contiguous().to(device) for t in (a, b, c))
    d = torch.empty_like(c)
    kernel()[(a.shape[0],)](a, b, c, d, BM=rows, BN=cols, BK=K, num_warps=warps)
    torch.cuda.synchronize()
    return d.cpu()


def measure(precision: str, instruction: str, cases: int, seed: int, device: str) -> tuple[dict, np.ndarray]:
    """One dtype and instruction: the summary, and each output's distance in ulps from the correctly rounded exact
    sum (int32: D is that sum moved by it, exactly)."""
    cases = cases if instruction == "hmma" else max(1, cases // 8)  # HGMMA's 64 x 16 outputs: 8x HMMA's per case
    a, b, c = inputs(precision, instruction, cases, seed)
    started = time.perf_counter()
    d = run(instruction, a, b, c, device)
    seconds = time.perf_counter() - started
    exact = torch.baddbmm(c.double(), a.double(), b.double()).float()  # the sum exact in float64, then rounded once
    from_exact = float32_ulps(d, exact)
    summary = {"outputs": int(d.numel()), "seconds": round(seconds, 3), "hypotheses": {},
               "vs_correctly_rounded_ulps_max": int(from_exact.abs().max())}
    for hypothesis in HYPOTHESES:
        expected = tensor_core_matmul(a.float(), b.float(), c, hypothesis)
        distance = float32_ulps(d, expected)
        values, counts = torch.unique(distance.clamp(-3, 3), return_counts=True)
        summary["hypotheses"][hypothesis] = {"bit_identical": float((distance == 0).double().mean()),
                                             "ulps_clamped_to_3": {str(int(v)): int(n) for v, n in zip(values, counts)},
                                             "max_abs_ulps": int(distance.abs().max())}
    return summary, from_exact.to(torch.int32).numpy()


def main(argv=None) -> int:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cases", type=at_least(8), default=2048,
                        help="HMMA dots per dtype (default 2048: 262144 outputs); HGMMA gets an eighth, as many outputs")
    parser.add_argument("--seed", type=at_least(0), default=0)
    parser.add_argument("--out", default=None, help="also write the JSON summary here")
    parser.add_argument("--out-arrays", default=None, help="each output's ulps from the correctly rounded sum (int32), .npz")
    args = parser.parse_args(argv)
    if args.cases > 8192:
        parser.error(f"--cases {args.cases}: at most 8192 (the arrays come back from the GPU machine: 16 MiB a file)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "mma_probe: error: --device cuda but no CUDA GPU here; --device cpu rehearses the code paths\n")
    report = {"what": "one tensor-core instruction (D = A B + C) against numdev's hypotheses of its sums, bit for bit",
              "device": args.device, "rehearsal": args.device == "cpu", "cases": args.cases, "seed": args.seed,
              "instructions": {"hmma": "HMMA.16816.F32 (mma.sync m16n8k16), one per case",
                               "hgmma": "HGMMA.64x16x16.F32 (wgmma), one per case, an eighth of the cases"},
              "sets": {}, "provenance": provenance(seeds=[args.seed])}
    arrays = {}
    for precision in DTYPES:
        for instruction in SHAPES:
            name = f"{instruction}_{precision}"
            report["sets"][name], arrays[name] = measure(precision, instruction, args.cases, args.seed, args.device)
            shares = {h: round(e["bit_identical"], 6) for h, e in report["sets"][name]["hypotheses"].items()}
            print(f"mma_probe: {name}: bit-identical share per hypothesis {shares}", file=sys.stderr, flush=True)
    if args.out_arrays:
        report["arrays"] = {"file": str(args.out_arrays), "bytes": write_npz(args.out_arrays, arrays)}
    text = json.dumps(report, indent=1)
    if args.out:
        write_text(args.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    run_script(main)
