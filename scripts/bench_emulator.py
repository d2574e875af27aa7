"""How fast the flash emulator runs, against PyTorch's CPU flash kernel and the FP64 golden. JSON out.

    python scripts/bench_emulator.py                          # N = 1k, 4k, 16k; paper and fa2; 1 thread
    python scripts/bench_emulator.py --lengths 1024 --repeats 3 --out bench.json
    python scripts/bench_emulator.py --table docs/results/bench_emulator.json   # only rewrite the docs table
    python scripts/bench_emulator.py --presets --kernel-model --out docs/results/bench_kernel_model.json
                                              # only the cpu_sdpa model against the kernel it models

For every N and preset it times, on the same bf16-valued inputs (batch 1, 1 head, d = 64, tiles
64 x 64, no mask):
  flash_kernel      torch SDPA with SDPBackend.FLASH_ATTENTION on bf16 tensors (the anchor)
  golden            numdev's FP64 golden attention (the other anchor)
  matmul_floor      the emulator's two float32 matmuls per block alone, as it chunks them
  emulator          flash_emulated as sweeps run it (the defaults: C kernels where they apply,
                    query chunks; the paper preset's 16-bit scores take the C kernels, the fa2
                    preset's float32 scores do not and run eagerly)
  emulator_compiled the same with native=False, compile=True (torch.compile)
  emulator_eager    the same with native=False (ATen ops)
  before            the implementation before the speed work (tests/flash_reference.py)
and reports medians over repeats (wall clock and this thread's CPU time), each emulator path's
ratio to the flash kernel, and whether its outputs are bit-identical to `before`'s.

With --kernel-model it also times numdev's model of that kernel (numerics=cpu_sdpa,
tiles.rule=cpu_sdpa: default path, the fused C one calling the kernel's own BLAS GEMMs; and its
ATen path up to --aten-max) side by side with the kernel, call after call in turn, on bf16 inputs
(batch 1, `--heads` heads, d = 64), and reports the ratio of medians and the share of outputs that
are bit-identical to the kernel's.
The thread count is pinned (torch.set_num_threads) and recorded with the machine. On a shared
machine only the thread-CPU-time ratios mean much; rerun on a quiet one for the numbers you quote.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from numdev.cli.script_args import ScriptParser, run_script
from numdev.cli.script_args import seed as seed_type

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


def matmuls_only(q, k, v, block: int):
    """The emulator's two float32 matmuls per key/value block, alone, in the emulator's own query
    chunks: the floor any path keeping today's bits stands on (the scores stand in for P)."""
    import torch

    from numdev.attention import FlashEmulated
    from numdev.attention.flash_emulated import _row_chunks

    emulator = FlashEmulated(block_r=block, block_c=block)
    n_q, n_k = q.shape[2], k.shape[2]
    for rows in _row_chunks(n_q, emulator._chunk_rows(emulator.tiles(n_q, n_k, q.shape[-1]), v.shape[-1])):
        for start in range(0, n_k, block):
            probs = q[:, :, rows] @ k[:, :, start:start + block].transpose(-1, -2)
            probs @ v[:, :, start:start + block]
    return torch.empty(0)


def bench_length(n: int, presets, variant: str, dim: int, block: int, repeats: int, seed: int) -> dict:
    import torch
    import torch.nn.functional as F
    from flash_reference import reference_forward
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from numdev.attention import FlashEmulated, golden_attention
    from numdev.attention.checks import same_bits
    from numdev.numerics.stages import stage_formats

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
        row["matmul_floor"], _ = timed(lambda: matmuls_only(qf, kf, vf, block), repeats)
        row["matmul_floor"]["ratio_to_flash_kernel_wall_s"] = row["matmul_floor"]["wall_s"] / row["flash_kernel"]["wall_s"]
        for preset in presets:
            formats = stage_formats(preset, "bf16")
            tiles = {"block_r": block, "block_c": block, "variant": variant}
            paths = {
                "emulator": FlashEmulated(formats, **tiles),
                "emulator_compiled": FlashEmulated(formats, **tiles, native=False, compile=True),
                "emulator_eager": FlashEmulated(formats, **tiles, native=False),
            }
            cell = {}
            before_emulator = paths["emulator_eager"]
            cell["before"], before = timed(lambda e=before_emulator: reference_forward(e, qf, kf, vf, scale, False),
                                           repeats)
            for name, emulator in paths.items():
                cell[name], out = timed(lambda e=emulator: e(qf, kf, vf, scale=scale), repeats)
                cell[name]["bit_identical_to_before"] = same_bits(out, before)
                cell[name]["path"] = emulator.last_path
            for name in ("before", *paths):
                for clock in ("wall_s", "thread_cpu_s"):
                    cell[name][f"ratio_to_flash_kernel_{clock}"] = cell[name][clock] / row["flash_kernel"][clock]
            row[preset] = cell
    return row


def bench_kernel_model(n: int, dim: int, heads: int, repeats: int, seed: int, aten_max: int) -> dict:
    """numerics=cpu_sdpa against PyTorch's CPU flash kernel, timed in turn (kernel, model, kernel, ...)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from numdev.attention import FlashEmulated
    from numdev.attention.checks import same_bits
    from numdev.numerics.stages import stage_formats

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, n, dim, generator=g).bfloat16() for _ in range(3))

    def flash_kernel():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)

    paths = {"model": FlashEmulated(stage_formats("cpu_sdpa", "bf16"), tile_rule="cpu_sdpa")}
    if n <= aten_max:
        paths["model_aten"] = FlashEmulated(stage_formats("cpu_sdpa", "bf16"), tile_rule="cpu_sdpa", native=False)
    calls = {"flash_kernel": flash_kernel, **{name: (lambda e=e: e(q, k, v)) for name, e in paths.items()}}
    outputs = {name: call() for name, call in calls.items()}  # warm-up (builds the C kernels once)
    wall = {name: [] for name in calls}
    with torch.no_grad():
        for _ in range(repeats):
            for name, call in calls.items():
                start = time.perf_counter()
                outputs[name] = call()
                wall[name].append(time.perf_counter() - start)
    kernel_out = outputs["flash_kernel"]
    row = {"n": n, "heads": heads, "dim": dim, "repeats": repeats,
           "flash_kernel": {"wall_s": statistics.median(wall["flash_kernel"]), "wall_s_all": wall["flash_kernel"]}}
    for name, emulator in paths.items():
        out = outputs[name]
        row[name] = {
            "wall_s": statistics.median(wall[name]), "wall_s_all": wall[name], "path": emulator.last_path,
            "ratio_to_flash_kernel_wall_s": statistics.median(wall[name]) / row["flash_kernel"]["wall_s"],
            "bit_identical_to_kernel_fraction": float((out.view(torch.int16) == kernel_out.view(torch.int16)).double().mean()),
        }
    if "model_aten" in row:
        row["model_aten"]["bit_identical_to_model"] = same_bits(outputs["model_aten"], outputs["model"])
    return row


def main() -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--presets", nargs="*", default=["paper", "fa2"], help="none: skip the preset table")
    parser.add_argument("--kernel-model", action="store_true",
                        help="also time numerics=cpu_sdpa (the model of the kernel) side by side with the kernel")
    parser.add_argument("--heads", type=int, default=1, help="heads of the --kernel-model inputs")
    parser.add_argument("--aten-max", type=int, default=4096, help="--kernel-model: time its ATen path up to this N")
    parser.add_argument("--variant", default="fa2", choices=["fa2", "fa1"])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=64, help="B_r = B_c of the emulator")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (3 at N >= 16k)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=seed_type, default=0)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "microbenchmark.md",
                        help="the doc whose block `emulator-speed` gets the table (with --out or --table)")
    parser.add_argument("--no-docs", action="store_true", help="write only the JSON (a variant run)")
    parser.add_argument("--table", type=Path, help="no timing: write the docs table from this JSON")
    args = parser.parse_args()
    if args.table or (args.out and not args.no_docs):  # before any timing: the doc can take the block(s)
        from numdev.report.docblocks import check_blocks

        check_blocks(*([(args.docs, "emulator-speed")] if args.table or args.lengths else []),
                     *([(args.docs, "kernel-model-speed")] if args.kernel_model and not args.table else []))
    if args.table:
        from numdev.runs.atomic import read_json
        from numdev.runs.schemas import result_fields

        with result_fields(args.table, "bench_emulator.py JSON"):  # the table is rendered whole before the block is written
            write_table(read_json(args.table, "bench_emulator.py JSON"), args.docs, args.table)
        return

    import torch

    from numdev.runs.provenance import provenance

    torch.set_num_threads(args.threads)
    report = {
        "what": "flash emulator speed vs PyTorch's CPU flash kernel (bf16) and the FP64 golden",
        "machine": machine(torch.get_num_threads()),
        "provenance": provenance(seeds=[args.seed], threads=torch.get_num_threads()),  # commit, versions, CPU flags
        "shape": {"batch": 1, "heads": 1, "dim": args.dim, "causal": False},
        "precision": "bf16",
        "variant": args.variant,
        "tiles": {"block_r": args.block, "block_c": args.block},
        "seed": args.seed,
        "lengths": [],
        "compiler": os.environ.get("CC"),  # the C kernels' compiler, when not the system cc
    }
    for n in args.lengths if args.presets else []:
        repeats = args.repeats if n < 16384 else min(args.repeats, 3)
        row = bench_length(n, args.presets, args.variant, args.dim, args.block, repeats, args.seed)
        row["repeats"] = repeats
        report["lengths"].append(row)
        summary = {p: round(row[p]["emulator"]["ratio_to_flash_kernel_thread_cpu_s"], 2) for p in args.presets}
        print(f"N={n}: emulator / flash kernel (thread CPU time) {summary}", file=sys.stderr, flush=True)
    if args.kernel_model:
        report["kernel_model"] = []
        for n in args.lengths:
            row = bench_kernel_model(n, args.dim, args.heads, args.repeats, args.seed, args.aten_max)
            report["kernel_model"].append(row)
            print(f"N={n}: cpu_sdpa model / flash kernel (wall) {row['model']['ratio_to_flash_kernel_wall_s']:.2f} "
                  f"({row['model']['path']}), {row['model']['bit_identical_to_kernel_fraction']:.6%} bit-identical",
                  file=sys.stderr, flush=True)
    report["machine"]["load_average_1min_at_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    text = json.dumps(report, indent=2)
    if args.out:
        from numdev.runs.atomic import write_text

        write_text(args.out, text + "\n")
        if not args.no_docs and report["lengths"]:
            write_table(report, args.docs, args.out)
        if not args.no_docs and args.kernel_model:
            write_kernel_model_table(report, args.docs, args.out)
    print(text)


PATHS = {"before": "before the speed work", "emulator_eager": "eager (ATen)",
         "emulator_compiled": "`attention.compile=true`", "emulator": "default (C kernels where they apply)"}


def write_table(report: dict, docs: Path, source: Path) -> None:
    """The ratios to the flash kernel as a markdown table, into docs' block `emulator-speed`."""
    from numdev.report.docblocks import replace_block

    machine = report["machine"]
    lines = [
        f"Generated from `{source.resolve().relative_to(ROOT) if source.resolve().is_relative_to(ROOT) else source}` "
        f"(commit {(report.get('provenance', {}).get('git', {}).get('commit') or '?')[:10]}, "
        f"{(report.get('provenance', {}).get('date') or '?')[:10]}): "
        f"{machine['cpu']}, {machine['logical_cpus']} logical CPUs, {machine['torch_threads']} torch thread, "
        f"load average {machine['load_average_1min']:.2f} at the start, torch {machine['torch']}; "
        f"medians of {report['lengths'][0].get('repeats', '?')} calls (3 at N = 16k), seed {report['seed']}, "
        f"variant {report['variant']}, tiles {report['tiles']['block_r']}x{report['tiles']['block_c']}. "
        "Each cell: the path's wall time over the flash kernel's, and which implementation ran.",
        "",
        "| preset | N | " + " | ".join(PATHS.values()) + " | matmuls alone | flash kernel | all bit-identical |",
        "| --- | --- | " + " | ".join("---" for _ in PATHS) + " | --- | --- | --- |",
    ]
    for row in report["lengths"]:
        for preset in [key for key in row if isinstance(row[key], dict) and "before" in row[key]]:
            cell = row[preset]
            ratios = [f"{cell[path]['ratio_to_flash_kernel_wall_s']:.1f}x"
                      + (f" ({cell[path]['path']})" if "path" in cell[path] else "") for path in PATHS]
            identical = all(cell[path].get("bit_identical_to_before", True) for path in PATHS)
            lines.append(f"| {preset} | {row['n']} | " + " | ".join(ratios)
                         + f" | {row['matmul_floor']['ratio_to_flash_kernel_wall_s']:.1f}x"
                         + f" | {row['flash_kernel']['wall_s'] * 1e3:.1f} ms | {'yes' if identical else '**no**'} |")
    lines += ["", *speed_sentences(report)]
    replace_block(docs, "emulator-speed", "\n".join(lines))


TARGET = 5.0  # the default path's time over the flash kernel's at the largest N (issue 11)


def speed_sentences(report: dict) -> list[str]:
    """What the table says at the largest N, each number read from the report: the calls behind the
    default path's ratio, the matmuls' share of it, and whether the target is met on this machine."""
    row = max(report["lengths"], key=lambda row: row["n"])
    kernel = row["flash_kernel"]

    def milliseconds(cell):
        return ", ".join(f"{seconds * 1e3:.0f}" for seconds in sorted(cell["wall_s_all"]))

    sentences = []
    for preset in [key for key in row if isinstance(row[key], dict) and "before" in row[key]]:
        cell = row[preset]
        default = cell["emulator"]
        ratio = default["ratio_to_flash_kernel_wall_s"]
        verdict = "met" if ratio <= TARGET else "**not met**"
        sentences.append(
            f"- `{preset}` at N = {row['n']}: the default path ({default['path']}) took {milliseconds(default)} ms "
            f"against the flash kernel's {milliseconds(kernel)} ms, **{ratio:.1f}x** by medians (the target, "
            f"at most {TARGET:g}x: {verdict} on this machine), from {cell['before']['ratio_to_flash_kernel_wall_s']:.1f}x "
            f"before the speed work; the two float32 matmuls alone are "
            f"{row['matmul_floor']['ratio_to_flash_kernel_wall_s']:.1f}x.")
    return sentences


def write_kernel_model_table(report: dict, docs: Path, source: Path) -> None:
    """The cpu_sdpa model's time over the kernel's, into docs' block `kernel-model-speed`."""
    from numdev.report.docblocks import replace_block

    machine = report["machine"]
    provenance = report.get("provenance", {})
    lines = [
        f"Generated from `{source.resolve().relative_to(ROOT) if source.resolve().is_relative_to(ROOT) else source}` "
        f"(commit {(provenance.get('git', {}).get('commit') or '?')[:10]}, {(provenance.get('date') or '?')[:10]}): "
        f"{machine['cpu']}, {machine['logical_cpus']} logical CPUs, {machine['torch_threads']} torch thread(s), "
        f"load average {machine['load_average_1min']:.2f} at the start and "
        f"{machine.get('load_average_1min_at_end') or float('nan'):.2f} at the end, torch {machine['torch']}; bf16, "
        f"batch 1, {report['kernel_model'][0]['heads']} head(s), d = {report['kernel_model'][0]['dim']}, no mask, "
        f"seed {report['seed']}; medians of {report['kernel_model'][0]['repeats']} calls, kernel and model in turn.",
        "",
        "| N | flash kernel | cpu_sdpa model (default path) | model / kernel | bit-identical to the kernel | ATen path / kernel |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["kernel_model"]:
        model = row["model"]
        aten = row.get("model_aten")
        aten_text = (f"{aten['ratio_to_flash_kernel_wall_s']:.1f}x"
                     + ("" if aten.get("bit_identical_to_model") else " (**bits differ**)")) if aten else "not timed"
        lines.append(f"| {row['n']} | {row['flash_kernel']['wall_s'] * 1e3:.1f} ms | {model['wall_s'] * 1e3:.1f} ms "
                     f"({model['path']}) | {model['ratio_to_flash_kernel_wall_s']:.2f}x | "
                     f"{model['bit_identical_to_kernel_fraction']:.4%} | {aten_text} |")
    replace_block(docs, "kernel-model-speed", "\n".join(lines))


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
    run_script(main)
