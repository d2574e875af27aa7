"""Which rows of the token embedding train: recorded at the start of a run, checked at every batch.

Only the rows of token ids that some caption holds receive gradients; the others keep their
initial values for the whole run (49408 x 64 of dit_tiny's 4.8 M parameters, most of them), so
the weight distances treat them as their own set (numdev.weights.distances). The record is
<run_dir>/token_rows.json (numdev.runs.layout):

- `declared`: the data module knows every caption's tokens before training (the shapes grammar,
  a folder's captions): they are tokenised once at the start, with the unconditional caption "".
  Every training batch is checked against them; a caption with another token is an error, so
  a wrong declaration cannot go unnoticed.
- `seen` (WebDataset shards, streamed): the ids of the batches trained so far, each with the first
  snapshot step whose weights it trained in; rewritten when a new id appears. Under DDP only
  global rank 0's batches are seen.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from numdev.runs.atomic import write_json
from numdev.runs.layout import TOKEN_ROWS_FORMAT, RunDir, token_rows_problem


class TokenRowsError(ValueError):
    """A caption holds a token its data module did not declare, or the record does not match the run."""


def embedding_name(model: nn.Module) -> str | None:
    """The parameter name of the model's token embedding: the one its `get_input_embeddings()` returns (transformers'
    name for it; a model with position embeddings too, GPT-2's wpe), else its one nn.Embedding; None without one."""
    named = getattr(model, "get_input_embeddings", None)
    if callable(named):
        embedding = named()
        found = next((name for name, module in model.named_modules() if module is embedding and embedding is not None), None)
        if found is not None:
            return f"{found}.weight"
    names = [f"{name}.weight" for name, module in model.named_modules() if isinstance(module, nn.Embedding)]
    if len(names) > 1:
        raise TokenRowsError(f"the model has {len(names)} token embeddings ({names[:3]}): numdev knows which rows train for one (or the one the model's get_input_embeddings() returns)")
    return names[0] if names else None


class TokenRows:
    """The token-rows record of one run, kept in memory and in its run directory."""

    def __init__(self, run_dir: str | Path, tensor: str, rows: int, tokenize):
        self.path = RunDir(run_dir).token_rows
        self.run_dir, self.tensor, self.rows, self.tokenize = Path(run_dir), tensor, rows, tokenize
        self.source, self.describe = "seen", "the captions of the batches trained so far"
        self.first_step: dict[int, int] = {}

    def start(self, vocabulary: tuple[list[str], str] | None, global_step: int) -> None:
        """Declare the rows (or continue the seen ones of a resumed run) and write the record."""
        previous = RunDir(self.run_dir).read_token_rows()
        if vocabulary is not None:
            texts, self.describe = vocabulary
            self.source = "declared"
            self.first_step = {i: 0 for i in self.ids_of([*texts, ""])}
        elif previous is not None and previous["source"] == "seen":
            # A resumed run retraces the steps after its checkpoint: ids first seen there are seen again.
            self.first_step = {i: s for i, s in zip(previous["ids"], previous["first_step"]) if s <= global_step}
        if previous is not None and (previous["tensor"], previous["rows"]) != (self.tensor, self.rows):
            raise TokenRowsError(f"{self.path} names {previous['tensor']} with {previous['rows']} rows: not this model's embedding")
        self.write()

    def ids_of(self, captions: list[str]) -> set[int]:
        tokens = self.tokenize(list(captions))
        return set(torch.unique(tokens).tolist())

    def check(self, captions: list[str], global_step: int) -> None:
        """Every token of a training batch must be a declared row; seen rows are recorded."""
        new = self.ids_of(captions) - self.first_step.keys()
        if not new:
            return
        if self.source == "declared":
            raise TokenRowsError(
                f"a training caption holds token ids {sorted(new)[:5]} that {self.describe} do not: "
                f"the data module's caption_vocabulary() is wrong ({self.path})"
            )
        self.first_step.update({i: global_step + 1 for i in new})  # trained into the next step's weights
        self.write()

    def record(self) -> dict:
        """The record token_rows.json holds (what numdev.runs.layout.RunDir.read_token_rows returns)."""
        ids = sorted(self.first_step)
        return {
            "format": TOKEN_ROWS_FORMAT,
            "tensor": self.tensor,
            "rows": self.rows,
            "source": self.source,
            "describe": self.describe,
            "ids": ids,
            "first_step": [self.first_step[i] for i in ids],
        }

    def write(self) -> None:
        record = self.record()
        problem = token_rows_problem(record)
        if problem:
            raise TokenRowsError(f"{self.path}: {problem}")
        write_json(self.path, record)
