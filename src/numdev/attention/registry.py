"""One registry of attention backends, found by name, all called the same way.

Every backend computes softmax(Q K^T * scale [+ causal mask]) V for q of shape (batch, heads,
n_q, dim) and k, v of shape (batch, heads, n_k, dim), and returns a tensor of q's dtype.
Causal masking is top-left aligned, as in torch SDPA: query i sees keys 0..i.
"""

from __future__ import annotations

import math

import torch

from numdev.attention.checks import check_qkv
from numdev.cli.errors import UserError

_BACKENDS: dict[str, type[AttentionBackend]] = {}


class BackendUnavailable(UserError, RuntimeError):
    """The backend cannot run on this device / dtype / install."""


class AttentionBackend:
    name: str = "?"
    wraps: bool = False  # computes attention with an inner backend it is given (output_noise, score_scale)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None, causal: bool = False
    ) -> torch.Tensor:
        check_qkv(q, k, v)
        reason = self.unsupported_reason(q)
        if reason is not None:
            raise BackendUnavailable(
                f"attention backend {self.name!r} cannot run here: {reason}. "
                f"Backends that can run on {q.device.type} with {str(q.dtype).removeprefix('torch.')}: "
                f"{', '.join(available_backends(q.device, q.dtype)) or 'none'}"
            )
        if scale is None:
            scale = 1.0 / math.sqrt(q.shape[-1])
        return self.forward(q, k, v, float(scale), bool(causal))

    def forward(self, q, k, v, scale: float, causal: bool) -> torch.Tensor:
        raise NotImplementedError

    def unsupported_reason(self, q: torch.Tensor) -> str | None:
        """None when this backend can run on q's device, dtype and head dim; else why not."""
        return None

    def forward_only(self, key: str = "attention") -> str | None:
        """None when this backend has a backward pass (training can use it); else why not and what to
        use instead, naming its config key `key` (a forward-only kernel or formats preset: refused before
        training starts)."""
        return None

    def describe(self) -> dict:
        """The knobs of this backend, JSON-ready, for result records."""
        return {"backend": self.name}

    def kv_tiling(self, n_queries: int, n_keys: int, head_dim: int, device: str = "cpu") -> dict:
        """How one call's n_keys keys and values are split into blocks: {"kv_block": keys per block,
        "kv_blocks": blocks per call, "rule": where the split comes from}. The number of blocks is the
        number of online-softmax rescalings a tiled kernel makes, so runs record it (run.json
        attention_tiling). A backend that does not tile says so (UNTILED); this default is for a
        kernel that picks its own blocks, which numdev does not know: None for both. (Not a method
        `kv_blocks`: that name is flash_emulated's config key for a pinned block count.)"""
        return {"kv_block": None, "kv_blocks": None, "rule": "not known here: the kernel picks its own blocks"}


def one_block(n_keys: int) -> dict:
    """kv_tiling of a backend that does not tile: every key in one block (the whole score row at once)."""
    return {"kv_block": n_keys, "kv_blocks": 1, "rule": UNTILED}


def blocks_of(n_keys: int, block: int, rule: str) -> dict:
    """kv_tiling of a backend that walks the keys in blocks of `block` (the last one may be shorter)."""
    return {"kv_block": block, "kv_blocks": -(-n_keys // block), "rule": rule}


UNTILED = "untiled: the whole score row at once, one block"


def inner_backend(inner, wrapper: str) -> AttentionBackend:
    """The inner backend a wrapper (output_noise, score_scale) computes attention with, checked. There is no
    default: a null or deleted attention.inner would otherwise run some backend the config does not name
    (an eager inner without the run's precision has no autocast of its own)."""
    if isinstance(inner, AttentionBackend):
        return inner
    if inner is None:
        raise ValueError(f"attention.inner is null: attention={wrapper} computes attention with an inner backend, "
                         f"so keep the one its config gives (attention={wrapper} without attention.inner=null) or "
                         "change its keys (attention.inner._target_=numdev.attention.SdpaFlash '~attention.inner.precision')")
    raise ValueError(f"attention.inner must be an attention backend (a _target_ from numdev.attention), got "
                     f"{type(inner).__name__}")


def register(name: str):
    def add(cls):
        cls.name = name
        _BACKENDS[name] = cls
        return cls

    return add


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def backend_class(name: str) -> type[AttentionBackend]:
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}: use one of {', '.join(backend_names())}")
    return _BACKENDS[name]


def build_backend(name: str, **options) -> AttentionBackend:
    """The backend registered under `name`, constructed with `options`."""
    return backend_class(name)(**options)


def available_backends(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> list[str]:
    """Names of the backends (with default options) that run on this device and dtype."""
    probe = torch.zeros(1, 1, 2, 16, device=device, dtype=dtype)
    names = []
    for name in backend_names():
        try:  # a wrapper with its config's inner, eager
            backend = build_backend(name, inner=build_backend("eager")) if backend_class(name).wraps else build_backend(name)
        except Exception:  # a backend whose defaults cannot even be built is not available
            continue
        if backend.unsupported_reason(probe) is None:
            names.append(name)
    return names
