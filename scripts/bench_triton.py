"""Throughput of the Triton FlashAttention kernel against PyTorch's FA2 (sdpa_flash), cuDNN and FlashAttention 2/3/4.

    python scripts/bench_triton.py                      # the full sweep, JSON on stdout
    python scripts/bench_triton.py --seq 4096 --dims 128 --out bench.json

Forward and forward+backward TFLOP/s, bf16, at sequence lengths 1k..16k and head dims 64 and 128,
with 16k tokens per batch and a model width of 2048 (heads = 2048 / d), as in the FA2 paper.
FLOPs: forward 4 * B * H * N^2 * d (halved with --causal), backward 2.5x forward.

Methods: `triton` with default knobs (FA2 numerics), `triton` with each perturbation knob set,
`sdpa_flash`, `sdpa_cudnn` when it runs, and `flash_attn[<kernel>]` for every FlashAttention kernel
installed (fa2, fa3, fa4; fa3_fwd forward only), all timed in one process (triton.testing.do_bench,
median). The summary gives triton / sdpa_flash forward
at N=4096, d=128 (target: >= 0.8 on an H100) and each knob's cost relative to the defaults.
"""

from __future__ import annotations

import datetime
import json
import sys

import torch

from numdev.cli.script_args import ScriptParser
from numdev.runs.atomic import write_text

PERTURBED = {
    "triton": {},
    "triton[stats=input]": {"stats": "input"},
    "triton[accum=input]": {"accum": "input"},
    "triton[variant=fa1]": {"variant": "fa1"},
    "triton[exp2=False]": {"exp2": False},
}


def main(argv=None) -> int:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--modes", nargs="+", default=["fwd", "fwd_bwd"], choices=["fwd", "fwd_bwd"])
    parser.add_argument("--causal", action="store_true", help="causal masking (FLOPs halved)")
    parser.add_argument("--tokens", type=int, default=16384, help="batch * seq")
    parser.add_argument("--width", type=int, default=2048, help="heads * head dim")
    parser.add_argument("--methods", nargs="+", default=None, help="default: all that can run")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("bench_triton: error: no CUDA GPU here; this benchmark times GPU kernels (run it on one)", file=sys.stderr)
        return 2

    from triton.testing import do_bench

    from numdev.attention import available_backends, build_backend, flash_attn_backend
    from numdev.runs.provenance import provenance

    methods = {name: build_backend("triton", **knobs) for name, knobs in PERTURBED.items()}
    methods["sdpa_flash"] = build_backend("sdpa_flash")
    if "sdpa_cudnn" in available_backends("cuda", torch.bfloat16):
        methods["sdpa_cudnn"] = build_backend("sdpa_cudnn")
    methods.update(flash_attn_backend.runnable("cuda", torch.bfloat16))
    if args.methods:
        methods = {name: methods[name] for name in args.methods if name in methods}

    results = []
    for dim in args.dims:
        heads = max(1, args.width // dim)
        for seq in args.seq:
            batch = max(1, args.tokens // seq)
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (
                torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(3)
            )
            grad_out = torch.randn_like(q)
            flops = 4 * batch * heads * seq * seq * dim * (0.5 if args.causal else 1.0)
            for name, backend in methods.items():
                for mode in args.modes:
                    record = {"method": name, "mode": mode, "seq": seq, "dim": dim, "batch": batch, "heads": heads}
                    if mode == "fwd_bwd" and name.startswith("flash_attn[") and not flash_attn_backend.KERNELS[backend.kernel].backward:
                        record["skipped"] = "forward-only kernel"
                        results.append(record)
                        continue
                    try:
                        ms = _time(do_bench, backend, q, k, v, grad_out, args.causal, mode)
                        mode_flops = flops * (3.5 if mode == "fwd_bwd" else 1.0)
                        record.update(ms=round(ms, 4), tflops=round(mode_flops / ms * 1e-9, 1))
                    except Exception as error:  # out of memory, a kernel that will not build: record it, go on
                        record["error"] = str(error).splitlines()[0][:200]
                    results.append(record)
                    print(json.dumps(record), file=sys.stderr)  # progress
                    torch.cuda.empty_cache()

    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "provenance": provenance(),
        "kernels": {name: backend.describe() for name, backend in methods.items() if not name.startswith("triton")},
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cuda": torch.version.cuda,
        "dtype": "bf16",
        "causal": args.causal,
        "results": results,
        "summary": _summary(results),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        write_text(args.out, text + "\n")  # atomic: never a half-written report
    return 0


def _time(do_bench, backend, q, k, v, grad_out, causal, mode) -> float:
    if mode == "fwd":
        with torch.no_grad():
            return do_bench(lambda: backend(q, k, v, causal=causal), return_mode="median")
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def step():
        backend(*leaves, causal=causal).backward(grad_out)

    return do_bench(step, grad_to_none=leaves, return_mode="median")


def _summary(results) -> dict:
    rate = {(r["method"], r["mode"], r["seq"], r["dim"]): r.get("tflops") for r in results}
    summary = {}
    triton, sdpa = rate.get(("triton", "fwd", 4096, 128)), rate.get(("sdpa_flash", "fwd", 4096, 128))
    if triton and sdpa:
        summary["triton/sdpa_flash fwd N=4096 d=128 (target >= 0.8 on H100)"] = round(triton / sdpa, 3)
    for name in PERTURBED:
        if name == "triton":
            continue
        ratios = [
            rate[key] / rate[("triton",) + key[1:]]
            for key in rate
            if key[0] == name and rate[key] and rate.get(("triton",) + key[1:])
        ]
        if ratios:
            summary[f"{name} / triton, median over shapes"] = round(sorted(ratios)[len(ratios) // 2], 3)
    return summary


def _version(package: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
