"""A language model's samples: greedy continuations of fixed prompts, every `every_n_steps` and at the end.

The prompts are the opening bytes of held-out windows (the data module's `preview_captions`), the same
at every step and for every run, so sibling runs' continuations can be read side by side. Each time:
the prompts and continuations to TensorBoard's text tab ("samples"); at the end also
continuations.json in the run directory (numdev.runs.layout.CONTINUATIONS). Greedy decoding draws
no random numbers (`seed` is kept for the samples callback's config keys and recorded).
"""

from __future__ import annotations

import time
from pathlib import Path

import lightning.pytorch as pl

from numdev.runs import layout
from numdev.runs.atomic import write_json
from numdev.train.callbacks.samples import _positive
from numdev.train.trackers import drawing


class Continuations(pl.Callback):
    def __init__(self, run_dir: str, every_n_steps: int = 250, num_samples: int = 8, seed: int = 0, length: int = 64):
        self.run_dir = Path(run_dir)
        self.every_n_steps = _positive("callbacks.samples.every_n_steps", every_n_steps)
        self.num_samples = _positive("callbacks.samples.num_samples", num_samples)
        self.length = _positive("callbacks.samples.length", length)
        self.seed = seed
        self.last: dict | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self.evaluate(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        last = self.evaluate(trainer, pl_module)
        if last is not None:
            write_json(self.run_dir / layout.CONTINUATIONS, last)

    def evaluate(self, trainer, pl_module) -> dict | None:
        if not trainer.is_global_zero:
            return None
        step = trainer.global_step
        if self.last is not None and self.last["step"] == step:
            return self.last
        continue_greedy = getattr(pl_module, "continue_greedy", None)
        if continue_greedy is None:
            raise ValueError("callbacks.samples: greedy continuations need a language model (model=gpt_*); "
                             "for a diffusion model use the sample grid (callbacks=default)")
        prompts = trainer.datamodule.preview_captions(self.num_samples)
        start = time.perf_counter()
        texts = continue_greedy(prompts, self.length, trainer.precision_plugin.forward_context)
        self.last = {"step": step, "decoding": "greedy", "length": self.length, "seconds": time.perf_counter() - start,
                     "samples": [{"prompt": p, "continuation": t} for p, t in zip(prompts, texts)]}
        experiment = drawing(trainer)
        if experiment is not None and hasattr(experiment, "add_text"):
            rows = "\n".join(f"| `{_cell(p)}` | `{_cell(t)}` |" for p, t in zip(prompts, texts))
            experiment.add_text("samples", f"| prompt | greedy continuation |\n| --- | --- |\n{rows}", global_step=step)
        return self.last


def _cell(text: str) -> str:
    return text.replace("\n", "⏎").replace("|", "¦").replace("`", "'")
