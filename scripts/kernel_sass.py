"""Read torch's FlashAttention-2 forward kernels' machine code (SASS) and check numdev's FA2 CUDA model against it.

torch's CUDA wheel carries FA2's forward kernels (`pytorch_flash::flash_fwd_kernel`, the split-KV kernel and
its combine kernel) compiled for each GPU architecture; Triton's wheel carries NVIDIA's `cuobjdump`. So on a
machine without a GPU this script disassembles the kernels a GPU would run (sm_90: H100/H200) and checks,
kernel by kernel, the arithmetic `numdev.attention.cuda_kernel` assumes:

  - `exp2_fmul_fadd`: P = exp2(S c - m c) takes MUFU.EX2 of an FADD of two products (torch's build, UNFUSE_FMA),
    never of an FFMA (flash-attn's build); the rescale exp2((m_old - m) c) of an FMUL;
  - `ex2_not_flushed`: each MUFU.EX2 of the softmax has exp2f's guard: below -126 the argument is halved
    and the result squared;
  - `fast_log`: the log-sum-exp's log is __logf: MUFU.LG2, then an FMUL by ln 2 rounded to float32
    (cuda_kernel.LN2_F32);
  - `reciprocal_rn`: 1/l is MUFU.RCP with a Newton step (rcp.rn: correctly rounded);
  - `mma_sync`: the matrix products are HMMA.16816.F32 (mma.sync m16n8k16, float32 accumulator), no HGMMA;
  - `expf_libdevice`, `logf_libdevice` (the combine kernel): libdevice's expf and logf with exactly the
    constants numdev's model uses (cuda_kernel.EXPF_T, EXPF_LOG2E, LOGF_POLY, LN2_F32).

What the machine code cannot say is the bits of MUFU.EX2 and MUFU.LG2 themselves and of the tensor cores'
sums: those the GPU call measures (docs/gpu.md). The GPU image runs torch 2.11.0+cu130, whose wheel is in
`.venv-gpu-image` (scripts/gpu_image_venv.sh); the result records the library's SHA-256, which the GPU
call's record names too, so that the machine code read here is shown to be the one that ran there.

    python scripts/kernel_sass.py --torch-lib .venv-gpu-image/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so \\
        --out docs/results/kernel_sass_torch211_sm90.json
    python scripts/kernel_sass.py --write-docs     # docs/gpu.md's table from docs/results/kernel_sass_*.json

Exit 0 when every check holds in every kernel read, 1 when one does not (the model no longer describes the
binary: a line each), 2 for a user error (no library, no cuobjdump, no kernel of the names asked for).
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import collections
import json
import re
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

from numdev.attention import cuda_kernel
from numdev.cli.errors import one_line
from numdev.cli.script_args import ScriptParser, at_least, run_script
from numdev.cli.stop_signals import StopOnSignal, Stopped
from numdev.runs.atomic import write_text
from numdev.runs.provenance import file_sha256, provenance, torch_cuda_library
from numdev.runs.scratch import scratch

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "gpu.md"
RESULTS = REPO / "docs" / "results"
DTYPES = {"bf16": "cutlass::bfloat16_t", "fp16": "cutlass::half_t"}
CHECKS = ("mma_sync", "exp2_fmul_fadd", "ex2_not_flushed", "fast_log", "reciprocal_rn")
COMBINE_CHECKS = ("expf_libdevice", "logf_libdevice")
_ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_FUNCTION = re.compile(r"^\s*Function : (\S+)", re.M)
_MANGLED = re.compile(rb"_ZN13pytorch_flash\d+flash_fwd\w+")  # the kernels' names in a cubin's string table


# -- reading the machine code -----------------------------------------------------------------------------

def instructions(body: str) -> list[tuple[str, str, list[str]]]:
    """(predicate, opcode, operands) of each instruction of a function's SASS."""
    found = []
    for text in _ADDRESS.findall(body):
        predicate = ""
        if text.startswith("@"):
            predicate, text = text.split(None, 1)
        opcode, _, rest = text.partition(" ")
        found.append((predicate, opcode, [o.strip() for o in rest.split(",")] if rest else []))
    return found


def immediate(operand: str) -> float | None:
    """The float an operand holds: a decimal immediate, or a 32-bit hex one taken as float32 bits."""
    operand = operand.strip()
    if re.fullmatch(r"-?\d+(\.\d+)?(e[-+]\d+)?", operand):
        return float(operand)
    if re.fullmatch(r"0x[0-9a-f]{1,8}", operand):
        return cuda_kernel.float32_from_bits(int(operand, 16))
    return None


def constants_of(opcode: str, operands: list[str]) -> list[float]:
    """The float32 constants an instruction brings: an FFMA/FMUL/FADD's immediates, a MOV's 32 bits, or the two
    halves `HFMA2.MMA Rd, -RZ, RZ, hi, lo` (how ptxas materialises a 32-bit constant: -0 * 0 + (hi, lo))."""
    if opcode in ("HFMA2", "HFMA2.MMA") and operands[1:3] == ["-RZ", "RZ"] and len(operands) == 5:
        halves = [immediate(o) for o in operands[3:]]
        if None in halves:
            return []
        hi, lo = (struct.unpack("<H", struct.pack("<e", h))[0] for h in halves)
        return [cuda_kernel.float32_from_bits(hi << 16 | lo)]
    if opcode.startswith(("FFMA", "FMUL", "FADD", "MOV", "IMAD.MOV", "UMOV")):
        return [v for v in map(immediate, operands[1:]) if v is not None]
    return []


def writer(code: list, index: int, register: str) -> tuple[tuple | None, bool]:
    """The last instruction before `index` that writes `register`, and whether a predicated FMUL of it by 0.5
    (exp2f's halving below -126) lies between: that one is passed over."""
    halved = False
    for i in range(index - 1, -1, -1):
        predicate, opcode, operands = code[i]
        if operands and operands[0] == register:
            if predicate and opcode == "FMUL" and operands[1:] == [register, "0.5"]:
                halved = True
                continue
            return code[i], halved
    return None, halved


def reader(code: list, index: int, register: str) -> tuple | None:
    """The first instruction after `index` that reads `register` (passing over the predicated FADD of -24 that
    __logf's subnormal branch applies to it), or None when it is overwritten or the function ends first."""
    for predicate, opcode, operands in code[index + 1:]:
        if predicate and opcode == "FADD" and operands == [register, register, "-24"]:
            continue
        if any(re.fullmatch(rf"-?\|?{register}(\.reuse)?\|?", o) for o in operands[1:]):
            return predicate, opcode, operands
        if operands and operands[0] == register:
            return None
    return None


def census(body: str) -> dict:
    """What the checks read in one function: the instruction counts, MUFU.EX2's argument writers, the guards."""
    code = instructions(body)
    counts = collections.Counter(opcode for _, opcode, _ in code)
    writers = collections.Counter()
    halved = 0
    for i, (_, opcode, operands) in enumerate(code):
        if opcode != "MUFU.EX2":
            continue
        found, guarded = writer(code, i, operands[1])
        writers[found[1] if found else "none"] += 1
        halved += guarded
    after_lg2 = []  # __logf: the multiplier of the first FMUL that reads MUFU.LG2's result
    for i, (_, opcode, operands) in enumerate(code):
        if opcode == "MUFU.LG2":
            found = reader(code, i, operands[0])
            if found and found[1] == "FMUL" and len(found[2]) == 3:
                after_lg2.append(immediate(found[2][2]))
    newton = 0  # rcp.rn: MUFU.RCP's result first read by FFMA(x, r, -1), the Newton step's residual
    for i, (_, opcode, operands) in enumerate(code):
        if opcode == "MUFU.RCP":
            found = reader(code, i, operands[0])
            newton += bool(found and found[1] == "FFMA" and found[2][-1] == "-1")
    constants = [value for _, opcode, operands in code for value in constants_of(opcode, operands)]
    return {"instructions": len(code), "counts": {k: counts[k] for k in sorted(counts) if k.startswith(
                ("MUFU", "HMMA", "HGMMA", "FFMA", "FMUL", "FADD", "F2FP"))},
            "ex2_argument_writers": dict(sorted(writers.items())), "ex2_halved": halved,
            "fmul_after_lg2": after_lg2, "rcp_with_newton": newton, "constants": constants}


def judge(kind: str, seen: dict) -> dict:
    """Each check of `kind` ("forward", "splitkv" or "combine") on one function's census: True, or why not."""
    counts, writers = seen["counts"], seen["ex2_argument_writers"]
    ex2 = counts.get("MUFU.EX2", 0)
    if kind == "combine":
        constants = seen["constants"]
        expf = [cuda_kernel.EXPF_T, 252.0, 12582913.0, *cuda_kernel.EXPF_LOG2E]
        logf = [abs(cuda_kernel.LOGF_POLY[0]), *cuda_kernel.LOGF_POLY[1:], cuda_kernel.LN2_F32]
        return {"expf_libdevice": all(c in constants for c in expf) and counts.get("FFMA.SAT", 0) > 0
                or f"libdevice expf's constants {[c for c in expf if c not in constants]} are not in it",
                "logf_libdevice": _in_order(logf, constants) and counts.get("MUFU.LG2", 0) == 0
                or "libdevice logf's polynomial (cuda_kernel.LOGF_POLY, then LN2_F32) is not in it in order"}
    hmma = [k for k in counts if k.startswith(("HMMA", "HGMMA"))]
    lg2 = seen["fmul_after_lg2"]
    return {
        "mma_sync": bool(hmma) and all(k.startswith("HMMA.16816.F32") for k in hmma) or f"tensor-core ops {hmma}",
        "exp2_fmul_fadd": ex2 > 0 and writers.get("FFMA", 0) == 0 and writers.get("FADD", 0) > 0
        or f"MUFU.EX2's arguments written by {writers}",
        "ex2_not_flushed": ex2 > 0 and seen["ex2_halved"] == ex2 or f"{seen['ex2_halved']} of {ex2} MUFU.EX2 guarded",
        "fast_log": bool(lg2) and all(v == cuda_kernel.LN2_F32 for v in lg2) or f"FMULs after MUFU.LG2 by {lg2}",
        "reciprocal_rn": counts.get("MUFU.RCP", 0) > 0 and seen["rcp_with_newton"] > 0
        or "no MUFU.RCP with a Newton step",
    }


def _in_order(wanted: list[float], constants: list[float]) -> bool:
    position = 0
    for value in constants:
        if position < len(wanted) and value == wanted[position]:
            position += 1
    return position == len(wanted)


# -- finding the kernels --------------------------------------------------------------------------------

def demangle(names: list[str]) -> list[str]:
    return subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout.splitlines()


def describe(demangled: str) -> dict | None:
    """kind, head dim, tiles and dtype of a pytorch_flash forward kernel, or None for another function or a
    variant the GPU grid never runs (dropout, local, ALiBi, softcap, returned softmax, appended KV)."""
    m = re.match(r"void pytorch_flash::(flash_fwd_kernel|flash_fwd_splitkv_kernel|flash_fwd_splitkv_combine_kernel)"
                 r"<Flash_fwd_kernel_traits<(\d+), (\d+), (\d+), (\d+), \w+, \w+, (cutlass::\w+), .*>, ([^<>]*)>\(", demangled)
    if not m:
        return None
    name, dim, block_m, block_n, warps, dtype, rest = m.groups()
    flags = [x.strip() for x in rest.split(",")]
    kind = {"flash_fwd_kernel": "forward", "flash_fwd_splitkv_kernel": "splitkv"}.get(name, "combine")
    if kind == "forward":  # Is_dropout, Is_causal, Is_local, Has_alibi, Is_even_MN, Is_even_K, Is_softcap, Return_softmax
        if flags[0] == "true" or flags[2] == "true" or flags[3] == "true" or flags[6] == "true" or flags[7] == "true":
            return None
        causal = flags[1] == "true"
    elif kind == "splitkv":  # Is_causal, Is_local, Has_alibi, Is_even_MN, Is_even_K, Is_softcap, Split, Append_KV
        if flags[1] == "true" or flags[2] == "true" or flags[5] == "true" or flags[7] == "true":
            return None
        causal = flags[0] == "true"
    else:
        causal = None
    precision = next((p for p, t in DTYPES.items() if t == dtype), None)
    return {"kind": kind, "dim": int(dim), "tiles": [int(block_m), int(block_n)], "warps": int(warps),
            "dtype": precision, "causal": causal}


def kernel_bodies(lib: Path, cuobjdump: str, arch: int, dims: list[int], dtypes: list[str]):
    """(description, demangled name, SASS) of every FA2 forward, split-KV and combine kernel of `lib` for
    sm_<arch> at those head dims and dtypes, a cubin at a time (its machine code is extracted to a scratch
    folder, removed when the generator ends or is closed)."""
    with scratch("numdev_kernel_sass_") as folder:
        run = subprocess.run([cuobjdump, "-xelf", "all", "-arch", f"sm_{arch}", str(lib)], cwd=folder,
                             capture_output=True, text=True)
        cubins = sorted(Path(folder).glob("*.cubin"))
        if not cubins:
            raise ValueError(f"{lib}: cuobjdump found no sm_{arch} machine code in it "
                             f"({one_line(run.stderr) or 'no cubin'}): is it torch's CUDA library?")
        for cubin in cubins:
            names = sorted({m.decode() for m in _MANGLED.findall(cubin.read_bytes())})
            wanted = {}
            for name, demangled in zip(names, demangle(names) if names else []):
                found = describe(demangled)
                if found and found["dim"] in dims and found["dtype"] in dtypes:
                    wanted[name] = (demangled, found)
            if wanted:  # only these functions' machine code: a cubin holds variants the grid never runs
                run = subprocess.run([cuobjdump, "-sass", "-fun", ",".join(wanted), str(cubin)], capture_output=True, text=True)
                if run.returncode:
                    raise ValueError(f"{lib}: cuobjdump could not disassemble {cubin.name} ({one_line(run.stderr)}): "
                                     "the library is damaged, or this cuobjdump is older than its machine code")
                sass = run.stdout
                parts = _FUNCTION.split(sass)
                for name, body in zip(parts[1::2], parts[2::2]):
                    demangled, found = wanted[name]
                    yield found, demangled, body
            cubin.unlink()


def read_kernels(lib: Path, cuobjdump: str, arch: int, dims: list[int], dtypes: list[str]) -> list[dict]:
    """Each kernel of kernel_bodies with its census and checks (a line each on stderr)."""
    records = []
    for found, demangled, body in kernel_bodies(lib, cuobjdump, arch, dims, dtypes):
        seen = census(body)
        checks = judge(found["kind"], seen)
        del seen["constants"]
        records.append({**found, "function": demangled[:400], "census": seen, "checks": checks})
        print(f"kernel_sass: {found['kind']} d={found['dim']} {found['dtype']} causal={found['causal']} "
              f"tiles {found['tiles']}: {'all hold' if all(v is True for v in checks.values()) else checks}",
              file=sys.stderr, flush=True)
    return records


def summarise(records: list[dict]) -> list[dict]:
    """Per kind, head dim and dtype: the kernels read and, per check, in how many it holds."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault((record["kind"], record["dim"], record["dtype"]), []).append(record)
    return [{"kind": kind, "dim": dim, "dtype": dtype, "kernels": len(group),
             "tiles": sorted({tuple(r["tiles"]) for r in group}),
             "holds": {check: sum(r["checks"][check] is True for r in group) for check in group[0]["checks"]}}
            for (kind, dim, dtype), group in sorted(groups.items())]


# -- the doc --------------------------------------------------------------------------------------------

def doc_table(reports: list[dict]) -> str:
    lines = ["Generated by `python scripts/kernel_sass.py --write-docs` from docs/results/kernel_sass_*.json, each "
             "written by `python scripts/kernel_sass.py --torch-lib <libtorch_cuda.so> --out <file>` (no GPU: the "
             "wheel's machine code, disassembled by Triton's cuobjdump). A cell: the kernels where the check holds, "
             "of those read.", "",
             "| torch (library SHA-256) | target | kernel | d | dtype | kernels | tiles (B_r x B_c) | "
             + " | ".join(f"`{c}`" for c in CHECKS + COMBINE_CHECKS) + " |",
             "| --- | --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in CHECKS + COMBINE_CHECKS) + " |"]
    for report in reports:
        for row in report["summary"]:
            cells = [f"{row['holds'][c]} of {row['kernels']}" if c in row["holds"] else "-" for c in CHECKS + COMBINE_CHECKS]
            tiles = ", ".join(f"{a} x {b}" for a, b in row["tiles"])
            lines.append(f"| {report['torch']} ({report['library_sha256'][:12]}) | {report['target']} | {row['kind']} "
                         f"| {row['dim']} | {row['dtype']} | {row['kernels']} | {tiles} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_docs() -> int:
    """Rewrite docs/gpu.md's table from the committed reports (nothing measured)."""
    from numdev.report.docblocks import write_results_table

    return write_results_table("kernel_sass", RESULTS, "kernel_sass_*.json", doc_table, DOC, "kernel-sass", REPO)


def main(argv=None) -> int:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-lib", default=None,
                        help="torch's libtorch_cuda.so (default: the installed torch's); the GPU image's: "
                             ".venv-gpu-image/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so")
    parser.add_argument("--arch", type=at_least(80), default=90,
                        help="the compute capability x 10 (default 90: H100/H200; FA2 is built for 80 and up)")
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128], choices=[64, 128])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--write-docs", action="store_true", help="read nothing: rewrite docs/gpu.md's table from "
                                                                  "docs/results/kernel_sass_*.json")
    args = parser.parse_args(argv)
    if args.write_docs:
        given = [f"--{name.replace('_', '-')}" for name in ("torch_lib", "out", "arch", "dims", "dtypes")
                 if getattr(args, name) != parser.get_default(name)]
        if given:
            parser.error(f"--write-docs reads no library and writes no JSON, so {', '.join(given)} would be ignored: "
                         "give it alone")
        return write_docs()
    lib = Path(args.torch_lib or torch_cuda_library()).resolve()
    if not lib.is_file():
        parser.exit(2, f"kernel_sass: error: {lib}: {'a folder, not a file' if lib.is_dir() else 'no such file'}: "
                       "torch's CUDA build has libtorch_cuda.so (a CPU-only torch does not); name one with --torch-lib\n")
    try:
        import triton

        cuobjdump = triton.knobs.nvidia.cuobjdump.path
    except (ImportError, AttributeError) as error:
        parser.exit(2, f"kernel_sass: error: no cuobjdump: Triton's wheel carries it ({one_line(error)})\n")
    missing = [tool for tool in (cuobjdump, "c++filt") if not tool or not shutil.which(tool)]
    if missing:
        parser.exit(2, f"kernel_sass: error: {', '.join(map(str, missing))} not found: cuobjdump comes with Triton's "
                       "wheel (or set TRITON_CUOBJDUMP_PATH), c++filt with binutils (apt-get install binutils)\n")
    version_file = lib.parent.parent / "version.py"
    version = re.search(r"__version__ = '([^']+)'", version_file.read_text()) if version_file.is_file() else None
    try:
        with StopOnSignal():  # the scratch folder (hundreds of MB of machine code) and cuobjdump go with a stop
            records = read_kernels(lib, cuobjdump, args.arch, args.dims, args.dtypes)
    except ValueError as error:
        parser.exit(2, f"kernel_sass: error: {one_line(error)}\n")
    except Stopped as stop:
        print(f"kernel_sass: stopped by {signal.Signals(stop.signum).name}: nothing written", file=sys.stderr)
        return 128 + stop.signum
    if not records:
        parser.exit(2, f"kernel_sass: error: {lib}: no FA2 forward kernel (pytorch_flash) for sm_{args.arch} at d = "
                       f"{' '.join(map(str, args.dims))}: this torch was built without them for this architecture\n")
    report = {"what": "torch's FA2 forward kernels' machine code against numdev's FA2 CUDA model (cuda_kernel)",
              "torch": version.group(1) if version else "unknown", "library": str(lib), "library_sha256": file_sha256(lib),
              "target": f"sm_{args.arch}", "cuobjdump": subprocess.run([cuobjdump, "--version"], capture_output=True,
                                                                      text=True).stdout.strip().splitlines()[-1],
              "model": {"LN2_F32": cuda_kernel.LN2_F32, "EXPF_T": cuda_kernel.EXPF_T, "EXPF_LOG2E": cuda_kernel.EXPF_LOG2E,
                        "LOGF_POLY": cuda_kernel.LOGF_POLY},
              "provenance": provenance(), "summary": summarise(records), "records": records}
    text = json.dumps(report, indent=1)
    if args.out:
        write_text(args.out, text + "\n")
    print(text)
    failed = [f"{r['kind']} d={r['dim']} {r['dtype']} causal={r['causal']} tiles {r['tiles']}: {check}: {why}"
              for r in records for check, why in r["checks"].items() if why is not True]
    for line in failed:
        print(f"kernel_sass: error: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    run_script(main)
