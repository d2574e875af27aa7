"""What stochastic rounding changes against round-to-nearest: a GEMM's accumulator and Flash's bias.

    .venv/bin/python scripts/rounding_results.py                 # runs the four bench commands, prints JSON
    .venv/bin/python scripts/rounding_results.py --write-docs    # also docs/results/rounding_modes.json and
                                                                 # the rounding-results block of docs/microbenchmark.md
    .venv/bin/python scripts/rounding_results.py --write-docs --runs-from docs/results/rounding_modes.json
                                                                 # summarise those runs again (they stay under outputs/)

Four `numdev-bench` runs (the bench's own loop, records and inputs; nothing measured here):
  gemm_k with bf16 operands summed one product at a time in a bf16 accumulator (e8m7) or a 14-bit one
  (e8m13), each rounding to nearest, toward zero and stochastically (:sr, 16 random bits), on N(0, 1)
  operands and on U[0, 1) operands (every product positive: a running sum whose increments all have
  one sign, where rounding to nearest stagnates), K = 64 ... 4096;
  bias (Flash and Baseline against FP64, paper-like: U[0, 1) inputs, FA1, every stage in bf16) with
  every stage rounding to nearest (numerics.precision=bf16) and stochastically (bf16:sr).
10 seeds each. Per K (per N), the ratio of the relative RMS errors stochastic / nearest, paired by
seed (numdev.stats.intervals.log_ratio_interval: LOG_RULE), and each mode's mean signed error with
its 95% bootstrap interval (RULE). Reading: stochastic rounding "helps" where the ratio's interval
lies below 1, "hurts" where above, else not told apart.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from numdev.cli.errors import one_line
from numdev.cli.script_args import ScriptParser, run_script
from numdev.report.docblocks import check_blocks, replace_block
from numdev.runs.atomic import read_json, read_jsonl, write_json
from numdev.runs.provenance import machine_line, provenance
from numdev.stats import intervals as stats

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "docs" / "results" / "rounding_modes.json"
DOC = REPO / "docs" / "microbenchmark.md"
SEEDS = "seeds=[0,1,2,3,4,5,6,7,8,9]"
ACCUMULATORS = {"bf16 (e8m7)": "e8m7", "14 bits (e8m13)": "e8m13"}
MODES = {"nearest": "", "toward zero": ":rtz", "stochastic": ":sr"}
GEMM_METHODS = [f"+runner.methods.{fmt}_{mode.replace(' ', '_')}={{kind: emulated, preset: bf16, accum: \"{fmt}{suffix}\", order: sequential}}"
                for fmt in ACCUMULATORS.values() for mode, suffix in MODES.items()]
RUNS = {
    "gemm normal": ["experiment=gemm_k", SEEDS, "runner.ks=[64,256,1024,4096]", *GEMM_METHODS],
    "gemm uniform": ["experiment=gemm_k", SEEDS, "runner.ks=[64,256,1024,4096]", "runner.activations={generator: uniform}",
                     "runner.weights={generator: uniform}", *GEMM_METHODS],
    "bias nearest": ["experiment=bias", SEEDS, "numerics.precision=bf16"],
    "bias stochastic": ["experiment=bias", SEEDS, "numerics.precision=bf16:sr"],
}


def run(outputs: Path, label: str) -> Path:
    before = set(outputs.glob("bench/*/*/results.jsonl"))
    print(f"numdev-bench {' '.join(RUNS[label])}", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "numdev.bench.app", *RUNS[label], f"output_root={outputs}"], check=True, stdout=subprocess.DEVNULL)
    (new,) = set(outputs.glob("bench/*/*/results.jsonl")) - before
    return new


def records(path: Path) -> list[dict]:
    rows = read_jsonl(path)
    if not rows:
        raise ValueError(f"{path}: no records: the run wrote none (rerun it)")
    return rows


def by(rows: list[dict], key, metric: str) -> dict:
    """{(method, size): {seed: metric}} for the records against FP64."""
    out = defaultdict(dict)
    for r in rows:
        if r.get("kind") == "vs_golden":
            out[(r["method"], key(r))][r["seed"]] = r["metrics"][metric]
    return out


def paired(a: dict, b: dict) -> tuple[list, list]:
    seeds = sorted(set(a) & set(b))
    return [a[s] for s in seeds], [b[s] for s in seeds]


def reading(ratio: stats.Estimate) -> str:
    if not ratio.has_interval or ratio.method == stats.RANGE:
        return "not told apart (no interval)"
    return "stochastic helps" if ratio.high < 1 else "stochastic hurts" if ratio.low > 1 else "not told apart"


def summarise(paths: dict[str, Path]) -> dict:
    out = {"gemm": [], "bias": []}
    for inputs in ("normal", "uniform"):
        err = by(records(paths[f"gemm {inputs}"]), lambda r: r["shape"]["k"] if "shape" in r else r["k"], "rel_rmse")
        signed = by(records(paths[f"gemm {inputs}"]), lambda r: r["shape"]["k"] if "shape" in r else r["k"], "mean_signed")
        for label, fmt in ACCUMULATORS.items():
            for k in sorted({size for (_, size) in err}):
                near, rtz, sr = (err[(f"{fmt}_{m.replace(' ', '_')}", k)] for m in MODES)  # MODES' order
                ratio = stats.log_ratio_interval(*paired(sr, near))
                out["gemm"].append({
                    "inputs": inputs, "accumulator": label, "k": k, "seeds": len(near),
                    **{f"rel_rmse_{m.replace(' ', '_')}": stats.replicate_spread(list(v.values())).as_dict()
                       for m, v in zip(MODES, (near, rtz, sr))},
                    **{f"mean_signed_{m.replace(' ', '_')}": stats.replicate_spread(list(signed[(f"{fmt}_{m.replace(' ', '_')}", k)].values())).as_dict()
                       for m in MODES},
                    "ratio_stochastic_to_nearest": ratio.as_dict(), "ratio_text": ratio.text(".2g", "x"), "reading": reading(ratio)})
    near_rows, sr_rows = records(paths["bias nearest"]), records(paths["bias stochastic"])
    for method in ("whole", "baseline"):
        err_n, err_s = by(near_rows, lambda r: r["shape"]["seq_q"], "rel_rmse"), by(sr_rows, lambda r: r["shape"]["seq_q"], "rel_rmse")
        sig_n, sig_s = by(near_rows, lambda r: r["shape"]["seq_q"], "mean_signed"), by(sr_rows, lambda r: r["shape"]["seq_q"], "mean_signed")
        for n in sorted({size for (m, size) in err_n if m == method}):
            ratio = stats.log_ratio_interval(*paired(err_s[(method, n)], err_n[(method, n)]))
            out["bias"].append({
                "method": "Flash" if method == "whole" else "Baseline (the paper's)", "n": n, "seeds": len(err_n[(method, n)]),
                "mean_signed_nearest": stats.replicate_spread(list(sig_n[(method, n)].values())).as_dict(),
                "mean_signed_stochastic": stats.replicate_spread(list(sig_s[(method, n)].values())).as_dict(),
                "rel_rmse_nearest": stats.replicate_spread(list(err_n[(method, n)].values())).as_dict(),
                "rel_rmse_stochastic": stats.replicate_spread(list(err_s[(method, n)].values())).as_dict(),
                "ratio_stochastic_to_nearest": ratio.as_dict(), "ratio_text": ratio.text(".2g", "x"), "reading": reading(ratio)})
    return out


def _e(d: dict) -> str:
    return stats.Estimate(**d).text(".2g")


def markdown(result: dict) -> str:
    lines = [f"From [results/rounding_modes.json](results/rounding_modes.json) (`.venv/bin/python scripts/rounding_results.py "
             f"--write-docs` on {machine_line(result['provenance'])}; the runs: "
             + "; ".join(f"`.venv/bin/numdev-bench {' '.join(c)}`" for c in result["commands"].values())
             + f"). Relative RMS error against FP64, mean over {result['gemm'][0]['seeds']} seeds with its {stats.RULE}; the ratio "
             f"stochastic / nearest paired by seed, {stats.LOG_RULE}.", "",
             "**A GEMM's accumulator** (bf16 operands, products added one at a time):", "",
             "| inputs | accumulator | K | nearest | toward zero | stochastic | stochastic / nearest | reading |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["gemm"]:
        lines.append(f"| {r['inputs']} | {r['accumulator']} | {r['k']} | {_e(r['rel_rmse_nearest'])} | {_e(r['rel_rmse_toward_zero'])} | "
                     f"{_e(r['rel_rmse_stochastic'])} | {r['ratio_text']} | {r['reading']} |")
    lines += ["", "**Flash's bias** (paper-like: U[0, 1) inputs, FA1, B_c = 64, every stage in bf16; mean signed error and relative "
              "RMS error against FP64):", "",
              "| method | N | mean signed, nearest | mean signed, stochastic | rel. RMS, nearest | rel. RMS, stochastic | stochastic / nearest | reading |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["bias"]:
        lines.append(f"| {r['method']} | {r['n']} | {_e(r['mean_signed_nearest'])} | {_e(r['mean_signed_stochastic'])} | "
                     f"{_e(r['rel_rmse_nearest'])} | {_e(r['rel_rmse_stochastic'])} | {r['ratio_text']} | {r['reading']} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=Path, default=REPO / "outputs", help="where the bench runs go (default outputs/)")
    parser.add_argument("--write-docs", action="store_true", help="write docs/results/rounding_modes.json and the docs block")
    parser.add_argument("--runs-from", type=Path, default=None,
                        help="summarise the runs an earlier result JSON names (its 'runs') instead of running them again")
    args = parser.parse_args(argv)
    if args.write_docs:
        check_blocks((DOC, "rounding-results"))
    try:
        paths = ({label: run(args.outputs, label) for label in RUNS} if args.runs_from is None
                 else {label: Path(d) / "results.jsonl" for label, d in read_json(args.runs_from, "rounding result")["runs"].items()})
    except subprocess.CalledProcessError as error:  # numdev-bench said why on stderr, in one line
        raise SystemExit(f"rounding_results.py: {' '.join(error.cmd[2:5])} ... failed (exit {error.returncode}): see its message above") from None
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as error:  # no file, not JSON, not this script's result
        why = one_line(error) if isinstance(error, (OSError, ValueError)) else f"not a result of this script (no 'runs' table: {error!r})"
        parser.error(f"--runs-from {args.runs_from}: {why}")
    first = records(next(iter(paths.values())))[0]
    result = {"provenance": first["provenance"], "summarised": provenance(threads=1)["git"], "commands": RUNS, "runs": {k: str(v.parent) for k, v in paths.items()}, **summarise(paths)}
    if args.write_docs:
        write_json(RESULT, result)
        replace_block(DOC, "rounding-results", markdown(result))
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    run_script(main)
