"""The LightningModule of a causal language model: next-token cross-entropy (numdev.models.gpt).

A training step reads {"tokens": (B, T + 1)} (numdev.data.text), predicts tokens 1..T from 0..T-1
and takes the mean cross-entropy in float32 (the logits are cast up under a 16-bit autocast, as
nanoGPT and Megatron do). Nothing in a step draws random numbers: the noise generator of
TrainModule stays untouched, so sibling runs differ only in the optimization under study.

Held-out: the mean cross-entropy per token over fixed held-out windows (and its perplexity; each
window's mean too, `item_losses`, for the held-out set's own sampling error; and the entropy of the held-out
targets' own byte frequencies, `unigram_entropy`: the loss of the best model that reads no context, which a
model that learned anything of the text's structure is below); the saved predictions are the greedy next token at every position (float32 holding token ids), so two
siblings' function-level agreement is the fraction of positions where their greedy tokens agree.
Samples: greedy continuations of fixed prompts (numdev.train.callbacks.continuations).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from numdev.train.callbacks.heldout import HeldOutResult
from numdev.train.module import TrainModule


class CausalLMModule(TrainModule):
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if "tokens" not in batch:
            raise ValueError(f"model={getattr(self.model, 'name', type(self.model).__name__)} trains on token sequences, but the "
                             "data gives captioned images: add data=text")
        tokens = batch["tokens"].to(self.device)
        loss = self.token_loss(tokens)[0].mean()
        self.log("loss/train", loss, prog_bar=True, batch_size=len(tokens), sync_dist=self._world()[1] > 1)
        return loss

    def token_loss(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cross-entropy of every next token (B, T), the logits (B, T, vocabulary)), both float32."""
        logits = self.model(tokens[:, :-1]).float()
        return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none"), logits

    @torch.no_grad()
    def heldout(self, dataset, *, seed: int, batch_size: int, forward_context: Callable, keep_predictions: bool) -> HeldOutResult:
        """Mean next-token cross-entropy over `dataset`'s windows (every token weighs the same; `seed` is
        unused: nothing is drawn), its perplexity, and the greedy tokens with keep_predictions."""
        was_training = self.model.training
        self.model.eval()
        total, count, digest, kept, per_window = 0.0, 0, hashlib.sha256(), [], []
        frequency = torch.zeros(256, dtype=torch.float64)  # the held-out targets' byte counts (the unigram entropy)
        try:
            for start in range(0, len(dataset), batch_size):
                tokens = torch.stack([dataset[i]["tokens"] for i in range(start, min(start + batch_size, len(dataset)))])
                digest.update(tokens.numpy().tobytes())
                frequency += torch.bincount(tokens[:, 1:].reshape(-1), minlength=256)[:256].double()
                with forward_context():
                    losses, logits = self.token_loss(tokens.to(self.device))
                total += float(losses.double().sum())
                per_window += losses.double().mean(1).tolist()
                count += losses.numel()
                if keep_predictions:
                    kept.append(logits.argmax(-1).to("cpu", torch.float32))
        finally:
            self.model.train(was_training)
        loss = total / count
        frequency = frequency / frequency.sum()
        unigram = float(-(frequency[frequency > 0] * frequency[frequency > 0].log()).sum())
        return HeldOutResult(loss, digest.hexdigest(), torch.cat(kept) if keep_predictions else None,
                             extra={"perplexity": math.exp(min(loss, 700.0)), "tokens": count, "item_losses": per_window,
                                    "unigram_entropy": unigram})

    @torch.no_grad()
    def continue_greedy(self, prompts: list[str], length: int, forward_context: Callable) -> list[str]:
        """Each prompt (UTF-8 bytes) continued by `length` greedy tokens, decoded (invalid bytes replaced)."""
        was_training = self.model.training
        self.model.eval()
        context = getattr(self.model, "context_length", None)
        out = []
        try:
            for prompt in prompts:
                tokens = torch.tensor([list(prompt.encode("utf-8"))], dtype=torch.long, device=self.device)
                for _ in range(length):
                    window = tokens if context is None else tokens[:, -context:]
                    with forward_context():
                        logits = self.model(window)
                    tokens = torch.cat([tokens, logits[:, -1].float().argmax(-1, keepdim=True)], dim=1)
                out.append(bytes(tokens[0, len(prompt.encode("utf-8")):].tolist()).decode("utf-8", "replace"))
        finally:
            self.model.train(was_training)
        return out
