"""The emulator against real FlashAttention kernels, bit for bit, and each kernel's deviation from the
FP64 golden value beside Baseline's (the paper's Fig. 4 ratio, measured with the kernels themselves).
Prints JSON.

    python scripts/gpu_kernels.py --out $OUT/gpu_kernels.json             # on a GPU: every kernel found
    python scripts/gpu_kernels.py --dtypes bf16 --n 512 4096 16384        # a part of the grid
    python scripts/gpu_kernels.py --device cpu --n 256 1000 --dims 64     # here: PyTorch's CPU flash kernel

Kernels: on CUDA, `sdpa_flash` (PyTorch's SDPA FLASH_ATTENTION: FlashAttention-2's code compiled
into torch), `sdpa_cudnn` when it runs, and every FlashAttention kernel `flash_attn` finds (fa2, fa3,
fa4, fa3_fwd: numdev.attention.flash_attn_backend); on CPU, `sdpa_flash` (PyTorch's CPU kernel).

Per dtype, head dim, causal or not, sequence length N and seed: inputs N(0,1) in (batch, heads, N,
d), each kernel run on the whole batch (a kernel's schedule, e.g. FA2's split-KV, depends on
batch x heads x N), then the first --compare-heads heads of batch 0 compared on the CPU with
  - the emulator (FlashEmulated) in each preset that models the kernel: `fa2` (scores, statistics
    and accumulator in FP32, P rounded before P.V) with the kernel's tiles (TILES), and on CPU also
    `cpu_sdpa` (numdev's model of PyTorch's CPU kernel): the share of outputs bit-identical to the
    kernel, and mean |emulator - kernel| / mean |Baseline - kernel| (the paper Baseline's gap, for scale);
  - the FP64 golden value: max and mean |out - golden| of the kernel, the emulator presets and the
    two Baselines (paper: every stage in the run precision; eager: softmax in FP32, P rounded once).
The summary gives, per kernel, dtype, d, causal and N, the bit-identical share (mean and worst seed)
and the Fig. 4 ratio (kernel / paper Baseline, max |d|) as a ratio of means over seeds with its
spread by numdev.stats' rule (95% bootstrap from 5 seeds, else the range of the per-seed ratios).
"""

from __future__ import annotations

import json
import sys
import time

import torch

from numdev.attention import (
    Baseline,
    FlashEmulated,
    available_backends,
    build_backend,
    flash_attn_backend,
    golden_attention,
)
from numdev.bench.metrics import deviation
from numdev.cli.script_args import ScriptParser, at_least
from numdev.cli.script_args import seed as seed_type
from numdev.numerics.stages import stage_formats
from numdev.runs.atomic import write_text
from numdev.runs.provenance import provenance
from numdev.stats.intervals import ratio_interval

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# (B_r, B_c) of each kernel on an H100 (../shared/gpu/README.md, from the kernels' sources):
# {head dim: (non-causal tile, causal tile)}.
FA2_TILES = {64: ((128, 128), (128, 128)), 128: ((128, 64), (128, 64))}
FA3_TILES = {64: ((192, 192), (192, 128)), 128: ((128, 176), (128, 128))}
TILES = {
    "sdpa_flash": FA2_TILES,
    "flash_attn[fa2]": FA2_TILES,
    "flash_attn[fa3]": FA3_TILES,
    "flash_attn[fa3_fwd]": FA3_TILES,
    "flash_attn[fa4]": {64: ((192, 128), (192, 128)), 128: ((128, 128), (128, 128))},
}


def kernels(device: str, dtype: torch.dtype) -> dict:
    """{label: backend} for the real kernels that run on `device` with `dtype`."""
    found = {"sdpa_flash": build_backend("sdpa_flash")}
    if device == "cuda":
        if "sdpa_cudnn" in available_backends("cuda", dtype):
            found["sdpa_cudnn"] = build_backend("sdpa_cudnn")
        found.update(flash_attn_backend.runnable("cuda", dtype))
    return found


def emulators(label: str, device: str, precision: str, dim: int, causal: bool) -> dict:
    """{preset label: FlashEmulated} that model kernel `label` (none for a kernel without a tile model)."""
    if device == "cpu":
        return {"cpu_sdpa": FlashEmulated(stage_formats("cpu_sdpa", precision), tile_rule="cpu_sdpa"),
                "fa2": FlashEmulated(stage_formats("fa2", precision), tile_rule="cpu_sdpa")}
    tiles = TILES.get(label, {}).get(dim)
    if tiles is None:
        return {}
    block_r, block_c = tiles[causal]
    return {"fa2": FlashEmulated(stage_formats("fa2", precision), block_r=block_r, block_c=block_c, tile_rule="explicit")}


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.view(torch.int16) == b.view(torch.int16)).double().mean())


def cell(device, precision, dim, causal, n, seed, args, real: dict) -> list[dict]:
    """One record per kernel of `real` ({label: backend}) for one input."""
    dtype = DTYPES[precision]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(args.batch, args.heads, n, dim, generator=g).to(dtype) for _ in range(3))
    part = (slice(0, 1), slice(0, args.compare_heads))
    cq, ck, cv = (t[part].contiguous() for t in (q, k, v))
    golden = golden_attention(*(t.to(device) for t in (cq, ck, cv)), causal=causal).cpu()
    with torch.no_grad():
        baselines = {name: Baseline(stage_formats(name, precision))(cq, ck, cv, causal=causal) for name in ("paper", "eager")}
    base_dev = {name: deviation(out, golden) for name, out in baselines.items()}
    records = []
    for label, backend in real.items():
        start = time.perf_counter()
        try:
            with torch.no_grad():
                out = backend(*(t.to(device) for t in (q, k, v)), causal=causal)
        except Exception as error:  # a kernel that refuses this shape: recorded, the sweep goes on
            records.append({"kernel": label, "error": str(error).splitlines()[0][:300]})
            continue
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        out = out[part].cpu()
        record = {"kernel": label, "describe": backend.describe(), "first_call_s": round(seconds, 4),
                  "vs_golden": deviation(out, golden),
                  "baselines_vs_golden": base_dev,
                  "paper_baseline_vs_kernel_mean_abs": float((baselines["paper"].double() - out.double()).abs().mean()),
                  "emulators": {}}
        for preset, emulator in emulators(label, device, precision, dim, causal).items():
            with torch.no_grad():
                emulated = emulator(cq, ck, cv, causal=causal)
            gap = float((emulated.double() - out.double()).abs().mean())
            record["emulators"][preset] = {
                "bit_identical_fraction": bits_equal(emulated, out),
                "vs_kernel_mean_abs": gap,
                "vs_kernel_relative_to_paper_baseline": gap / record["paper_baseline_vs_kernel_mean_abs"]
                if record["paper_baseline_vs_kernel_mean_abs"] > 0 else None,
                "vs_golden": deviation(emulated, golden),
            }
        records.append(record)
    return records


def summarise(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if "error" not in row:
            groups.setdefault((row["kernel"], row["dtype"], row["dim"], row["causal"], row["n"]), []).append(row)
    summary = []
    for (label, precision, dim, causal, n), group in sorted(groups.items()):
        entry = {"kernel": label, "dtype": precision, "dim": dim, "causal": causal, "n": n, "seeds": len(group)}
        for metric in ("max_abs", "mean_abs"):
            kernel = [r["vs_golden"][metric] for r in group]
            paper = [r["baselines_vs_golden"]["paper"][metric] for r in group]
            entry[f"fig4_ratio_{metric}"] = ratio_interval(kernel, paper).as_dict()
        for preset in group[0]["emulators"]:
            shares = [r["emulators"][preset]["bit_identical_fraction"] for r in group]
            gaps = [r["emulators"][preset]["vs_kernel_relative_to_paper_baseline"] for r in group]
            emulated = [r["emulators"][preset]["vs_golden"]["max_abs"] for r in group]
            paper = [r["baselines_vs_golden"]["paper"]["max_abs"] for r in group]
            entry[f"emulator[{preset}]"] = {
                "bit_identical_mean": sum(shares) / len(shares), "bit_identical_worst_seed": min(shares),
                "gap_relative_to_paper_baseline_mean": sum(g for g in gaps if g is not None) / max(1, sum(g is not None for g in gaps)),
                "fig4_ratio_max_abs": ratio_interval(emulated, paper).as_dict(),
            }
        summary.append(entry)
    return summary


def main(argv=None) -> int:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--dims", type=at_least(1), nargs="+", default=[64, 128])
    parser.add_argument("--causal", nargs="+", type=int, default=[0, 1], choices=[0, 1])
    parser.add_argument("--n", type=at_least(1), nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--seeds", type=seed_type, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--batch", type=at_least(1), default=2)
    parser.add_argument("--heads", type=at_least(1), default=8)
    parser.add_argument("--compare-heads", type=at_least(1), default=1, help="heads of batch 0 compared on the CPU")
    parser.add_argument("--out", default=None, help="also write the JSON here (atomically)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_kernels: error: --device cuda but no CUDA GPU here; use --device cpu for PyTorch's CPU kernel", file=sys.stderr)
        return 2
    if not 1 <= args.compare_heads <= args.heads:
        print(f"gpu_kernels: error: --compare-heads {args.compare_heads} must be 1..--heads ({args.heads})", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # the golden value and nothing else runs matmuls on the GPU
    started = time.perf_counter()
    rows = []
    real = {precision: kernels(args.device, DTYPES[precision]) for precision in args.dtypes}  # built once
    versions = {label: backend.describe() for found in real.values() for label, backend in found.items()}

    def report(complete: bool) -> dict:
        return {
            "what": "real FlashAttention kernels against numdev's emulator (bit for bit) and the FP64 golden value",
            "complete": complete,  # false: a partial file, written after each cell so a killed run keeps its rows
            "device": args.device,
            "grid": {key: value for key, value in vars(args).items() if key != "out"},
            "kernel_versions": versions,
            "tiles": {label: {str(d): t for d, t in tiles.items()} for label, tiles in TILES.items()},
            "provenance": provenance(seeds=args.seeds),
            "seconds": round(time.perf_counter() - started, 1),
            "summary": summarise(rows),
            "rows": rows,
        }

    for precision in args.dtypes:
        for dim in args.dims:
            for causal in map(bool, args.causal):
                for n in args.n:
                    for seed in args.seeds:
                        for record in cell(args.device, precision, dim, causal, n, seed, args, real[precision]):
                            row = {"dtype": precision, "dim": dim, "causal": causal, "n": n, "seed": seed, **record}
                            rows.append(row)
                            shares = {p: round(e["bit_identical_fraction"], 6) for p, e in row.get("emulators", {}).items()}
                            print(f"{precision} d={dim} causal={int(causal)} N={n} seed {seed} {row['kernel']}: "
                                  f"{row.get('error') or shares}", file=sys.stderr, flush=True)
                    if args.out:
                        write_text(args.out, json.dumps(report(False), indent=1) + "\n")
    final = report(True)
    text = json.dumps(final, indent=1)
    if args.out:
        write_text(args.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
