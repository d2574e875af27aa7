"""Write every number in docs/gemm.md from runs: the three GEMM figures and the real kernels' bits.

    python scripts/gemm_results.py --run demo      # run gemm_formats, gemm_k, gemm_scaling at demo size first
    python scripts/gemm_results.py --run full      # ... at full size (each experiment's defaults)
    python scripts/gemm_results.py                 # read the latest runs under outputs/
    python scripts/gemm_results.py --rejudge       # runs nothing: re-judge docs/results/gemm.json by today's rules

Then it checks the real kernels against their emulation bit for bit over several shapes (ragged
ones too) and seeds (torch._scaled_mm with e4m3/e5m2 operands, tensor and row scales, FP32 and
bf16 outputs; a torch.compile'd matmul; an FP32 matmul under set_float32_matmul_precision("medium")),
writes docs/results/gemm.json (with numdev.runs.provenance, and the wall and CPU seconds of each
experiment it ran, and the load average then: the demo's budget) and fills the generated blocks
`gemm-results` and `gemm-kernels` of docs/gemm.md (numdev.report.docblocks). Prints the JSON.
--rejudge re-judges the committed gemm.json's verdicts (numdev.figures.common.rejudged: a verdict
that quotes a range from fewer than 5 seeds carries none), rewrites it with every number as it was
and a `rejudged` note, and fills `gemm-results` from it.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import os
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from numdev.cli.script_args import ScriptParser, run_script
from numdev.figures import FIGURES
from numdev.figures.common import rejudge_results, rejudged_note
from numdev.gemm.emulated import emulated_matmul
from numdev.gemm.golden import golden_matmul
from numdev.gemm.kernels import Compiled, MatmulPrecision, ScaledMM
from numdev.report.docblocks import check_blocks, replace_block
from numdev.runs.atomic import read_json, write_json
from numdev.runs.provenance import machine_line, provenance
from numdev.runs.schemas import read_figure_summary, result_fields

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "gemm.md"
GEMM_FIGURES = ("gemm_formats", "gemm_k", "gemm_scaling")
SHAPES = {"square": (64, 512, 64), "ragged": (7, 1000, 33), "long-k": (16, 8192, 16), "wide": (256, 256, 96)}
SEEDS = (0, 1, 2)
KERNELS = {
    "scaled_mm e4m3 tensor fp32": lambda: ScaledMM("fp8_e4m3", "fp8_e4m3", "tensor", "fp32"),
    "scaled_mm e4m3 tensor bf16": lambda: ScaledMM("fp8_e4m3", "fp8_e4m3", "tensor", "bf16"),
    "scaled_mm e4m3 row fp32": lambda: ScaledMM("fp8_e4m3", "fp8_e4m3", "row", "fp32"),
    "scaled_mm e5m2 x e4m3 tensor fp32": lambda: ScaledMM("fp8_e5m2", "fp8_e4m3", "tensor", "fp32"),
    "compiled fp32 matmul": Compiled,
    "matmul precision medium (model: bf16 operands, FP32 accumulation)": lambda: MatmulPrecision("medium"),
}


def latest_run(outputs: Path, name: str) -> Path | None:
    runs = sorted((p.parent for p in (outputs / "bench" / name).glob(f"*/{name}.json")), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def run_figure(outputs: Path, name: str, profile: str) -> dict:
    """Run one experiment as numdev-demo does; its wall and CPU seconds (children's user + system)."""
    overrides = list(FIGURES[name].demo_overrides) if profile == "demo" else []
    print(f"numdev-bench experiment={name} {' '.join(overrides)}".rstrip(), file=sys.stderr, flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "numdev.bench.app", f"experiment={name}", f"output_root={outputs}", *overrides],
                   check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"overrides": overrides, "wall_s": round(time.perf_counter() - start, 2), "cpu_s": round(cpu, 2),
            "load_average_1min_after": round(os.getloadavg()[0], 2)}


def command_of(run: Path, name: str) -> str:
    import yaml

    task = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text()) or []
    task = [str(o) for o in task if not str(o).startswith(("output_root=", "experiment="))]
    return " ".join([".venv/bin/numdev-bench", f"experiment={name}", *task])


def collect(outputs: Path) -> dict:
    figures = {}
    for name in GEMM_FIGURES:
        run = latest_run(outputs, name)
        if run is None:
            print(f"gemm_results: no finished run of {name} under {outputs}/bench/{name}: skipped", file=sys.stderr)
            continue
        summary = read_figure_summary(run / f"{name}.json")
        figures[name] = {"run": str(run.relative_to(outputs)), "command": command_of(run, name),
                         **{k: summary.get(k) for k in ("caption", "status", "verdict", "verdict_rule", "provenance")}}
    return figures


def kernel_bits() -> dict:
    """Per kernel: the share of outputs bit-identical to its emulation, per shape (worst seed), overall."""
    out = {}
    for label, make in KERNELS.items():
        kernel = make()
        per_shape, total, same, worst_gap, worst_bound = {}, 0, 0, 0.0, 0.0
        for shape_name, (m, k, n) in SHAPES.items():
            shares = []
            for seed in SEEDS:
                g = torch.Generator().manual_seed(seed)
                a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
                with torch.no_grad():
                    got = kernel(a, b)
                    model = emulated_matmul(a, b, kernel.model).to(got.dtype)
                equal = int((got == model).sum())
                shares.append(equal / got.numel())
                total, same = total + got.numel(), same + equal
                worst_gap = max(worst_gap, float((got.double() - model.double()).abs().max()))
                # The kernel's error against FP64 over FP32's worst-case bound gamma_K |A||B| (Higham, Thm 3.5).
                bound = k * 2.0**-24 / (1 - k * 2.0**-24) * (a.double().abs() @ b.double().abs())
                worst_bound = max(worst_bound, float(((got.double() - golden_matmul(a, b)).abs() / bound).max()))
            per_shape[shape_name] = min(shares)
        out[label] = {"bit_identical_worst_seed": per_shape, "bit_identical_overall": same / total, "max_abs_vs_model": worst_gap,
                      "max_error_over_fp32_gamma_bound": worst_bound}
    return out


def _cell(text) -> str:
    return str(text or "").replace("|", "\\|").replace("\n", " ")


def results_block(figures: dict, result: dict | None = None) -> str:
    lines = ["| figure | claim | verdict (by its stated rule) |", "| --- | --- | --- |"]
    lines += [f"| {FIGURES[n].title} | {_cell(FIGURES[n].claim)} | {_cell(f['verdict'])} |" for n, f in figures.items()]
    captions = "\n".join(f"- **{FIGURES[n].title}** — {_cell(f['caption'])}" for n, f in figures.items())
    machines = sorted({machine_line(f["provenance"]) for f in figures.values() if f.get("provenance")})
    commands = "; ".join(f"`{f['command']}`" for f in figures.values())
    again = rejudged_note(result or {}, ".venv/bin/python scripts/gemm_results.py --rejudge")
    return (f"{chr(10).join(lines)}\n\n{captions}\n\nGenerated by `.venv/bin/python scripts/gemm_results.py --run demo` from "
            f"{commands} on: {' / '.join(machines)}. Verdict rules: numdev.stats.verdicts; intervals: numdev.stats.intervals." + again)


def kernels_block(bits: dict, prov: dict) -> str:
    shapes = list(SHAPES)
    lines = ["| kernel | " + " | ".join(f"{s} {'x'.join(map(str, SHAPES[s]))}" for s in shapes)
             + " | overall | max \\|kernel − model\\| | max error / FP32's γ_K bound |",
             "| --- |" + " --- |" * (len(shapes) + 3)]
    for label, b in bits.items():
        cells = " | ".join(f"{b['bit_identical_worst_seed'][s]:.2%}" for s in shapes)
        lines.append(f"| {label} | {cells} | {b['bit_identical_overall']:.4%} | {b['max_abs_vs_model']:.3g} "
                     f"| {b['max_error_over_fp32_gamma_bound']:.3g} |")
    return ("\n".join(lines) + f"\n\nShare of outputs bit-identical to the emulation (M x K x N; worst of seeds {list(SEEDS)}; "
            "N(0, 1) operands); the last column: the largest |kernel − FP64 golden| over γ_K |A||B| (γ_K = Ku/(1 − Ku), "
            "u = 2^-24: the worst case of any FP32 dot product; above 1 only with coarser operands, as FP8's). "
            f"Generated by `.venv/bin/python scripts/gemm_results.py` on {machine_line(prov)}.")


def main() -> None:
    parser = ScriptParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--outputs", default=str(ROOT / "outputs"))
    parser.add_argument("--run", choices=("demo", "full"), help="run the three GEMM figures first, at this size")
    parser.add_argument("--no-docs", action="store_true", help="write docs/results/gemm.json only")
    parser.add_argument("--rejudge", action="store_true",
                        help="run nothing: re-judge docs/results/gemm.json's verdicts by today's rules, then fill gemm-results from it")
    args = parser.parse_args()
    if not args.no_docs:
        check_blocks(*((DOC, block) for block in (("gemm-results",) if args.rejudge else ("gemm-results", "gemm-kernels"))))
    if args.rejudge:
        path = ROOT / "docs" / "results" / "gemm.json"
        with result_fields(path, "GEMM result"):  # rejudged and rendered whole before anything is written
            result = rejudge_results(read_json(path, "GEMM result"), datetime.now(timezone.utc).isoformat(timespec="seconds"))
            figures = {name: result["figures"][name] for name in GEMM_FIGURES if name in result["figures"]}  # the figures' order
            text = None if args.no_docs else results_block(figures, result)
            status = {n: f["status"] for n, f in result["figures"].items()}
        write_json(path, result)
        if text is not None:
            replace_block(DOC, "gemm-results", text)
        print(json.dumps({"status": status, "rejudged": result.get("rejudged")}, indent=2))
        return
    outputs = Path(args.outputs)
    timings = {name: run_figure(outputs, name, args.run) for name in GEMM_FIGURES} if args.run else {}
    figures = collect(outputs)
    if not figures:
        sys.exit(f"gemm_results: no GEMM runs under {outputs}: run `.venv/bin/python scripts/gemm_results.py --run demo`")
    prov = provenance(seeds=list(SEEDS))
    bits = kernel_bits()
    result = {"provenance": prov, "profile": args.run, "timings": timings, "figures": figures, "kernels": bits}
    write_json(ROOT / "docs" / "results" / "gemm.json", result)
    if not args.no_docs:
        replace_block(DOC, "gemm-results", results_block(figures))
        replace_block(DOC, "gemm-kernels", kernels_block(bits, prov))
    print(json.dumps({"timings": timings, "status": {n: f["status"] for n, f in figures.items()},
                      "kernels": {k: v["bit_identical_overall"] for k, v in bits.items()}}, indent=2))


if __name__ == "__main__":
    run_script(main)
