"""Measure the GPU's MUFU.EX2 and MUFU.LG2, bit for bit, on the inputs FlashAttention gives them.

numdev's FA2 CUDA model computes everything around the multi-function unit as the kernels' machine code does
(scripts/kernel_sass.py) but takes MUFU.EX2 and MUFU.LG2 (PTX's ex2.approx and lg2.approx, within 2 ulp) as
correctly rounded functions. This script runs the two instructions alone (a Triton kernel of one inline-PTX
instruction each: `ex2.approx.ftz.f32`, `lg2.approx.ftz.f32`, which are MUFU.EX2 and MUFU.LG2 without exp2f's
and __logf's guards for subnormals) on:

  ex2_binade   every float32 in (-1, -0.5]            (2^23: one binade whole, for a table model)
  ex2_random   float32 drawn uniformly over the bit patterns of (-126, 0)  (P's exponents: S c - m c <= 0)
  lg2_binade   every float32 in [1, 2)                 (2^23)
  lg2_random   float32 drawn uniformly over the bit patterns of [1, 2^24)  (a row sum l >= 1)

and keeps, per input, the output's distance in float32 ulps from the correctly rounded value (int8; the
reference is float64 exp2/log2 rounded to float32, on the same device), in an .npz (--out-arrays) that
regenerates its inputs from their names and the seed, beside a JSON summary (--out): per set, the share of
outputs correctly rounded, the histogram of the distance and its largest. On the CPU (--device cpu) the
same code paths run with torch's float32 exp2 and log2 in the instructions' place: a rehearsal, not a
measurement (Triton's interpreter runs no inline PTX).

    python scripts/mufu_probe.py --out mufu.json --out-arrays mufu.npz          # on a GPU
    python scripts/mufu_probe.py --device cpu --size 16 --random-size 14 --out /tmp/m.json    # here: a rehearsal
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import functools
import json
import sys
import time

import numpy as np
import torch

from numdev.cli.script_args import ScriptParser, at_least, run_script
from numdev.numerics.formats import float32_ulps
from numdev.runs.atomic import write_npz, write_text
from numdev.runs.provenance import provenance

INSTRUCTIONS = {"ex2": "ex2.approx.ftz.f32 $0, $1;", "lg2": "lg2.approx.ftz.f32 $0, $1;"}
BINADES = {"ex2": (-1.0, -0.5), "lg2": (1.0, 2.0)}  # [a, b): every float32 in it
RANDOM_RANGES = {"ex2": (-126.0, 0.0), "lg2": (1.0, 2.0 ** 24)}  # uniform over the bit patterns of [a, b)
SETS = ("ex2_binade", "ex2_random", "lg2_binade", "lg2_random")


def bits_of(value: float) -> int:
    return int(torch.tensor(value, dtype=torch.float32).view(torch.int32))


def inputs(name: str, size_log2: int, seed: int) -> torch.Tensor:
    """A set's float32 inputs on the CPU: a binade whole (its first 2^size_log2 when smaller than 2^23) or
    2^size_log2 drawn from torch's CPU generator seeded `seed`; regenerated alike wherever it runs."""
    function, kind = name.split("_")
    if kind == "binade":
        low, high = sorted(bits_of(v) for v in BINADES[function])  # negatives: larger magnitude, larger bits
        count = min(high - low, 1 << size_log2)
        patterns = torch.arange(low, low + count, dtype=torch.int64)
    else:
        low, high = sorted(bits_of(v) for v in RANDOM_RANGES[function])
        if function == "ex2":
            low, high = bits_of(-0.0) + 1, bits_of(-126.0) + 1  # (-126 .. 0): sign bit set, up to 126's pattern
        generator = torch.Generator().manual_seed(seed)
        patterns = torch.randint(low, high, (1 << size_log2,), generator=generator, dtype=torch.int64)
    return patterns.to(torch.int32).view(torch.float32)


def correctly_rounded(function: str, x: torch.Tensor) -> torch.Tensor:
    wide = x.double()
    return (torch.exp2(wide) if function == "ex2" else torch.log2(wide)).to(torch.float32)


@functools.lru_cache(maxsize=1)
def kernel():
    """The Triton kernel: Y = ASM(X) elementwise, ASM one inline-PTX instruction on a float32 register."""
    import triton
    import triton.language as tl

    @triton.jit
    def mufu_kernel(X, Y, n, BLOCK: tl.constexpr, ASM: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(X + offsets, mask=mask, other=1.0)
        y = tl.inline_asm_elementwise(ASM, "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
        tl.store(Y + offsets, y, mask=mask)

    return mufu_kernel


def instruction(function: str, device: str):
    """x (float32, on `device`) -> the instruction's output: the Triton kernel on CUDA, torch's float32 on the CPU."""
    if device == "cpu":
        return torch.exp2 if function == "ex2" else torch.log2

    def run(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        kernel()[(-(-x.numel() // 1024),)](x, y, x.numel(), BLOCK=1024, ASM=INSTRUCTIONS[function])
        return y

    return run


def measure(name: str, size_log2: int, seed: int, device: str) -> tuple[dict, np.ndarray]:
    """One set: its summary and each input's distance in ulps (int8, clamped to +-127, which is counted)."""
    function = name.split("_")[0]
    x = inputs(name, size_log2, seed).to(device)
    started = time.perf_counter()
    found = instruction(function, device)(x)
    reference = correctly_rounded(function, x)
    if device == "cuda":
        torch.cuda.synchronize()
    distance = float32_ulps(found, reference).cpu()
    values, counts = torch.unique(distance, return_counts=True)
    summary = {"inputs": int(x.numel()), "instruction": INSTRUCTIONS[function] if device == "cuda" else f"torch.{'exp2' if function == 'ex2' else 'log2'} (a CPU rehearsal)",
               "correctly_rounded": float((distance == 0).double().mean()),
               "histogram_ulps": {str(int(v)): int(c) for v, c in zip(values, counts)},
               "max_abs_ulps": int(distance.abs().max()), "beyond_int8": int((distance.abs() > 127).sum()),
               "seconds": round(time.perf_counter() - started, 3)}
    return summary, distance.clamp(-127, 127).to(torch.int8).numpy()


def main(argv=None) -> int:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", type=at_least(4), default=23, help="log2 of a binade set's inputs (default 23: the binade whole)")
    parser.add_argument("--random-size", type=at_least(4), default=21, help="log2 of a random set's inputs (default 21)")
    parser.add_argument("--seed", type=at_least(0), default=0, help="the random sets' generator seed")
    parser.add_argument("--out", default=None, help="also write the JSON summary here")
    parser.add_argument("--out-arrays", default=None, help="the distances per input, int8, compressed .npz")
    args = parser.parse_args(argv)
    if args.size > 23:
        parser.error(f"--size {args.size}: at most 23 (a binade holds 2^23 float32)")
    if args.random_size > 24:
        parser.error(f"--random-size {args.random_size}: at most 24 (the arrays come back from the GPU machine: 16 MiB a file)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "mufu_probe: error: --device cuda but no CUDA GPU here; --device cpu rehearses the code paths\n")
    report = {"what": "MUFU.EX2 and MUFU.LG2 against correctly rounded float32 (ulps), per input set",
              "device": args.device, "rehearsal": args.device == "cpu", "size_log2": args.size,
              "random_size_log2": args.random_size, "seed": args.seed,
              "sets": {}, "provenance": provenance(seeds=[args.seed])}
    arrays = {}
    for name in SETS:
        size = args.size if name.endswith("binade") else args.random_size
        report["sets"][name], arrays[name] = measure(name, size, args.seed, args.device)
        print(f"mufu_probe: {name}: {report['sets'][name]['correctly_rounded']:.6f} correctly rounded, "
              f"{report['sets'][name]['histogram_ulps']}", file=sys.stderr, flush=True)
    if args.out_arrays:
        report["arrays"] = {"file": str(args.out_arrays), "bytes": write_npz(args.out_arrays, arrays)}
    text = json.dumps(report, indent=1)
    if args.out:
        write_text(args.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    run_script(main)
