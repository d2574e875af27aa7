"""The fp8_linear optimization's two GEMM routes side by side on this CPU: torch._scaled_mm (native)
and its CPU path's arithmetic in FP32 (fp32: numdev.optimizations.float8_linear). Prints JSON (and
writes it with --out): per operand pair and shape, the median seconds of each route, their ratio,
and the largest relative gap between the two results.

    python scripts/bench_fp8_gemm.py                  dit_study-sized products, 1 thread
    python scripts/bench_fp8_gemm.py --threads 2 --repeats 5 --out docs/results/bench_fp8_gemm.json

The two routes run in turn (round-robin, --repeats rounds), so load drifts hit both alike.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import statistics
import time

import torch

from numdev.cli.script_args import ScriptParser, run_script
from numdev.optimizations.float8_linear import E4M3, E5M2, scaled_mm, to_float8
from numdev.runs.atomic import write_json
from numdev.runs.provenance import provenance

# (M, K, N): a dit_study batch's tokens x a Linear's in and out features, and a larger product
SHAPES = ((640, 128, 128), (640, 128, 512), (2048, 256, 256))
PAIRS = {"e4m3 x e4m3 (forward)": (E4M3, E4M3), "e5m2 x e4m3 (backward)": (E5M2, E4M3)}


def measure(pair: tuple[torch.dtype, torch.dtype], shape: tuple[int, int, int], repeats: int) -> dict:
    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    (aq, ai), (bq, bi) = to_float8(torch.randn(m, k, generator=g), pair[0]), to_float8(torch.randn(k, n, generator=g), pair[1])
    times = {"native": [], "fp32": []}
    out = {}
    for _ in range(repeats):
        for gemm in times:
            start = time.perf_counter()
            out[gemm] = scaled_mm(aq, ai, bq, bi, gemm)
            times[gemm].append(time.perf_counter() - start)
    native, fp32 = (statistics.median(times[g]) for g in ("native", "fp32"))
    gap = float((out["native"] - out["fp32"]).abs().max() / out["native"].abs().max())
    return {"shape_mkn": list(shape), "native_s": native, "fp32_s": fp32, "native_over_fp32": native / fp32,
            "bitwise_equal": bool(torch.equal(out["native"], out["fp32"])), "max_relative_gap": gap}


def main() -> None:
    parser = ScriptParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="rounds per route (the median is reported)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be at least 1")
    torch.set_num_threads(args.threads)
    report = {"what": "fp8_linear GEMM routes: torch._scaled_mm (native) vs its CPU path in FP32 (fp32)",
              "results": {name: [measure(pair, shape, args.repeats) for shape in SHAPES] for name, pair in PAIRS.items()},
              "repeats": args.repeats, "provenance": provenance(threads=args.threads)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    run_script(main)
