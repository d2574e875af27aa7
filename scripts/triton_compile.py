"""Compile numdev's Triton attention kernels for a GPU ahead of time, on a machine without one.

Triton compiles for a named target without a device (its wheel carries ptxas): this script builds
every variant of the forward kernel that the knobs can ask for (causal x FA1 x exp2 x bf16
statistics x bf16 accumulator) and both backward kernels, for each dtype and head dim, with the
blocks and launch options `numdev.kernels.flash_attention` uses, and records for each: whether it
compiled, the shared memory it asks for, the registers and spills ptxas reports (`ptxas -v`), and
what the PTX uses (Hopper's wgmma, Ampere's mma.sync, the ex2 approximation). It tells, before a
GPU is lent, that the kernels build under the installed Triton (the lent machine's is 3.6: run it
there with docs/gpu.md's image venv) and whether the forward uses Hopper's tensor-core instructions.

What it cannot tell: whether the kernels run correctly or fast (no device runs them), nor the
numbers the driver's loader would report.

    python scripts/triton_compile.py --out docs/results/triton_compile_sm90.json

Progress goes to stderr, a line a variant; the JSON goes to stdout and --out (written atomically,
rewritten after every variant with "complete": false). A variant that fails to compile is recorded
with its error and the others go on; any failure ends the run with one line each and exit 1.
`--write-docs` compiles nothing: it rewrites docs/gpu.md's table from docs/results/triton_compile_*.json.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from numdev.cli.errors import one_line
from numdev.cli.script_args import ScriptParser, at_least, run_script
from numdev.cli.stop_signals import StopOnSignal, Stopped
from numdev.runs.atomic import write_text
from numdev.runs.provenance import provenance
from numdev.runs.scratch import scratch

DTYPES = ("bf16", "fp16")
FORWARD_SWITCHES = ("CAUSAL", "FA1", "USE_EXP2", "STATS_LOW", "ACC_LOW")
BACKWARD_SWITCHES = ("CAUSAL", "USE_EXP2")
FP32_POINTERS = {"LSE", "DELTA"}  # the log-sum-exp and dO.O: fp32 whatever the inputs' dtype
FLOAT_SCALARS = {"s_scale", "scale"}
REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "gpu.md"
RESULTS = REPO / "docs" / "results"  # triton_compile_*.json: one report per Triton version, rendered together


def signature(arg_names: list[str], dtype: str, constexprs: dict) -> dict:
    """Triton's signature of a kernel of this file's naming: upper-case tensors (pointers), the two
    scales fp32, every other runtime argument (lengths, strides) i32."""
    types = {}
    for name in arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name[0].isupper():
            types[name] = "*fp32" if name in FP32_POINTERS else f"*{dtype}"
        else:
            types[name] = "fp32" if name in FLOAT_SCALARS else "i32"
    return types


def variants(kernel, dims: list[int], dtypes: list[str]) -> list[dict]:
    """Every (kernel, dtype, head dim, constexprs, launch options) the knobs and the backward can launch."""
    found = []
    for dtype, dim in itertools.product(dtypes, dims):
        block_m, block_n = kernel.default_blocks(dim)
        options = kernel.launch_options(dim, block_m, block_n, kernel.Knobs())
        for values in itertools.product((False, True), repeat=len(FORWARD_SWITCHES)):
            found.append({"kernel": "_fwd_kernel", "dtype": dtype, "head_dim": dim, "options": options,
                          "constexprs": {"HEAD_DIM": dim, "BLOCK_M": block_m, "BLOCK_N": block_n,
                                         **dict(zip(FORWARD_SWITCHES, values))}})
        for name, (block_m, block_n) in kernel.backward_blocks(dim).items():
            for values in itertools.product((False, True), repeat=len(BACKWARD_SWITCHES)):
                found.append({"kernel": name, "dtype": dtype, "head_dim": dim, "options": dict(kernel.BACKWARD_OPTIONS),
                              "constexprs": {"HEAD_DIM": dim, "BLOCK_M": block_m, "BLOCK_N": block_n,
                                             **dict(zip(BACKWARD_SWITCHES, values))}})
    return found


def ptxas_usage(ptxas: str, ptx: str, arch: str) -> dict:
    """Registers and spill bytes of the PTX's entry function, from `ptxas -v`."""
    with scratch("numdev_ptxas_") as folder:
        source = os.path.join(folder, "kernel.ptx")
        with open(source, "w") as file:
            file.write(ptx)
        done = subprocess.run([ptxas, "-v", "--gpu-name", arch, source, "-o", os.path.join(folder, "kernel.cubin")],
                              capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"ptxas -v failed: {one_line(done.stderr or done.stdout)}")
    text = done.stderr + done.stdout
    registers = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {"registers": int(registers.group(1)) if registers else None,
            "spill_store_bytes": int(spills.group(1)) if spills else None,
            "spill_load_bytes": int(spills.group(2)) if spills else None}


def compile_one(kernel, variant: dict, target, ptxas: str) -> dict:
    import triton
    from triton.compiler import ASTSource

    fn = getattr(kernel, variant["kernel"])
    constexprs = variant["constexprs"]
    record = {key: variant[key] for key in ("kernel", "dtype", "head_dim", "constexprs", "options")}
    started = time.perf_counter()
    try:
        compiled = triton.compile(ASTSource(fn, signature(fn.arg_names, variant["dtype"], constexprs), constexprs),
                                  target=target, options=variant["options"])
        ptx = compiled.asm["ptx"]
        arch = re.search(r"^\s*\.target\s+(\w+)", ptx, re.MULTILINE)
        record.update(
            compile_s=round(time.perf_counter() - started, 2),
            ptx_target=arch.group(1) if arch else None,
            shared_bytes=compiled.metadata.shared,
            wgmma=ptx.count("wgmma.mma_async"),
            mma_sync=ptx.count("mma.sync"),
            ex2_approx=ptx.count("ex2.approx"),
            **ptxas_usage(ptxas, ptx, arch.group(1) if arch else f"sm_{target.arch}"),
        )
    except Exception as error:  # a variant that will not build: recorded, the others go on
        record["error"] = compile_error(error)[:400]
    return record


def compile_error(error: Exception) -> str:
    """Triton's CompilationError on one line: the reason (its cause, or its text's last line, after the
    quoted source) and where in the kernel ("at 23:23", line:column of the function)."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    where = lines[0].rstrip(":") if lines and lines[0].startswith("at ") else None
    reason = one_line(error.__cause__) if error.__cause__ is not None else (lines[-1].strip() if lines else type(error).__name__)
    return f"{reason} ({where} in the kernel)" if where else reason


def summarise(records: list[dict]) -> dict:
    """The counts over all variants, and per kernel what compiled and how (the report's summary and,
    recomputed from each report's records, docs/gpu.md's table)."""
    built = [r for r in records if "error" not in r]
    summary = {"variants": len(records), "compiled": len(built), "failed": len(records) - len(built)}
    for name in sorted({r["kernel"] for r in records}):
        mine = [r for r in built if r["kernel"] == name]
        spilling = [r for r in mine if (r["spill_store_bytes"] or 0) + (r["spill_load_bytes"] or 0) > 0]
        summary[name] = {
            "variants": sum(1 for r in records if r["kernel"] == name),
            "compiled": len(mine),
            "registers_max": max((r["registers"] or 0 for r in mine), default=0),
            "with_spills": len(spilling),
            "spill_store_bytes_max": max((r["spill_store_bytes"] for r in spilling), default=0),
            "shared_bytes_max": max((r["shared_bytes"] for r in mine), default=0),
            "using_wgmma": sum(1 for r in mine if r["wgmma"] > 0),
            "using_mma_sync": sum(1 for r in mine if r["mma_sync"] > 0),
        }
    return summary


def doc_table(reports: list[dict]) -> str:
    """docs/gpu.md's table: per report (a Triton version) and kernel, what compiled for the target and how."""
    lines = ["Generated by `python scripts/triton_compile.py --write-docs` from docs/results/triton_compile_*.json, "
             "each written by `python scripts/triton_compile.py --out <file>` (under the Triton named; "
             "the image's 3.6 in `.venv-gpu-image`, scripts/gpu_image_venv.sh):", "",
             "| Triton | target | kernel | compiled | registers (max) | variants spilling (bytes, max) | shared memory (max) | wgmma / mma.sync | machine, commit |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for report in reports:
        machine = report["provenance"]["machine"]["cpu"]
        git = report["provenance"]["git"]
        where = f"{machine}, {(git['commit'] or '?')[:10]}{' (dirty)' if git['dirty'] else ''}"
        summary = summarise(report["records"])
        for name in sorted(key for key, value in summary.items() if isinstance(value, dict)):
            k = summary[name]
            spill = f"{k['with_spills']} ({k['spill_store_bytes_max']} B)" if k["with_spills"] else "0"
            lines.append(f"| {report['triton']} | {report['target']} | `{name}` | {k['compiled']} of {k['variants']} "
                         f"| {k['registers_max']} | {spill} | {k['shared_bytes_max'] // 1024} KiB "
                         f"| {k['using_wgmma']} / {k['using_mma_sync']} | {where} |")
    return "\n".join(lines)


def write_docs() -> int:
    """Rewrite docs/gpu.md's table from the committed reports (nothing measured)."""
    from numdev.report.docblocks import write_results_table

    def complete_table(reports: list[dict]) -> str:
        if not all(report.get("complete") for report in reports):
            raise ValueError("it is not complete (a run stopped before its end)")
        return doc_table(reports)

    return write_results_table("triton_compile", RESULTS, "triton_compile_*.json", complete_table, DOC, "triton-compile", REPO)


def main(argv=None) -> int:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=at_least(70), default=None, help="the CUDA compute capability x 10 (default 90: H100/H200)")
    parser.add_argument("--dims", type=int, nargs="+", default=None, help="head dims (default: every one the kernel takes)")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=None, help="default: both (one given twice: compiled once)")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--write-docs", action="store_true",
                        help="compile nothing: rewrite docs/gpu.md's table from docs/results/triton_compile_*.json")
    args = parser.parse_args(argv)
    if args.write_docs:
        given = [f"--{name}" for name in ("arch", "dims", "dtypes", "out") if getattr(args, name) is not None]
        if given:
            parser.error(f"--write-docs compiles nothing, so {', '.join(given)} would be ignored: give it alone")
        return write_docs()
    arch, dtypes = args.arch or 90, list(dict.fromkeys(args.dtypes or DTYPES))
    try:
        import triton
        from triton.backends.compiler import GPUTarget
    except ImportError as error:
        print(f"triton_compile: error: Triton is not installed ({one_line(error)}): it comes with torch on Linux x86-64",
              file=sys.stderr)
        return 2
    from numdev.kernels import flash_attention as kernel

    dims = args.dims or list(kernel.HEAD_DIMS)
    twice = sorted({d for d in dims if dims.count(d) > 1})
    if twice:
        print(f"triton_compile: error: --dims {' '.join(map(str, twice))} given twice: give each head dim once", file=sys.stderr)
        return 2
    unknown = [d for d in dims if d not in kernel.HEAD_DIMS]
    if unknown:
        print(f"triton_compile: error: --dims {' '.join(map(str, unknown))}: the kernel takes head dims "
              f"{', '.join(map(str, kernel.HEAD_DIMS))}", file=sys.stderr)
        return 2
    # the ptxas Triton compiles with for this target (its own rule: a second one for Blackwell, sm_100 on)
    ptxas = (triton.knobs.nvidia.ptxas_blackwell if arch >= 100 else triton.knobs.nvidia.ptxas).path
    if not ptxas or not os.path.exists(ptxas):
        print(f"triton_compile: error: Triton's ptxas is not at {ptxas!r}: reinstall triton, or set TRITON_PTXAS_PATH",
              file=sys.stderr)
        return 2
    target = GPUTarget("cuda", arch, 32)
    todo = variants(kernel, dims, dtypes)
    started, records, made_by = time.perf_counter(), [], provenance()  # the tree compiled is the one at the start

    def report(complete: bool) -> dict:
        return {"what": "numdev's Triton attention kernels compiled ahead of time for a GPU, without one",
                "complete": complete, "target": f"cuda sm_{arch}", "triton": triton.__version__, "ptxas": ptxas,
                "provenance": made_by, "seconds": round(time.perf_counter() - started, 1),
                "summary": summarise(records), "records": records}

    # a fresh cache: every variant is compiled here, not read from an earlier run's files; removed however the run ends
    try:
        with StopOnSignal(), scratch("numdev_triton_cache_") as cache:  # a cache a SIGKILL left is removed by the next run
            os.environ["TRITON_CACHE_DIR"] = cache
            for index, variant in enumerate(todo, 1):
                record = compile_one(kernel, variant, target, ptxas)
                records.append(record)
                switches = " ".join(k for k, v in variant["constexprs"].items() if v is True) or "-"
                outcome = record.get("error") or f"{record['registers']} registers, {record['wgmma']} wgmma"
                print(f"[{index}/{len(todo)}] {variant['kernel']} {variant['dtype']} d={variant['head_dim']} {switches}: {outcome}",
                      file=sys.stderr, flush=True)
                if args.out:
                    write_text(args.out, json.dumps(report(False), indent=1) + "\n")
    except Stopped as stop:
        kept = f"; {len(records)} of {len(todo)} variants in {args.out} (complete: false)" if args.out and records else ""
        print(f"triton_compile: stopped by {signal.Signals(stop.signum).name}{kept}", file=sys.stderr, flush=True)
        return 128 + stop.signum
    text = json.dumps(report(True), indent=1)
    if args.out:
        write_text(args.out, text + "\n")
    print(text)
    failed = [f"{r['kernel']} {r['dtype']} d={r['head_dim']} {r['constexprs']}: {r['error']}" for r in records if "error" in r]
    for line in failed:
        print(f"triton_compile: error: did not compile: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    run_script(main)
