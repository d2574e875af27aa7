"""The text tower: open_clip's tokenizer and text transformer, with attention through our module.

The tower *is* open_clip's TextTransformer (token embedding, positional embedding, pre-LN
residual blocks, final LN, EOT pooling, projection), built at any size and trained from scratch,
with one change: each block's nn.MultiheadAttention is replaced by numdev's Attention (same
parameter names), so the text tower's self-attention goes through the configured backend like
every other attention call. The state_dict keys are open_clip's, so `pretrained` can load an
open_clip text tower by name (it downloads, so it needs the network or a warm cache).

Settings that would add a padding or CLS mask (embed_cls, pad masks) are not offered: the
backends take a causal flag, not arbitrary masks, and open_clip's plain causal mask is exactly
`causal=True`.
"""

from __future__ import annotations

from typing import NamedTuple

import open_clip
import torch
from open_clip.transformer import LayerNorm, TextTransformer
from torch import nn

from numdev.attention.registry import AttentionBackend
from numdev.models.attention import Attention


class TextFeatures(NamedTuple):
    tokens: torch.Tensor  # (B, L, width): per-token features, the keys/values of cross-attention
    pooled: torch.Tensor  # (B, output_dim): the EOT token's projected feature


class TextBlock(nn.Module):
    """open_clip's ResidualAttentionBlock with numdev's Attention (same child and parameter names)."""

    def __init__(self, width: int, heads: int, mlp_ratio: float, backend: AttentionBackend):
        super().__init__()
        self.ln_1 = LayerNorm(width)
        self.attn = Attention(width, heads, backend, causal=True)
        self.ls_1 = nn.Identity()
        self.ln_2 = LayerNorm(width)
        mlp_width = int(width * mlp_ratio)
        self.mlp = nn.Sequential()
        self.mlp.add_module("c_fc", nn.Linear(width, mlp_width))
        self.mlp.add_module("gelu", nn.GELU())
        self.mlp.add_module("c_proj", nn.Linear(mlp_width, width))
        self.ls_2 = nn.Identity()

    def get_weight_dtype(self) -> torch.dtype:  # open_clip's TextTransformer casts its embeddings to this
        return self.mlp.c_fc.weight.dtype

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        # open_clip passes its causal mask (the only mask this tower is built with): the backend's
        # causal flag, set at construction, applies the same mask.
        x = x + self.ls_1(self.attn(self.ln_1(x)))  # (B, L, width)
        return x + self.ls_2(self.mlp(self.ln_2(x)))


class TextTower(nn.Module):
    def __init__(
        self,
        attention: AttentionBackend,
        width: int = 512,
        heads: int = 8,
        layers: int = 12,
        context_length: int = 77,
        output_dim: int = 512,
        mlp_ratio: float = 4.0,
        vocab_size: int = 49408,
        pretrained: str | None = None,
    ):
        super().__init__()
        self.context_length = context_length
        self.encoder = TextTransformer(
            context_length=context_length,
            vocab_size=vocab_size,
            width=width,
            heads=heads,
            layers=layers,
            mlp_ratio=mlp_ratio,
            output_dim=output_dim,
            output_tokens=True,
        )
        self.encoder.transformer.resblocks = nn.ModuleList(
            TextBlock(width, heads, mlp_ratio, attention) for _ in range(layers)
        )
        self.encoder.init_parameters()  # open_clip's initialisation, now of our blocks' weights
        if pretrained is not None:
            load_pretrained(self.encoder, pretrained)

    def tokenize(self, captions: list[str]) -> torch.Tensor:
        """open_clip's BPE tokens, (B, context_length) int64; longer captions are truncated."""
        return open_clip.tokenize(list(captions), context_length=self.context_length)

    def forward(self, tokens: torch.Tensor) -> TextFeatures:
        pooled, token_features = self.encoder(tokens)  # (B, output_dim), (B, L, width)
        return TextFeatures(tokens=token_features, pooled=pooled)


def split_pretrained_name(spec: str) -> tuple[str, str | None]:
    """'ViT-B-32/openai' -> ('ViT-B-32', 'openai'); 'hf-hub:org/repo' -> ('hf-hub:org/repo', None)."""
    if spec.startswith("hf-hub:"):
        return spec, None
    model, sep, tag = spec.rpartition("/")
    if not sep or not model or not tag:
        raise ValueError(
            f"model.text.pretrained={spec!r}: give '<open_clip model>/<pretrained tag>', e.g. 'ViT-B-32/openai', "
            "or 'hf-hub:<org>/<repo>'"
        )
    return model, tag


def load_pretrained(encoder: TextTransformer, spec: str) -> None:
    """Load an open_clip text tower by name into `encoder` (sizes must match); one-line errors."""
    model_name, tag = split_pretrained_name(spec)
    if tag is not None:
        known = open_clip.list_models()
        if model_name not in known:
            raise ValueError(f"model.text.pretrained={spec!r}: open_clip has no model {model_name!r} (see open_clip.list_models())")
        tags = open_clip.list_pretrained_tags_by_model(model_name)
        if tag not in tags:
            raise ValueError(
                f"model.text.pretrained={spec!r}: no pretrained weights {tag!r} for {model_name}; "
                f"open_clip has: {', '.join(tags) or 'none'}"
            )
        _check_sizes(encoder, model_name, spec)
    try:
        clip = open_clip.create_model(model_name, pretrained=tag, device="cpu")
    except Exception as error:  # network, cache, checksum: open_clip/huggingface raise many kinds
        reason = " ".join(str(error).split())[:300]
        raise ValueError(
            f"model.text.pretrained={spec!r}: could not load the open_clip weights ({type(error).__name__}: {reason}); "
            "they are downloaded on first use, so this needs the network or a warm cache; "
            "set model.text.pretrained=null to train the text tower from scratch"
        ) from None
    state = _text_state(clip)
    try:
        encoder.load_state_dict(state, strict=True)
    except RuntimeError as error:
        first = str(error).splitlines()[1:2] or [str(error)]
        raise ValueError(
            f"model.text.pretrained={spec!r}: its text tower does not fit this one ({first[0].strip()}); "
            "set model.text width/heads/layers/context_length/output_dim to the pretrained model's"
        ) from None


def _check_sizes(encoder: TextTransformer, model_name: str, spec: str) -> None:
    """Compare sizes with open_clip's config before downloading anything."""
    text_cfg = (open_clip.get_model_config(model_name) or {}).get("text_cfg", {})
    ours = {
        "width": encoder.width,
        "heads": encoder.heads,
        "layers": encoder.transformer.layers,
        "context_length": encoder.context_length,
        "vocab_size": encoder.vocab_size,
    }
    wrong = [f"{k}={text_cfg[k]}" for k, v in ours.items() if k in text_cfg and text_cfg[k] != v]
    if wrong:
        raise ValueError(
            f"model.text.pretrained={spec!r}: its text tower has {', '.join(wrong)}; "
            f"set model.text.{' model.text.'.join(wrong)} (or pretrained=null)"
        )
    if text_cfg.get("embed_cls") or text_cfg.get("no_causal_mask") or text_cfg.get("hf_model_name"):
        raise ValueError(f"model.text.pretrained={spec!r}: only causal open_clip text transformers can be loaded")


def _text_state(clip: nn.Module) -> dict[str, torch.Tensor]:
    """The text tower's parameters under TextTransformer's names, from a CLIP or CustomTextCLIP."""
    if hasattr(clip, "text"):  # CustomTextCLIP keeps the tower as .text
        return {k: v for k, v in clip.text.state_dict().items() if k != "attn_mask"}
    prefixes = ("token_embedding.", "positional_embedding", "transformer.", "ln_final.", "text_projection")
    return {k: v for k, v in clip.state_dict().items() if k.startswith(prefixes)}
