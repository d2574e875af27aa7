"""bf16 vs fp16 as the study's low precision: what each costs per training step here, and how far
each deviates in one attention call (phase 1 at the study's own attention shapes). Prints JSON.

    python scripts/study_precision.py                 # JSON to stdout; --write-docs fills docs/study.md's block
    python scripts/study_precision.py --write-docs --out docs/results/study_precision.json
    python scripts/study_precision.py --steps 10 --threads 2

Deviations: eager attention (the study's reference) and PyTorch's CPU flash kernel, each against
the FP64 golden value and against each other, on N(0,1) inputs rounded to the format, mean over
seeds with a 95% bootstrap interval. Step times: the median of --steps training steps of the
study's model (conf/train/experiment/flash_stability) per precision, after 2 warm-up steps, written to
the JSON and, with --write-docs, under the table with the machine they were taken on.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import statistics
import sys
from pathlib import Path

import torch

from numdev.attention import Eager, SdpaFlash, golden_attention
from numdev.cli.script_args import ScriptParser, run_script
from numdev.report.docblocks import check_blocks, replace_block
from numdev.runs.atomic import write_text
from numdev.runs.provenance import provenance
from numdev.stats.intervals import mean_interval

REPO = Path(__file__).resolve().parents[1]
DOC, BLOCK = REPO / "docs" / "study.md", "study-precision"
sys.path.insert(0, str(REPO / "scripts"))
# (label, batch, heads, n_q, n_k, head dim): the study model's attention calls, and a long one for contrast
SHAPES = [
    ("image self-attention (dit_study)", 32, 4, 16, 16, 16),
    ("text self-attention (dit_study)", 32, 2, 24, 24, 16),
    ("long: N=1024, d=64", 1, 4, 1024, 1024, 64),
]
FORMATS = {"bf16": (torch.bfloat16, "bf16-mixed"), "fp16": (torch.float16, "fp16-mixed")}


def deviations(seeds: int) -> list[dict]:
    rows = []
    for label, b, h, nq, nk, d in SHAPES:
        for name, (dtype, precision) in FORMATS.items():
            values = {"eager_vs_fp64": [], "flash_vs_fp64": [], "flash_vs_eager": []}
            for seed in range(seeds):
                g = torch.Generator().manual_seed(seed)
                q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64).to(dtype) for n in (nq, nk, nk))
                golden = golden_attention(q.double(), k.double(), v.double())
                eager = Eager(precision=precision)(q, k, v).double()
                flash = SdpaFlash()(q, k, v).double()
                values["eager_vs_fp64"].append(float((eager - golden).abs().max()))
                values["flash_vs_fp64"].append(float((flash - golden).abs().max()))
                values["flash_vs_eager"].append(float((flash - eager).abs().max()))
            rows.append({"shape": label, "format": name, **{k: mean_interval(v).as_dict() for k, v in values.items()}})
    return rows


def step_times(steps: int) -> dict:
    from bench_train_step import setup, time_steps

    out = {}
    for precision in ("fp32", "bf16-mixed", "fp16-mixed"):
        overrides = ["model=dit_study", "data.resolution=16", f"precision={precision}", "attention=eager"]
        _, module, optimizer, plugin, batch = setup(overrides, torch.device("cpu"))
        times = time_steps(module, optimizer, plugin, batch, steps, 2, torch.device("cpu"))
        out[precision] = {"median_s": statistics.median(times), "steps": steps}
    return out


def table(rows: list[dict]) -> str:
    def cell(e):
        return f"{e['value']:.2e} [{e['low']:.2e}, {e['high']:.2e}]"

    lines = ["| attention call | format | eager vs FP64 (max) | CPU flash vs FP64 (max) | flash vs eager (max) |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['shape']} | {r['format']} | {cell(r['eager_vs_fp64'])} | {cell(r['flash_vs_fp64'])} | {cell(r['flash_vs_eager'])} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = ScriptParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="training steps timed per precision (0: skip)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--write-docs", action="store_true", help="write the deviation table into docs/study.md")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    if args.write_docs:
        check_blocks((DOC, BLOCK))
    torch.set_num_threads(args.threads)
    rows = deviations(args.seeds)
    result = {"provenance": provenance(seeds=range(args.seeds), threads=args.threads), "deviations": rows}
    if args.steps:
        result["step_seconds"] = step_times(args.steps)
    if args.out:
        write_text(args.out, json.dumps(result, indent=1) + "\n")
    if args.write_docs:
        replace_block(
            DOC, BLOCK,
            f"Generated by `.venv/bin/python scripts/study_precision.py --write-docs --out docs/results/study_precision.json` "
            f"(max |Δ| per call, mean over {args.seeds} seeds [95% bootstrap interval]):\n\n" + table(rows)
            + step_cost_line(result),
        )
    print(json.dumps(result, indent=1))


def step_cost_line(result: dict) -> str:
    """The measured training-step cost per precision, with the machine it was measured on."""
    steps = result.get("step_seconds")
    if not steps:
        return ""
    machine = result["provenance"]["machine"]
    costs = ", ".join(f"{precision} {entry['median_s']:.3f} s" for precision, entry in steps.items())
    ratio = steps["fp16-mixed"]["median_s"] / steps["bf16-mixed"]["median_s"]
    return (f"\n\nOne training step of the study's model (dit_study at 16x16, eager attention, the study's batch; "
            f"median of {next(iter(steps.values()))['steps']} steps after 2 warm-up steps; {machine['cpu']}, "
            f"{machine['torch_threads']} torch thread, {result['provenance']['date'][:10]}): {costs}; "
            f"fp16-mixed / bf16-mixed = {ratio:.2f}x.")


if __name__ == "__main__":
    run_script(main)
