"""A causal language model in the style of nanoGPT (Karpathy, karpathy/nanoGPT; GPT-2's layout).

Byte tokens (a vocabulary of 256: no tokenizer to download or train) -> token and learned position
embeddings -> pre-LayerNorm transformer blocks (causal self-attention through numdev's one
Attention module, with the configured backend; a GELU MLP) -> a final LayerNorm and a head tied to
the token embedding. At a context of 256 tokens every attention call spans many key/value blocks
of a flash backend (16-64 keys each), so FlashAttention's online softmax rescales its running
maximum inside every call (numdev.attention.tiles).

Initialisation follows GPT-2 / nanoGPT: linear and embedding weights N(0, 0.02), the residual
projections N(0, 0.02 / sqrt(2 depth)), biases and LayerNorm shifts zero, drawn from the global
torch RNG in a fixed order that does not depend on the backend (the training app builds the model
under a generator seeded with seed.init).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from numdev.attention.registry import AttentionBackend
from numdev.models.attention import Attention, name_attention_layers

BYTE_VOCABULARY = 256


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, mlp_ratio: float, attention: AttentionBackend):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, attention, causal=True)
        self.norm2 = nn.LayerNorm(hidden)
        inner = int(hidden * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(hidden, inner), nn.GELU(), nn.Linear(inner, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """forward(tokens (B, T) int64) -> next-token logits (B, T, vocabulary)."""

    def __init__(self, attention: AttentionBackend, name: str = "gpt", context_length: int = 256, hidden: int = 128,
                 depth: int = 4, heads: int = 4, mlp_ratio: float = 4.0, vocabulary: int = BYTE_VOCABULARY):
        super().__init__()
        for key, value in (("context_length", context_length), ("hidden", hidden), ("depth", depth), ("heads", heads),
                           ("vocabulary", vocabulary)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"model.{key}={value!r} must be a positive integer")
        if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, (int, float)) or not mlp_ratio > 0:
            raise ValueError(f"model.mlp_ratio={mlp_ratio!r} must be a positive number")
        if hidden % heads:
            raise ValueError(f"model.hidden={hidden} is not divisible by model.heads={heads}: change one of them")
        self.name, self.context_length, self.vocabulary = name, context_length, vocabulary
        self.hidden, self.depth, self.heads = hidden, depth, heads
        self.embed = nn.Embedding(vocabulary, hidden)
        self.position = nn.Parameter(torch.zeros(context_length, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads, mlp_ratio, attention) for _ in range(depth))
        self.norm = nn.LayerNorm(hidden)
        self.initialize()
        name_attention_layers(self)

    def initialize(self) -> None:
        """GPT-2's initialisation, in module order (the same draws whatever the backend)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, Attention):
                nn.init.normal_(module.in_proj_weight, std=0.02)
                nn.init.zeros_(module.in_proj_bias)
        nn.init.normal_(self.position, std=0.02)
        residual = 0.02 / math.sqrt(2 * self.depth)
        for block in self.blocks:
            nn.init.normal_(block.attn.out_proj.weight, std=residual)
            nn.init.normal_(block.mlp[2].weight, std=residual)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.context_length:
            raise ValueError(f"{length} tokens exceed model.context_length={self.context_length}: raise it or shorten data.sequence_length")
        x = self.embed(tokens) + self.position[:length].to(self.embed.weight.dtype)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.t()  # the head tied to the token embedding
