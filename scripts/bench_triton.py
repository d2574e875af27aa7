"""Throughput of the Triton FlashAttention kernel against PyTorch's FA2 (sdpa_flash), cuDNN and FlashAttention 2/3/4.

    python scripts/bench_triton.py                      # the full sweep, JSON on stdout
    python scripts/bench_triton.py --seq 4096 --dims 128 --out bench.json
    python scripts/bench_triton.py --device cpu         # a rehearsal of the same loop on this CPU (seconds)

Forward and forward+backward TFLOP/s, bf16, at sequence lengths 1k..16k and head dims 64 and 128,
with 16k tokens per batch and a model width of 2048 (heads = 2048 / d), as in the FA2 paper.
FLOPs: forward 4 * B * H * N^2 * d (halved with --causal), backward 2.5x forward.

Methods: `triton` with default knobs (FA2 numerics), `triton` with each perturbation knob set,
`sdpa_flash`, `sdpa_cudnn` when it runs, and `flash_attn[<kernel>]` for every FlashAttention kernel
installed (fa2, fa3, fa4; fa3_fwd forward only), all timed in one process (triton.testing.do_bench,
median). The summary gives triton / sdpa_flash forward
at N=4096, d=128 (target: >= 0.8 on an H100), triton / sdpa_flash forward over all shapes (median)
and each knob's cost relative to the defaults.

--device cpu rehearses the same loop, records and summary here: the Triton kernel through Triton's
interpreter (float16 by default; the interpreter has no bfloat16) and PyTorch's CPU flash kernel,
each timed as the median of --repeats calls after one warm-up (time.perf_counter), at tiny default
sizes (--seq 128 256 --dims 64 --tokens 256 --width 128). Its timings say the loop works, not how fast
anything is. Without a GPU and without --device cpu: exit 2, one line.

With --out the file is rewritten (atomically) after every record with "complete": false and at the
end with "complete": true, so a run stopped by `timeout` keeps the timings it took. A record that
fails (out of memory, a kernel that will not build) is kept with its error and the loop goes on; a
method that failed in every record ends the run with exit 1 and one line each, after the report.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import datetime
import json
import statistics
import sys
import time

import torch

from numdev.cli.errors import never_ran
from numdev.cli.script_args import ScriptParser, at_least, run_script
from numdev.runs.atomic import write_text

PERTURBED = {
    "triton": {},
    "triton[stats=input]": {"stats": "input"},
    "triton[accum=input]": {"accum": "input"},
    "triton[variant=fa1]": {"variant": "fa1"},
    "triton[exp2=False]": {"exp2": False},
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEVICE_DTYPES = {"cuda": ("bf16", "fp16"), "cpu": ("fp16", "fp32")}  # the Triton kernel's on a GPU, its interpreter's
GRID = {  # --seq, --dims, --tokens, --width when not given
    "cuda": {"seq": [1024, 2048, 4096, 8192, 16384], "dims": [64, 128], "tokens": 16384, "width": 2048},
    "cpu": {"seq": [128, 256], "dims": [64], "tokens": 256, "width": 128},
}
CPU_NOTE = ("a rehearsal on the CPU: the Triton kernel through Triton's interpreter and PyTorch's CPU flash kernel, "
            "timed with time.perf_counter; the timings show the loop works, they measure nothing about the GPU kernels")


def main(argv=None) -> int:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a rehearsal of the loop (Triton's interpreter, PyTorch's CPU flash kernel)")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: bf16 on cuda, fp16 on cpu")
    parser.add_argument("--seq", type=at_least(1), nargs="+", default=None, help="default: 1024 .. 16384 (cpu: 128 256)")
    parser.add_argument("--dims", type=at_least(1), nargs="+", default=None, help="default: 64 128 (cpu: 64)")
    parser.add_argument("--modes", nargs="+", default=["fwd", "fwd_bwd"], choices=["fwd", "fwd_bwd"])
    parser.add_argument("--causal", action="store_true", help="causal masking (FLOPs halved)")
    parser.add_argument("--tokens", type=at_least(1), default=None, help="batch * seq (default 16384; cpu: 256)")
    parser.add_argument("--width", type=at_least(1), default=None, help="heads * head dim (default 2048; cpu: 128)")
    parser.add_argument("--methods", nargs="+", default=None, help="default: all that can run")
    parser.add_argument("--repeats", type=at_least(1), default=3, help="cpu: timed calls per record (median), after a warm-up")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("bench_triton: error: no CUDA GPU here; this benchmark times GPU kernels (run it on one, "
              "or rehearse the loop here with --device cpu)", file=sys.stderr)
        return 2
    precision = args.dtype or DEVICE_DTYPES[device][0]
    if precision not in DEVICE_DTYPES[device]:
        why = "Triton's interpreter has no bfloat16" if device == "cpu" else "the Triton kernel takes float16 or bfloat16 on a GPU"
        print(f"bench_triton: error: --dtype {precision} on {device}: {why}; "
              f"use {' or '.join(DEVICE_DTYPES[device])}", file=sys.stderr)
        return 2
    dtype = DTYPES[precision]
    for key, value in GRID[device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    from numdev.attention import BackendUnavailable, available_backends, build_backend, flash_attn_backend
    from numdev.runs.provenance import provenance

    if device == "cuda":
        from triton.testing import do_bench
    else:
        do_bench = _cpu_timer(args.repeats)

    methods, unavailable = {}, {}
    for name, knobs in PERTURBED.items():
        try:
            methods[name] = build_backend("triton", **knobs, **({"interpret": True} if device == "cpu" else {}))
        except BackendUnavailable as error:  # no triton package
            unavailable[name] = str(error).splitlines()[0]
    methods["sdpa_flash"] = build_backend("sdpa_flash")
    if device == "cuda":
        if "sdpa_cudnn" in available_backends("cuda", dtype):
            methods["sdpa_cudnn"] = build_backend("sdpa_cudnn")
        methods.update(flash_attn_backend.runnable("cuda", dtype))
    if args.methods:
        methods = {name: methods[name] for name in args.methods if name in methods}

    results = []
    started = datetime.datetime.now().isoformat(timespec="seconds")
    record_of_run = provenance()

    def report(complete: bool) -> dict:
        return {
            "date": started,
            "complete": complete,  # false: a partial file, rewritten after every record
            "device": device,
            **({"note": CPU_NOTE, "repeats": args.repeats} if device == "cpu" else {}),
            "provenance": record_of_run,
            "kernels": {name: backend.describe() for name, backend in methods.items() if not name.startswith("triton")},
            **({"unavailable": unavailable} if unavailable else {}),
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "torch": torch.__version__,
            "triton": _version("triton"),
            "cuda": torch.version.cuda,
            "dtype": precision,
            "causal": args.causal,
            "results": results,
            "summary": _summary(results),
        }

    for dim in args.dims:
        heads = max(1, args.width // dim)
        for seq in args.seq:
            batch = max(1, args.tokens // seq)
            gen = torch.Generator(device=device).manual_seed(0)
            q, k, v = (
                torch.randn(batch, heads, seq, dim, device=device, dtype=dtype, generator=gen)
                for _ in range(3)
            )
            grad_out = torch.randn_like(q)
            flops = 4 * batch * heads * seq * seq * dim * (0.5 if args.causal else 1.0)
            for name, backend in methods.items():
                for mode in args.modes:
                    record = {"method": name, "mode": mode, "seq": seq, "dim": dim, "batch": batch, "heads": heads}
                    if mode == "fwd_bwd" and name.startswith("flash_attn[") and not flash_attn_backend.KERNELS[backend.kernel].backward:
                        record["skipped"] = "forward-only kernel"
                    else:
                        try:
                            ms = _time(do_bench, backend, q, k, v, grad_out, args.causal, mode)
                            mode_flops = flops * (3.5 if mode == "fwd_bwd" else 1.0)
                            tflops = mode_flops / ms * 1e-9
                            # a CPU's TFLOP/s would round to 0.0: three significant digits there
                            record.update(ms=round(ms, 4), tflops=round(tflops, 1) if device == "cuda" else float(f"{tflops:.3g}"))
                        except Exception as error:  # out of memory, a kernel that will not build: record it, go on
                            record["error"] = str(error).splitlines()[0][:200]
                    results.append(record)
                    print(json.dumps(record), file=sys.stderr, flush=True)  # progress
                    if args.out:
                        write_text(args.out, json.dumps(report(False), indent=1) + "\n")
                    if device == "cuda":
                        torch.cuda.empty_cache()

    text = json.dumps(report(True), indent=1)
    print(text)
    if args.out:
        write_text(args.out, text + "\n")  # atomic: never a half-written report
    failed = never_ran(results, "method")
    for line in failed:
        print(f"bench_triton: error: {line}", file=sys.stderr)
    return 1 if failed else 0


def _cpu_timer(repeats: int):
    """do_bench's signature for the CPU rehearsal: one warm-up call, then the median of `repeats` calls, in ms."""

    def bench(fn, grad_to_none=None, return_mode="median"):
        fn()
        times = []
        for _ in range(repeats):
            for tensor in grad_to_none or ():
                tensor.grad = None
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    return bench


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
    against = [rate[key] / rate[("sdpa_flash",) + key[1:]] for key in rate
               if key[0] == "triton" and key[1] == "fwd" and rate[key] and rate.get(("sdpa_flash",) + key[1:])]
    if against:
        summary["triton/sdpa_flash fwd, median over shapes"] = round(sorted(against)[len(against) // 2], 3)
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
    run_script(main)
