"""How fast the flash emulator runs, against PyTorch's CPU flash kernel and the FP64 golden. JSON out.

    python scripts/bench_emulator.py                          # N = 1k, 4k, 16k; paper and fa2; 1 thread
    python scripts/bench_emulator.py --lengths 1024 --repeats 3 --out bench.json

For every N and preset it times, on the same bf16-valued inputs (batch 1, 1 head, d = 64, tiles
64 x 64, no mask):
  flash_kernel      torch SDPA with SDPBackend.FLASH_ATTENTION on bf16 tensors (the anchor)
  golden            numdev's FP64 golden attention (the other anchor)
  emulator          flash_emulated as sweeps run it (compile=True, query chunks)
  emulator_eager    the same without torch.compile
  before            the implementation before the speed work (tests/flash_reference.py)
and reports medians over repeats (wall clock and this thread's CPU time), each emulator path's
ratio to the flash kernel, and whether its outputs are bit-identical to `before`'s.
The thread count is pinned (torch.set_num_threads) and recorded with the machine. On a shared
machine only the thread-CPU-time ratios mean much; rerun on a quiet one for the numbers you quote.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine(threads: int) -> dict:
    import torch

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "torch_threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def timed(fn, repeats: int) -> tuple[dict, object]:
    """Medians over `repeats` calls after one warm-up call (which also compiles), and the last output."""
    out = fn()
    wall, cpu = [], []
    for _ in range(repeats):
        start_wall, start_cpu = time.perf_counter(), time.thread_time()
        out = fn()
        cpu.append(time.thread_time() - start_cpu)
        wall.append(time.perf_counter() - start_wall)
    return {"wall_s": statistics.median(wall), "thread_cpu_s": statistics.median(cpu),
            "wall_s_all": wall, "thread_cpu_s_all": cpu}, out


def same_bits(a, b) -> bool:
    import torch

    nan = torch.isnan(b)
    return bool(torch.equal(torch.isnan(a), nan) and torch.equal(a.masked_fill(nan, 0), b.masked_fill(nan, 0)))


def bench_length(n: int, presets, variant: str, dim: int, block: int, repeats: int, seed: int) -> dict:
    import torch
    import torch.nn.functional as F
    from flash_reference import reference_forward
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from numdev.attention import FlashEmulated, golden_attention
    from numdev.numerics import stage_formats

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, n, dim, generator=g).bfloat16() for _ in range(3))
    scale = dim**-0.5
    row = {"n": n}

    def flash_kernel():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, scale=scale)

    with torch.no_grad():
        row["flash_kernel"], _ = timed(flash_kernel, repeats)
        q64, k64, v64 = (t.double() for t in (q, k, v))
        row["golden"], _ = timed(lambda: golden_attention(q64, k64, v64, scale=scale), repeats)
        qf, kf, vf = (t.float() for t in (q, k, v))
        for preset in presets:
            formats = stage_formats(preset, "bf16")
            paths = {
                "emulator": FlashEmulated(formats, block_r=block, block_c=block, variant=variant, compile=True),
                "emulator_eager": FlashEmulated(formats, block_r=block, block_c=block, variant=variant),
            }
            cell = {}
            before_emulator = paths["emulator_eager"]
            cell["before"], before = timed(lambda e=before_emulator: reference_forward(e, qf, kf, vf, scale, False),
                                           repeats)
            for name, emulator in paths.items():
                cell[name], out = timed(lambda e=emulator: e(qf, kf, vf, scale=scale), repeats)
                cell[name]["bit_identical_to_before"] = same_bits(out, before)
            for name in ("before", *paths):
                for clock in ("wall_s", "thread_cpu_s"):
                    cell[name][f"ratio_to_flash_kernel_{clock}"] = cell[name][clock] / row["flash_kernel"][clock]
            row[preset] = cell
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--presets", nargs="+", default=["paper", "fa2"])
    parser.add_argument("--variant", default="fa2", choices=["fa2", "fa1"])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=64, help="B_r = B_c of the emulator")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (3 at N >= 16k)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    report = {
        "what": "flash emulator speed vs PyTorch's CPU flash kernel (bf16) and the FP64 golden",
        "machine": machine(torch.get_num_threads()),
        "shape": {"batch": 1, "heads": 1, "dim": args.dim, "causal": False},
        "precision": "bf16",
        "variant": args.variant,
        "tiles": {"block_r": args.block, "block_c": args.block},
        "seed": args.seed,
        "lengths": [],
    }
    for n in args.lengths:
        repeats = args.repeats if n < 16384 else min(args.repeats, 3)
        row = bench_length(n, args.presets, args.variant, args.dim, args.block, repeats, args.seed)
        row["repeats"] = repeats
        report["lengths"].append(row)
        summary = {p: round(row[p]["emulator"]["ratio_to_flash_kernel_thread_cpu_s"], 2) for p in args.presets}
        print(f"N={n}: emulator / flash kernel (thread CPU time) {summary}", file=sys.stderr, flush=True)
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
    main()
