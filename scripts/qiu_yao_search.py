"""Qiu & Yao's failure looked for in long bf16 runs of the language model (issue 34's fifth item).

Train sibling runs (the same seeds; one with the fix), then read their snapshots:

    .venv/bin/numdev-train model=gpt_tiny precision=bf16-mixed attention=flash_emulated \\
        attention.formats.preset=paper attention.block_r=64 attention.block_c=64 trainer.max_steps=3000 threads=1 \\
        snapshot.every_n_steps=100 callbacks.instability.policy=stop name=qiu_yao hydra.run.dir=<dir>/flash_paper
    (the same with optimization=flash_tie_fix and hydra.run.dir=<dir>/flash_paper_tie_fix)
    .venv/bin/python scripts/qiu_yao_search.py <dir>/flash_paper <dir>/flash_paper_tie_fix --write-docs

Per run: its status and instability events (loss spikes, non-finite values), its training loss, and
at every snapshot the held-out loss, the tie rates, the signed P·V bias and key similarity of
numdev.analysis.ties (TIE_RULE, BIAS_RULE), on the first --windows held-out windows. Prints JSON
(--out: also to that file); --write-docs writes docs/results/qiu_yao_gpt_tiny.json, its figure
docs/results/qiu_yao_gpt_tiny.png and the qiu-yao block of docs/workloads.md. Single runs: every
number is one run's, a range of one with no interval and no verdict symbol.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import math
import sys
from pathlib import Path

from numdev.cli.script_args import ScriptParser, at_least, run_script
from numdev.report.docblocks import check_blocks, replace_block
from numdev.runs.atomic import read_json, write_text
from numdev.runs.layout import RunDir
from numdev.runs.provenance import machine_line, provenance
from numdev.runs.schemas import result_fields

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "docs" / "results" / "qiu_yao_gpt_tiny.json"
FIGURE = REPO / "docs" / "results" / "qiu_yao_gpt_tiny.png"
DOC = REPO / "docs" / "workloads.md"
GROWTH = 1.5
EXPLODE_RULE = (
    "A run explodes when it records a non-finite loss, gradient or attention output, or a loss spike (a training loss "
    "above 4x its running average: the instability monitor's), or when its held-out loss at the last snapshot exceeds "
    f"{GROWTH}x its lowest held-out loss over the snapshots"
)
TABLE_STEPS = (0, 100, 200, 500, 1000, 1500, 2000, 2500, 3000)


def _label(config: dict) -> str:
    attention = config.get("attention") or {}
    formats = (attention.get("formats") or {}).get("preset", "?")
    optimization = (config.get("optimization") or {}).get("name") or "none"
    lr = ((config.get("optim") or {}).get("optimizer") or {}).get("lr", "?")
    return f"flash ({formats} formats), {config.get('precision', {}).get('name', '?')}, lr {lr:g}" + (
        "" if optimization == "none" else f" + {optimization}")


def read_run(path: Path, windows: int, heldout: int) -> dict:
    from omegaconf import OmegaConf

    from numdev.analysis.run_model import saved_config
    from numdev.analysis.study import loss_curve
    from numdev.analysis.ties import snapshot_ties

    run = RunDir(path)
    record = run.read_record()
    config = OmegaConf.to_container(saved_config(run), resolve=False)
    events = run.read_instability()["events"] if run.instability.is_file() else []
    spikes = [e for e in events if e["kind"] == "loss_spike"]
    nonfinite = [e for e in events if e["kind"].startswith("nonfinite")]
    steps = snapshot_ties(path, windows=windows, heldout=heldout)
    losses = [s["heldout_loss"] if math.isfinite(s["heldout_loss"]) else math.inf for s in steps]  # non-finite: exploded
    final = record.get("final_step")
    if isinstance(final, int) and steps[-1]["step"] != final:  # an index edited or cut short, or a run still going
        print(f"warning: {path}: its last snapshot is step {steps[-1]['step']} but run.json says it ended at step {final}: "
              f"{run.index} lists fewer snapshots than the run wrote", file=sys.stderr)
    recorded = run.read_heldout() if run.heldout.is_file() else None
    same_set = recorded is not None and recorded.get("images") == heldout and recorded.get("step") == steps[-1]["step"]
    matches = recorded["heldout_loss"] == losses[-1] if same_set else None
    if matches is False:  # an edited config.yaml, or another machine's arithmetic: the numbers are not the run's own
        print(f"warning: {path}: the held-out loss of step {steps[-1]['step']} evaluated here ({losses[-1]:.6f}) is not "
              f"heldout.json's ({recorded['heldout_loss']:.6f}): config.yaml was edited or this machine computes "
              "otherwise", file=sys.stderr)
    grows = losses[-1] > GROWTH * min(losses)  # inf > anything: a non-finite last held-out loss explodes
    return {
        "run": str(path), "label": _label(config), "status": record.get("status"), "final_step": record.get("final_step"),
        "stop_reason": record.get("stop_reason"), "threads": record.get("threads"),
        "spikes": len(spikes), "largest_spike": max((e.get("magnitude", 0) for e in spikes), default=None),
        "nonfinite_first_step": min((e["step"] for e in nonfinite), default=None),
        "heldout_min": min(losses), "heldout_last": losses[-1],
        "explodes": bool(spikes or nonfinite or grows), "heldout_json_matches": matches, "train_loss": loss_curve(path), "steps": steps,
    }


def _pct(x: float | None) -> str:
    return "non-finite" if x is None else f"{100 * x:.2f}%"


def _num(x: float | None, spec: str) -> str:
    return "non-finite" if x is None or not math.isfinite(x) else format(x, spec)


def block(result: dict) -> str:
    from numdev.analysis.ties import BIAS_RULE, TIE_RULE

    runs = result["runs"]
    lines = [
        f"Generated by `.venv/bin/python scripts/qiu_yao_search.py {' '.join(Path(r['run']).name for r in runs)} "
        f"--write-docs` on the runs of the training command above ({RESULT.relative_to(REPO)}, figure "
        f"{FIGURE.relative_to(REPO)}; analysis machine: {machine_line(result['provenance'])}; the runs: "
        f"{result['train_machine']}). One run per arm: every number is one run's (no interval, no verdict symbol).",
        "",
        "| run | status | steps | loss spikes | non-finite | held-out loss: lowest, last | explodes? |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        lines.append(f"| {r['label']} | {r['status']} | {r['final_step']} | {r['spikes']} | "
                     f"{'none' if r['nonfinite_first_step'] is None else 'from step ' + str(r['nonfinite_first_step'])} | "
                     f"{_num(r['heldout_min'], '.4f')}, {_num(r['heldout_last'], '.4f')} | {'yes' if r['explodes'] else 'no'} |")
    lines += [
        "",
        "| step | run | held-out loss | row tie rate | block tie rate | P·V bias (rel.) | P·V rel. RMS | bias share | "
        "column share (null) | out bias vs FP64 (rel.) | key cosine | largest score |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    shown = sorted(set(TABLE_STEPS) | {r["steps"][-1]["step"] for r in runs})  # and where each run ended
    for step in shown:
        for r in runs:
            row = next((s for s in r["steps"] if s["step"] == step), None)
            if row is None:
                continue
            a = row["all"]
            lines.append(
                f"| {step} | {r['label']} | {_num(row['heldout_loss'], '.4f')} | {_pct(a['row_tie_rate'])} | "
                f"{_pct(a['block_tie_rate'])} | {_num(a['pv_bias'], '+.2e')} | {_num(a['pv_rel_rms'], '.2e')} | "
                f"{_num(a['pv_bias_share'], '.3f')} | {_num(a['pv_column_share'], '.3f')} ({a['pv_column_null']:.3f}) | "
                f"{_num(a['out_bias'], '+.2e')} | {_num(a['key_cosine'], '.3f')} | {_num(a['score_max'], '.1f')} |")
    layers = len(runs[0]["steps"][0]["layers"])
    lines += ["", f"Rules: {TIE_RULE}. {BIAS_RULE}. Pooled over the {layers} attention layers' calls on the first "
              f"{result['windows']} held-out windows; held-out loss over {result['heldout']} windows. {EXPLODE_RULE}."]
    return "\n".join(lines)


def figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("heldout_loss", "held-out loss"), ("row_tie_rate", "row tie rate"), ("block_tie_rate", "block tie rate"),
              ("pv_bias", "P·V bias (rel.)"), ("pv_column_share", "P·V column share"), ("key_cosine", "key cosine"),
              ("score_max", "largest scaled score"), ("train_loss", "training loss"))
    fig, axes = plt.subplots(2, 4, figsize=(16, 6.5), constrained_layout=True)
    for ax, (key, title) in zip(axes.flat, panels):
        for r in result["runs"]:
            if key == "train_loss":
                curve = r["train_loss"] or {"steps": [], "loss": []}
                ax.plot(curve["steps"], curve["loss"], lw=0.8, label=r["label"])
                continue
            steps = [s["step"] for s in r["steps"]]
            values = [s[key] if key == "heldout_loss" else s["all"][key] for s in r["steps"]]
            ax.plot(steps, values, marker=".", label=r["label"])
        if key == "score_max":
            ax.axhline(88.7, color="grey", ls=":", label="e^-m below float32's smallest normal")
        if key == "pv_column_share":
            ax.axhline(result["runs"][0]["steps"][0]["all"]["pv_column_null"], color="grey", ls=":", label="independent errors")
        if key == "pv_bias":
            ax.axhline(0, color="grey", lw=0.8)
        ax.set_title(title)
        ax.set_xlabel("step")
    axes.flat[-1].legend(fontsize=7, loc="upper right")
    fig.suptitle("Qiu & Yao's mechanism looked for: gpt_tiny, bf16, numdev's flash emulator (one run per arm)")
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _finite(value):
    """NaN and infinities (a run that exploded) as null: the JSON stays strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def main() -> None:
    parser = ScriptParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run directories of numdev-train with attention=flash_emulated")
    parser.add_argument("--windows", type=at_least(1), default=16, help="held-out windows the tie and bias measures read")
    parser.add_argument("--heldout", type=at_least(1), default=64, help="held-out windows of the held-out loss")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--train-machine", default=None, help="the machine the runs trained on, for the docs (default: this one)")
    docs = parser.add_mutually_exclusive_group()  # measure and write the docs, or write them from the committed result
    docs.add_argument("--write-docs", action="store_true")
    docs.add_argument("--docs-only", action="store_true", help=f"rewrite the figure and the docs block from {RESULT.relative_to(REPO)}, reading no run")
    args = parser.parse_args()
    if args.docs_only or args.write_docs:
        check_blocks((DOC, "qiu-yao"))
    if args.docs_only:
        if args.runs:
            parser.error("--docs-only reads the committed JSON: give no run directories with it")
        with result_fields(RESULT, "qiu-yao result"):  # before anything is written: a forged or truncated result is refused whole
            result = read_json(RESULT, "qiu-yao result")
            text = block(result)
        figure(result, FIGURE)
        replace_block(DOC, "qiu-yao", text)
        return
    if not args.runs:
        parser.error("give one or more run directories (or --docs-only)")
    for path in args.runs:
        if not (path / "run.json").is_file():
            parser.error(f"{path}: no run.json: not a numdev-train run directory")
    try:
        runs = [read_run(path, args.windows, args.heldout) for path in args.runs]
    except (OSError, ValueError) as error:
        parser.error(str(error))
    from numdev.analysis.ties import BIAS_RULE, TIE_RULE

    result = {"runs": runs, "windows": args.windows, "heldout": args.heldout, "tie_rule": TIE_RULE, "bias_rule": BIAS_RULE,
              "explode_rule": EXPLODE_RULE, "provenance": provenance(threads=None)}
    result["train_machine"] = args.train_machine or machine_line(result["provenance"], commit=False)
    text = json.dumps(_finite(result), indent=1, allow_nan=False)
    print(text)
    if args.out:
        write_text(args.out, text + "\n")
    if args.write_docs:
        write_text(RESULT, text + "\n")
        figure(result, FIGURE)
        replace_block(DOC, "qiu-yao", block(result))


if __name__ == "__main__":
    run_script(main)
