"""The one attention module: every attention call of every model goes through it.

Projections are learned here; softmax(Q K^T * scale) V itself is computed by a backend from the
registry in numdev.attention (baseline, flash_emulated, sdpa_*, flash_attn), so switching the
backend changes the arithmetic and nothing else: the backend holds no parameters, and the
parameters and their initialisation are the same whatever the backend (timm: one module, one
switch, same parameters on every path).

Parameter names are nn.MultiheadAttention's (in_proj_weight / in_proj_bias for self-attention,
q/k/v_proj_weight when keys come from another width, out_proj), so open_clip text towers and
other MultiheadAttention checkpoints load into it unchanged.

A call is three small steps, kept apart so a later "shadow" backend can be run on exactly the
same q, k, v (see `project_qkv`, `attend`, `project_out`). Each instance gets a stable
`layer_name` (its path in the model, set by `name_attention_layers`) for per-layer records.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from numdev.attention.registry import AttentionBackend


class AttentionCall(nn.Module):
    """softmax(q k^T / sqrt(D)) v by the configured backend, for a model whose projections are its own
    (numdev.models.hf: a Hugging Face model's attention layers call it through transformers' attention
    registry). No parameters: the backend, the causal flag, the layer's name and the probe only.
    Every per-call record (shadow comparisons, tiling, instability) finds the calls through this class."""

    def __init__(self, heads: int, head_dim: int, backend: AttentionBackend, causal: bool = False):
        super().__init__()
        if backend is None or not callable(backend):
            raise ValueError("Attention needs an attention backend (a callable from numdev.attention), got None")
        self.heads, self.head_dim, self.dim = heads, head_dim, heads * head_dim
        self.causal = causal
        self.backend = backend  # a plain callable, not a module: no parameters, no state_dict entry
        self.layer_name = ""
        self.probe = None  # optional observer of every call: probe(module, q, k, v, out) (numdev.models.shadow)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(D)) v by the backend: (B, H, N, D) -> (B, H, N, D).

        Autocast is switched off around the backend: q, k, v arrive in the compute dtype
        (autocast's projections made them bf16/fp16), and each backend then does its own
        arithmetic. Without this, autocast would silently recast the emulators' float32 working
        tensors to bf16 and their stage formats would no longer be what the config says.
        """
        with torch.autocast(q.device.type, enabled=False):
            out = self.backend(q, k, v, causal=self.causal)
            if self.probe is not None:
                self.probe(self, q, k, v, out)
        return out

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(B, H, N, D) -> (B, H, N, D): `attend` as a module call, so forward hooks see every call."""
        return self.attend(q, k, v)

    def extra_repr(self) -> str:
        backend = getattr(self.backend, "name", type(self.backend).__name__)
        return f"{self.layer_name or '?'}: heads={self.heads}, head_dim={self.head_dim}, causal={self.causal}, backend={backend}"


class Attention(AttentionCall):
    """Projections and the call: numdev's own models' attention (nn.MultiheadAttention's parameter names)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        backend: AttentionBackend,
        kv_dim: int | None = None,
        causal: bool = False,
        bias: bool = True,
    ):
        if dim % heads:
            raise ValueError(f"attention width {dim} is not divisible by {heads} heads: change the model's heads or width")
        super().__init__(heads, dim // heads, backend, causal)
        self.kv_dim = kv_dim
        if kv_dim is None:  # self-attention: one packed (3*dim, dim) projection, as nn.MultiheadAttention
            self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        else:  # keys and values from another width (cross-attention)
            self.q_proj_weight = nn.Parameter(torch.empty(dim, dim))
            self.k_proj_weight = nn.Parameter(torch.empty(dim, kv_dim))
            self.v_proj_weight = nn.Parameter(torch.empty(dim, kv_dim))
        self.register_parameter("in_proj_bias", nn.Parameter(torch.empty(3 * dim)) if bias else None)
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.MultiheadAttention's initialisation (Xavier in-projection, zero biases)."""
        if self.kv_dim is None:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            for weight in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                nn.init.xavier_uniform_(weight)
        self.out_proj.reset_parameters()
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, N, dim); context (B, L, kv_dim) for cross-attention, else None. Returns (B, N, dim)."""
        q, k, v = self.project_qkv(x, context)
        return self.project_out(self.attend(q, k, v))

    def project_qkv(self, x: torch.Tensor, context: torch.Tensor | None = None):
        """q (B, H, N, D), k and v (B, H, L, D)."""
        if (context is None) != (self.kv_dim is None):
            kind = "cross-attention needs a context" if context is None else "self-attention takes no context"
            raise ValueError(f"{self.layer_name or 'attention'}: {kind}")
        if context is None:
            q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)  # 3 x (B, N, dim)
        else:
            bq, bk, bv = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None, None, None)
            q = F.linear(x, self.q_proj_weight, bq)  # (B, N, dim)
            k = F.linear(context, self.k_proj_weight, bk)  # (B, L, dim)
            v = F.linear(context, self.v_proj_weight, bv)  # (B, L, dim)
        return self._split_heads(q), self._split_heads(k), self._split_heads(v)

    def project_out(self, out: torch.Tensor) -> torch.Tensor:
        """(B, H, N, D) -> (B, N, dim)."""
        batch, _, n, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(batch, n, self.dim))

    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:
        batch, n, _ = t.shape
        return t.view(batch, n, self.heads, self.head_dim).transpose(1, 2)  # (B, H, N, D)

    def extra_repr(self) -> str:
        kind = "self" if self.kv_dim is None else f"cross(kv_dim={self.kv_dim})"
        backend = getattr(self.backend, "name", type(self.backend).__name__)
        return f"{self.layer_name or '?'}: {kind}, dim={self.dim}, heads={self.heads}, causal={self.causal}, backend={backend}"


def name_attention_layers(model: nn.Module) -> list[str]:
    """Give every attention call in `model` its path as `layer_name`; returns the names in order."""
    names = []
    for name, module in model.named_modules():
        if isinstance(module, AttentionCall):
            module.layer_name = name
            names.append(name)
    return names


def set_attention_backend(model: nn.Module, backend: AttentionBackend) -> None:
    """Route every attention call of `model` through `backend` (parameters are untouched)."""
    for module in model.modules():
        if isinstance(module, AttentionCall):
            module.backend = backend
