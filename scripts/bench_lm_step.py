"""Tokens per second of a language-model training step, per attention backend, beside the same model in plain
eager PyTorch (no numdev wrapper): the wrapper's overhead as a ratio. Prints JSON (and writes it with --out).

    python scripts/bench_lm_step.py                                   gpt_tiny, fp32, 2 threads
    python scripts/bench_lm_step.py --backends baseline,sdpa_flash --precision bf16-mixed --threads 1
    python scripts/bench_lm_step.py --write-docs                      docs/workloads.md's `lm-speed` block from the committed JSON

A step is forward, next-token cross-entropy, backward and AdamW on one fixed batch of data=text windows
(data.batch_size x model.context_length tokens), timed outside Lightning (numdev's LightningModule's own
loss, the model's own parameters). The plain model is a nanoGPT block stack written here with nn.Linear
projections and F.scaled_dot_product_attention(is_causal=True) - what a user would write - given numdev's
weights (its outputs are checked against numdev's model with the first backend before timing). Every variant runs its
steps in turn, round-robin (--rounds), so load drifts hit all alike; the medians and their ratios to the
plain model come from the same run. Threads are pinned and recorded with the machine.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_module
from hydra.utils import instantiate
from torch import nn

from numdev.cli.script_args import ScriptParser, run_script
from numdev.runs.atomic import read_json, write_json
from numdev.runs.provenance import machine_line, provenance
from numdev.train.run import build_model, build_module

PLAIN = "plain_pytorch"
RESULT = Path(__file__).resolve().parents[1] / "docs" / "results" / "bench_lm_step.json"
DOC, BLOCK = Path(__file__).resolve().parents[1] / "docs" / "workloads.md", "lm-speed"


def block_text(report: dict) -> str:
    """docs/workloads.md's table of the committed benchmark, naming its command and machine."""
    rows = "\n".join(f"| {r['variant']} | {r['median_step_s']:.3f} | {r['tokens_per_s']:,.0f} | {r['ratio_to_plain']:.2f}x |"
                     for r in report["rows"])
    return (f"From docs/results/bench_lm_step.json (`{report['command']}` on {machine_line(report['provenance'])}; "
            f"{report['model']}, {report['precision']}, {report['tokens_per_step']:,} tokens a step, median of "
            f"{report['rows'][0]['steps']} steps each, round-robin; the plain model's output differs from numdev's by "
            f"{report['plain_vs_numdev_max_rel_difference']:.1e} of its largest logit):\n\n"
            f"| variant | step (s) | tokens/s | step time / plain PyTorch's |\n| --- | --- | --- | --- |\n{rows}")


def config(overrides: list[str]):
    with initialize_config_module(config_module="numdev.conf.train", version_base="1.3"):
        return compose(config_name="train", overrides=["run_dir=unused", "model=gpt_tiny", *overrides])


class PlainBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, inner), nn.GELU(), nn.Linear(inner, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, c))
        return x + self.mlp(self.norm2(x))


class PlainGPT(nn.Module):
    """numdev.models.gpt.GPT's function, written as a user would, with its weights copied in."""

    def __init__(self, numdev_model: nn.Module):
        super().__init__()
        m = numdev_model
        self.embed, self.position, self.norm = nn.Embedding(m.vocabulary, m.hidden), nn.Parameter(m.position.detach().clone()), nn.LayerNorm(m.hidden)
        self.embed.load_state_dict(m.embed.state_dict())
        self.norm.load_state_dict(m.norm.state_dict())
        inner = m.blocks[0].mlp[0].out_features
        self.blocks = nn.ModuleList(PlainBlock(m.hidden, m.heads, inner) for _ in m.blocks)
        for mine, theirs in zip(self.blocks, m.blocks):
            mine.norm1.load_state_dict(theirs.norm1.state_dict())
            mine.norm2.load_state_dict(theirs.norm2.state_dict())
            mine.mlp.load_state_dict(theirs.mlp.state_dict())
            mine.qkv.weight.data.copy_(theirs.attn.in_proj_weight)
            mine.qkv.bias.data.copy_(theirs.attn.in_proj_bias)
            mine.proj.load_state_dict(theirs.attn.out_proj.state_dict())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.t()


def main() -> None:
    parser = ScriptParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="baseline,eager,sdpa_flash,sdpa_math,flash_emulated")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16-mixed"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12, help="timed steps per variant (after 2 warm-up steps each)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--write-docs", action="store_true", help="write docs/workloads.md's block from the committed JSON and stop")
    args = parser.parse_args()
    if args.write_docs:
        from numdev.report.docblocks import replace_block
        from numdev.runs.schemas import result_fields

        with result_fields(RESULT, "LM step benchmark"):
            text = block_text(read_json(RESULT, "LM step benchmark"))
        replace_block(DOC, BLOCK, text)
        return
    if args.rounds < 3:
        parser.error(f"--rounds {args.rounds}: need at least 3 for a median")
    torch.set_num_threads(args.threads)
    backends = [b for b in args.backends.split(",") if b]
    variants, batch = {}, None
    for backend in backends:
        cfg = config([f"attention={backend}", f"precision={args.precision}"])
        model = build_model(cfg, instantiate(cfg.attention))
        module = build_module(cfg, model)
        if batch is None:
            data = instantiate(cfg.data)
            data.setup()
            batch = torch.stack([data.dataset[i]["tokens"] for i in range(cfg.data.batch_size)])
            plain = PlainGPT(model)
            variants[PLAIN] = (lambda m=plain, b=batch: F.cross_entropy(m(b[:, :-1]).float().transpose(1, 2), b[:, 1:]), plain)
            reference = model
        variants[backend] = (lambda mod=module, b=batch: mod.token_loss(b)[0].mean(), model)
    dtype = torch.bfloat16 if args.precision == "bf16-mixed" else None
    with torch.no_grad():  # the plain model computes numdev's function
        a = variants[PLAIN][1](batch[:, :-1])
        b = reference(batch[:, :-1])
        agreement = float((a - b).abs().max() / b.abs().max())
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, (_, model) in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds + 2):
        for name, (loss_of, _model) in variants.items():
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = loss_of()
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            if round_ >= 2:
                times[name].append(time.perf_counter() - start)
    tokens = int(batch.shape[0] * (batch.shape[1] - 1))
    plain_median = statistics.median(times[PLAIN])
    rows = [{"variant": name, "median_step_s": statistics.median(t), "tokens_per_s": tokens / statistics.median(t),
             "ratio_to_plain": statistics.median(t) / plain_median, "steps": len(t)} for name, t in times.items()]
    report = {"model": "gpt_tiny", "precision": args.precision, "tokens_per_step": tokens, "threads": torch.get_num_threads(),
              "plain_vs_numdev_max_rel_difference": agreement, "plain": "nn.Linear + F.scaled_dot_product_attention(is_causal=True), "
              "numdev's weights", "rows": rows, "provenance": provenance(threads=torch.get_num_threads()),
              "command": "python scripts/bench_lm_step.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()
                                                               if v is not None and k not in ("out", "write_docs"))}
    if args.out:
        write_json(args.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    run_script(main)
