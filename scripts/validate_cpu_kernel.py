"""How closely `numerics=cpu_sdpa` (numdev's model of PyTorch's CPU flash kernel) gives the kernel's
own bits (sdpa_flash), for bf16 and fp16 at self, cross, causal, ragged and d = 128 shapes over
several seeds, and which BLAS entry points each calls. Prints JSON.

    python scripts/validate_cpu_kernel.py                       # 3 seeds
    python scripts/validate_cpu_kernel.py --seeds 0 1 2 3 4 --out docs/results/validate_cpu_kernel.json

Per shape, dtype and seed: the share of outputs bit-identical to the kernel, the mean and max
|difference| (and the paper-style bf16/fp16 Baseline's, for scale), which path of the model ran
(native: the fused C path; eager: the ATen path) and which GEMM it called (cblas, or brgemm where
the kernel packs: AMX CPUs). The BLAS dispatch is captured from subprocesses run with MKL_VERBOSE=1
and DNNL_VERBOSE=1 (one for the kernel, one for the model): the GEMM entry points each called,
with counts and an example line. Where the CPU lets the kernel pack bf16, `gemm_entries_compared`
holds how many float32 outputs of P.V (64 x K by K x 64, random inputs) MKL's cblas GEMM and
cpublas::brgemm give differently, per K: why a model calling the wrong one misses some outputs.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import collections
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from numdev.cli.script_args import ScriptParser, run_script
from numdev.cli.script_args import seed as seed_type
from numdev.runs.atomic import write_text

ROOT = Path(__file__).resolve().parents[1]

# name: (batch, heads, n_q, n_k, dim, causal)
SHAPES = {
    "self": (2, 3, 256, 256, 64, False),
    "cross": (2, 2, 700, 300, 64, False),
    "causal": (1, 4, 1000, 1000, 64, True),
    "ragged": (1, 2, 130, 1500, 32, True),  # lengths not multiples of 16 or 512, several key/value blocks
    "ragged-d128": (1, 2, 517, 1029, 128, False),
    "long": (1, 2, 2048, 2048, 64, False),
}
DTYPES = ("bf16", "fp16")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def inputs(shape, dtype, seed):
    import torch

    batch, heads, n_q, n_k, dim, _ = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n_q, dim, generator=g)
    k, v = (torch.randn(batch, heads, n_k, dim, generator=g) for _ in range(2))
    return tuple(t.to(dtype) for t in (q, k, v))


def compare(shape, precision, seed) -> dict:
    import torch

    from numdev.attention import Baseline, FlashEmulated, build_backend
    from numdev.numerics.stages import stage_formats

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    causal = shape[-1]
    q, k, v = inputs(shape, dtype, seed)
    with torch.no_grad():
        kernel = build_backend("sdpa_flash")(q, k, v, causal=causal)
        model = FlashEmulated(stage_formats("cpu_sdpa", precision), tile_rule="cpu_sdpa")
        emulated = model(q, k, v, causal=causal)
        baseline = Baseline(stage_formats("paper", precision))(q, k, v, causal=causal)
    gap, base_gap = (emulated.double() - kernel.double()).abs(), (baseline.double() - kernel.double()).abs()
    return {
        "bit_identical_fraction": float((emulated.view(torch.int16) == kernel.view(torch.int16)).double().mean()),
        "differing_outputs": int((emulated.view(torch.int16) != kernel.view(torch.int16)).sum()),
        "outputs": kernel.numel(),
        "model_vs_kernel_mean_abs": float(gap.mean()), "model_vs_kernel_max_abs": float(gap.max()),
        "paper_baseline_vs_kernel_mean_abs": float(base_gap.mean()),
        "paper_baseline_vs_kernel_max_abs": float(base_gap.max()),
        "model_path": model.last_path,
        "model_gemm": model.last_gemm,
    }


def gemm_entries_compared() -> dict | None:
    """Float32 outputs of P (64 x K) V (K x 64) that differ between MKL's cblas GEMM and cpublas::brgemm,
    per K, where this CPU lets the kernel pack bf16 (None elsewhere)."""
    import torch

    from numdev.attention import cpu_kernel

    if not cpu_kernel.could_pack(torch.bfloat16) or cpu_kernel.brgemm(torch.bfloat16) is None:
        return None
    g = torch.Generator().manual_seed(0)
    differing = {}
    for depth in [*range(8, 161, 8), 63, 64, 65, 99, 100, 127, 128, 129, 130, 256, 257, 300, 511, 512]:
        p = torch.rand(1, 1, 64, depth, generator=g).bfloat16()
        v = torch.randn(1, 1, depth, 64, generator=g).bfloat16()
        outs = [torch.zeros(1, 1, 64, 64) for _ in range(2)]
        for out, entry in zip(outs, ("cblas", "brgemm")):
            cpu_kernel.accumulate(p, v, out, 64, 0.0, None, False, entry)
        differing[depth] = int((outs[0] != outs[1]).sum())
    return {"what": "float32 outputs of a 64 x K by K x 64 bf16 GEMM (of 4096) where MKL's cblas and cpublas::brgemm differ",
            "differing_by_k": dict(sorted(differing.items()))}


_CHILD = """
import sys, torch
sys.path.insert(0, {src!r})
from numdev.attention import FlashEmulated, build_backend
from numdev.numerics.stages import stage_formats
g = torch.Generator().manual_seed(0)
for precision, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
    q = torch.randn(1, 2, 300, 64, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, 600, 64, generator=g).to(dtype) for _ in range(2))
    if {which!r} == "kernel":
        build_backend("sdpa_flash")(q, k, v)
    else:
        FlashEmulated(stage_formats("cpu_sdpa", precision), tile_rule="cpu_sdpa")(q, k, v)
"""


def blas_dispatch(which: str) -> dict:
    """The GEMM entry points `which` (kernel or model) calls, from MKL/oneDNN's verbose output."""
    env = {**os.environ, "MKL_VERBOSE": "1", "DNNL_VERBOSE": "1", "ONEDNN_VERBOSE": "1"}
    result = subprocess.run([sys.executable, "-c", _CHILD.format(src=str(ROOT / "src"), which=which)],
                            capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in (result.stdout + result.stderr).splitlines()
             if line.startswith(("MKL_VERBOSE", "onednn_verbose", "dnnl_verbose"))]
    calls = collections.Counter()
    examples = {}
    for line in lines:
        match = re.match(r"MKL_VERBOSE\s+(\w+)\(", line)
        name = match.group(1) if match else ",".join(line.split(",")[:4])
        if match or "exec" in line:
            calls[name] += 1
            examples.setdefault(name, line[:300])
    header = next((line[:300] for line in lines
                   if line.startswith("MKL_VERBOSE") and not re.match(r"MKL_VERBOSE\s+\w+\(", line)), None)
    return {"returncode": result.returncode, "library": header, "calls": dict(calls), "example_lines": examples,
            "shape": "bf16 then fp16, (1, 2, 300, 64) x (1, 2, 600, 64)"}


def main() -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=seed_type, nargs="+", default=[0, 1, 2])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from numdev.attention import cpu_kernel
    from numdev.runs.provenance import provenance

    rows, worst = [], {}
    for name in args.shapes:
        shape = SHAPES[name]
        for precision in DTYPES:
            for seed in args.seeds:
                row = {"shape_name": name, "shape": list(shape[:5]), "causal": shape[5], "dtype": precision, "seed": seed,
                       **compare(shape, precision, seed)}
                rows.append(row)
                key = f"{precision}/{name}"
                worst[key] = min(worst.get(key, 1.0), row["bit_identical_fraction"])
                print(f"{key} seed {seed}: {row['bit_identical_fraction']:.6%} bit-identical ({row['model_path']}, "
                      f"{row['model_gemm']})",
                      file=sys.stderr, flush=True)
    totals = {p: sum(r["differing_outputs"] for r in rows if r["dtype"] == p) for p in DTYPES}
    counts = {p: sum(r["outputs"] for r in rows if r["dtype"] == p) for p in DTYPES}
    report = {
        "what": "numerics=cpu_sdpa (tiles.rule=cpu_sdpa) against PyTorch's CPU flash kernel (sdpa_flash), bit for bit",
        "torch": torch.__version__, "torch_git": torch.version.git_version,
        "modeled_torch": cpu_kernel.MODELED_TORCH, "modeled_commit": cpu_kernel.MODELED_COMMIT,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "lanes": cpu_kernel.lanes(),
        "cpu": cpu_model(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "provenance": provenance(seeds=args.seeds, threads=torch.get_num_threads()),
        "bit_identical_fraction_overall": {p: 1 - totals[p] / counts[p] for p in DTYPES},
        "bit_identical_fraction_worst_seed": worst,
        "could_pack": {p: cpu_kernel.could_pack({"bf16": torch.bfloat16, "fp16": torch.float16}[p]) for p in DTYPES},
        "blas_dispatch": {"kernel": blas_dispatch("kernel"), "model": blas_dispatch("model")},
        "gemm_entries_compared": gemm_entries_compared(),
        "rows": rows,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        write_text(args.out, text + "\n")
    print(text)


if __name__ == "__main__":
    run_script(main)
