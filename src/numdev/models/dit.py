"""A text-conditioned diffusion transformer in the style of DiT (Peebles & Xie, facebookresearch/DiT).

Image patches -> transformer blocks -> per-patch noise prediction. Each block conditions on the
timestep (and the pooled caption) through adaLN-Zero, as in DiT, and reads the caption's tokens
through cross-attention, as in PixArt-alpha. Every attention call - image self-attention,
cross-attention and the text tower's self-attention - goes through numdev's Attention module with
the one configured backend.

Initialisation follows DiT (Xavier linears, zeroed adaLN modulation and output layer) and draws
from the global torch RNG in a fixed order that does not depend on the backend; the training app
builds the model under a generator seeded with seed.init.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from numdev.attention.registry import AttentionBackend
from numdev.models.attention import Attention, name_attention_layers
from numdev.models.text import TextFeatures, TextTower


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)  # (B, N, C)


class TimestepEmbedder(nn.Module):
    """Scalar timesteps -> (B, hidden) via sinusoidal frequencies and an MLP (DiT)."""

    def __init__(self, hidden: int, frequency_dim: int = 256):
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    @staticmethod
    def frequencies(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t.float()[:, None] * freqs[None]  # (B, half)
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # (B, dim)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        t_freq = self.frequencies(t, self.frequency_dim).to(self.mlp[0].weight.dtype)
        return self.mlp(t_freq)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class DiTBlock(nn.Module):
    """adaLN-Zero self-attention, cross-attention to the caption tokens, adaLN-Zero MLP."""

    def __init__(self, hidden: int, heads: int, context_dim: int, mlp_ratio: float, attention: AttentionBackend):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden, heads, attention)
        self.norm_cross = nn.LayerNorm(hidden, eps=1e-6)
        self.cross_attn = Attention(hidden, heads, attention, kv_dim=context_dim)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden, int(hidden * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """x (B, N, C) image tokens, c (B, C) conditioning, context (B, L, Ct) caption tokens."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + self.cross_attn(self.norm_cross(x), context)
        return x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, patch: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, patch * patch * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))  # (B, N, p*p*C)


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, in_channels: int, hidden: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, hidden, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, C, H, W) -> (B, N, hidden)


class DiT(nn.Module):
    outside_forward = ("text",)  # submodules called outside forward (encode_text): torch.compile compiles them on their own

    def __init__(
        self,
        attention: AttentionBackend,
        text: dict | None = None,
        name: str = "dit",
        image_size: int = 32,
        patch: int = 4,
        in_channels: int = 3,
        hidden: int = 384,
        depth: int = 12,
        heads: int = 6,
        mlp_ratio: float = 4.0,
    ):
        super().__init__()
        if hidden % 4:
            raise ValueError(f"model.hidden={hidden} must be a multiple of 4 (2-D sin-cos positions)")
        if image_size % patch:
            raise ValueError(f"image size {image_size} is not a multiple of the patch size {patch}: change data.resolution or model.patch")
        self.name = name  # the model config's name, for run records
        self.image_size, self.patch, self.in_channels = image_size, patch, in_channels
        self.grid = image_size // patch
        self.text = TextTower(attention, **(text or {}))  # built first: its init draws come first
        text_width = self.text.encoder.width
        self.x_embedder = PatchEmbed(patch, in_channels, hidden)
        self.t_embedder = TimestepEmbedder(hidden)
        self.y_embedder = nn.Linear(self.text.encoder.output_dim, hidden)  # pooled caption -> conditioning
        # Fixed 2-D sin-cos positions: a buffer (not a parameter, not in the state_dict).
        pos = get_2d_sincos_pos_embed(hidden, self.grid)
        self.register_buffer("pos_embed", torch.from_numpy(pos).float().unsqueeze(0), persistent=False)
        self.blocks = nn.ModuleList(DiTBlock(hidden, heads, text_width, mlp_ratio, attention) for _ in range(depth))
        self.final_layer = FinalLayer(hidden, patch, in_channels)
        self._initialize_weights()
        self.attention_layers = name_attention_layers(self)

    def _initialize_weights(self) -> None:
        """DiT's initialisation for the image part; the text tower keeps open_clip's."""
        for name, module in self.named_modules():
            if name.startswith("text."):
                continue
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, Attention):
                module.reset_parameters()
        w = self.x_embedder.proj.weight.data
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))  # like nn.Linear, as in DiT
        nn.init.zeros_(self.x_embedder.proj.bias)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        nn.init.normal_(self.y_embedder.weight, std=0.02)
        for block in self.blocks:  # adaLN-Zero: every block starts as the identity
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
            nn.init.zeros_(block.cross_attn.out_proj.weight)  # PixArt: cross-attention starts silent too
        nn.init.zeros_(self.final_layer.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.final_layer.adaLN_modulation[-1].bias)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    def tokenize(self, captions: list[str]) -> torch.Tensor:
        return self.text.tokenize(captions)

    def encode_text(self, tokens: torch.Tensor) -> TextFeatures:
        """tokens (B, L) int64 -> caption features; compute once per caption, reuse over sampling steps."""
        return self.text(tokens)

    def forward(self, x: torch.Tensor, t: torch.Tensor, text: TextFeatures) -> torch.Tensor:
        """x (B, C, H, W) noisy images, t (B,) timesteps, text from encode_text -> predicted noise (B, C, H, W)."""
        x = x.to(self.x_embedder.proj.weight.dtype)
        x = self.x_embedder(x) + self.pos_embed.to(x.dtype)  # (B, N, hidden)
        c = self.t_embedder(t) + self.y_embedder(text.pooled)  # (B, hidden)
        for block in self.blocks:
            x = block(x, c, text.tokens)  # (B, N, hidden)
        return self.unpatchify(self.final_layer(x, c))

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, p*p*C) -> (B, C, H, W)."""
        p, g, ch = self.patch, self.grid, self.in_channels
        x = x.reshape(x.shape[0], g, g, p, p, ch)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(x.shape[0], ch, g * p, g * p)


def get_2d_sincos_pos_embed(dim: int, grid: int) -> np.ndarray:
    """(grid*grid, dim) fixed sin-cos position embedding (MAE / DiT)."""
    coords = np.arange(grid, dtype=np.float64)
    w, h = np.meshgrid(coords, coords)  # w varies fastest, as patches are flattened row by row
    return np.concatenate([_sincos_1d(dim // 2, h.reshape(-1)), _sincos_1d(dim // 2, w.reshape(-1))], axis=1)


def _sincos_1d(dim: int, positions: np.ndarray) -> np.ndarray:
    omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
    out = np.einsum("m,d->md", positions, omega)  # (M, dim/2)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)
