"""Attention backends behind one registry (see registry.py for the calling convention)."""

from numdev.attention.baseline import Baseline
from numdev.attention.eager import Eager
from numdev.attention.flash_attn_backend import FlashAttn
from numdev.attention.flash_emulated import FlashEmulated
from numdev.attention.golden import golden_attention
from numdev.attention.output_noise import OutputNoise
from numdev.attention.registry import (
    AttentionBackend,
    BackendUnavailable,
    available_backends,
    backend_names,
    build_backend,
)
from numdev.attention.score_scale import ScoreScale
from numdev.attention.sdpa import SdpaCudnn, SdpaEfficient, SdpaFlash, SdpaMath
from numdev.attention.triton_backend import TritonFlash

__all__ = [
    "AttentionBackend",
    "BackendUnavailable",
    "Baseline",
    "Eager",
    "FlashAttn",
    "FlashEmulated",
    "OutputNoise",
    "ScoreScale",
    "SdpaCudnn",
    "SdpaEfficient",
    "SdpaFlash",
    "SdpaMath",
    "TritonFlash",
    "available_backends",
    "backend_names",
    "build_backend",
    "golden_attention",
]
