"""How each attention layer's calls are tiled: run.json's `attention_tiling`.

The number of key/value blocks a call is split into is the number of online-softmax rescalings a
tiled kernel makes, one of the things Flash's deviation grows with; a study comparing runs records
it instead of deriving it from the config. At the first training batch a forward pre-hook on every
numdev attention call reads the call's shape (an Attention: query length from its input, key length
from its context, or the input itself for self-attention; an AttentionCall: from q and k), and the layer's backend says how it splits those keys
(numdev.attention.registry.AttentionBackend.kv_tiling: the emulator from its tile rule, PyTorch's
CPU flash kernel from its own rule, untiled backends one block). The hooks are removed once every
layer has been seen: no cost after the first step.

    "attention_tiling": {"layers": [{"layer": "blocks.0.attn", "backend": "flash_emulated",
        "n_queries": 64, "n_keys": 64, "head_dim": 16, "causal": false, "kv_block": 8,
        "kv_blocks": 8, "rule": "..."}, ...]}

Added to run.json when the run ends (finished or stopped; not by a run that failed).
"""

from __future__ import annotations

import lightning.pytorch as pl

from numdev.models.attention import Attention, AttentionCall


class AttentionTiling(pl.Callback):
    def __init__(self):
        self.layers: dict[str, dict] = {}
        self._hooks: list = []

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self._hooks:
            return
        for module in pl_module.model.modules():
            if isinstance(module, AttentionCall):
                self._hooks.append(module.register_forward_pre_hook(self._record, with_kwargs=True))

    def _record(self, module: AttentionCall, args: tuple, kwargs: dict) -> None:
        if module.layer_name in self.layers:
            return
        if isinstance(module, Attention):  # forward(x (B, N, dim), context (B, L, kv_dim) or None)
            x = args[0] if args else kwargs["x"]
            context = args[1] if len(args) > 1 else kwargs.get("context")
            n_queries = x.shape[1]
            n_keys = context.shape[1] if context is not None else n_queries
        else:  # an AttentionCall: forward(q, k, v), each (B, H, N, D)
            x, k = (args[0] if args else kwargs["q"]), (args[1] if len(args) > 1 else kwargs["k"])
            n_queries, n_keys = x.shape[2], k.shape[2]
        backend = module.backend
        self.layers[module.layer_name] = {
            "layer": module.layer_name, "backend": getattr(backend, "name", type(backend).__name__),
            "n_queries": int(n_queries), "n_keys": int(n_keys), "head_dim": module.head_dim, "causal": module.causal,
            **backend.kv_tiling(int(n_queries), int(n_keys), module.head_dim, x.device.type),
        }

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.remove()  # every layer ran in the first step's forward

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.remove()

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def results(self) -> dict:
        return {"attention_tiling": {"layers": list(self.layers.values())}} if self.layers else {}
