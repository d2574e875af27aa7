"""A Hugging Face causal language model built from a config, offline, its attention computed by numdev.

`model=hf_llama_tiny` (and the other conf/train/model/hf_*.yaml files) gives a transformers config in
YAML: `model_type` (llama, qwen2, gpt2, mistral, ...: any causal LM that dispatches its attention
through transformers' attention-function registry) and the config's own keys. transformers builds
the model with random initialisation (`AutoModelForCausalLM.from_config`: nothing is downloaded;
its own `_init_weights`, drawn from the global RNG that the training app seeds with seed.init, so
the weights do not depend on the attention backend).

Attention: the model is built with `attn_implementation="numdev"`, a function registered in
transformers' AttentionInterface (and sdpa's mask function under the same name, which gives no
mask for causal, unpadded windows). transformers computes the projections, rotary embeddings and
the rest as it always does; at the softmax(Q K^T) V step it calls that function, which repeats
grouped key/value heads to the query heads (transformers' repeat_kv) and hands q, k, v to the
layer's `numdev_attention` (numdev.models.attention.AttentionCall) and so to the configured
backend: every backend, optimization, shadow comparison and per-call record works as on
numdev's own models. What the function refuses, with the setting to change: a padding or custom
mask, attention dropout while training, a scale other than 1/sqrt(head_dim), soft-capping, sliding
windows (numdev's backends compute full causal attention).

transformers is an optional extra: `pip install -e '.[hf]'`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from numdev.attention.registry import AttentionBackend
from numdev.config.groups import nearest
from numdev.models.attention import AttentionCall, name_attention_layers

IMPLEMENTATION = "numdev"  # the name under which numdev's attention function is registered in transformers
INSTALL = "pip install -e '.[hf]' (transformers)"


def _transformers():
    try:
        import transformers
    except ImportError as error:
        raise ImportError(f"model=hf_* needs transformers, which is not installed: {INSTALL}") from error
    return transformers


def numdev_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers' attention-function signature: q (B, H, N, D), k and v (B, H_kv, L, D) ->
    (output (B, N, H, D), no weights), computed by the layer's numdev AttentionCall."""
    call = getattr(module, "numdev_attention", None)
    name = type(module).__name__
    if not isinstance(call, AttentionCall):
        raise ValueError(f"{name} has no numdev attention call: build the model with numdev.models.hf.HFCausalLM")
    if attention_mask is not None:
        raise ValueError(f"{call.layer_name}: transformers passed an attention mask (padding or a custom mask); numdev's "
                         "backends compute full causal attention over unpadded windows: train on data=text's windows")
    if dropout and module.training:
        raise ValueError(f"{call.layer_name}: attention dropout {dropout} while training: numdev's backends have none; set "
                         "the model config's attention_dropout (attn_pdrop for gpt2) to 0")
    if scaling is not None and not math.isclose(scaling, query.shape[-1] ** -0.5, rel_tol=1e-6):
        raise ValueError(f"{call.layer_name}: the model scales scores by {scaling}, not 1/sqrt(head_dim) = "
                         f"{query.shape[-1] ** -0.5:.6g}; numdev's backends use 1/sqrt(head_dim): use a config without a custom scale")
    for option in ("softcap", "sliding_window"):
        if kwargs.get(option) is not None:
            raise ValueError(f"{call.layer_name}: {option}={kwargs[option]} is not computed by numdev's backends: use a "
                             f"config without {option}")
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"{call.layer_name}: {query.shape[1]} query heads cannot share {key.shape[1]} key/value heads evenly")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads (transformers' repeat_kv)
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = call(query.to(value.dtype), key.to(value.dtype), value)
    return out.transpose(1, 2).contiguous(), None


def _last_line(error: BaseException) -> str:
    """transformers' message on one line, its last line where it has several (huggingface_hub's validators), cut at 300."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[:300]


def register() -> None:
    """Register numdev's attention function and sdpa's mask function under IMPLEMENTATION (idempotent)."""
    transformers = _transformers()
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    transformers.AttentionInterface.register(IMPLEMENTATION, numdev_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


class HFCausalLM(nn.Module):
    """forward(tokens (B, T) int64) -> next-token logits (B, T, vocabulary), by a transformers model."""

    def __init__(self, attention: AttentionBackend, config: dict, name: str = "hf", context_length: int = 256):
        super().__init__()
        transformers = _transformers()
        if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
            raise ValueError("model.config must be a transformers config with its model_type (llama, qwen2, gpt2, ...)")
        if isinstance(context_length, bool) or not isinstance(context_length, int) or context_length <= 0:
            raise ValueError(f"model.context_length={context_length!r} must be a positive integer")
        settings = {k: v for k, v in config.items() if k != "model_type"}
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if config["model_type"] not in CONFIG_MAPPING:
            near = nearest(config["model_type"], list(CONFIG_MAPPING.keys()))
            raise ValueError(f"model.config.model_type={config['model_type']!r}: transformers {transformers.__version__} does not know "
                             f"it{' (did you mean ' + ' or '.join(near) + '?)' if near else ''}: use one of its model types, e.g. llama, "
                             "qwen2, gpt2")
        config_class = CONFIG_MAPPING[config["model_type"]]
        known = sorted(set(config_class().to_dict()) | set(config_class.attribute_map))
        for key in sorted(set(settings) - set(known)):  # transformers would keep a misspelled key and use the default
            near = nearest(key, known)
            raise ValueError(f"model.config.{key} is not a setting of transformers' {config_class.__name__}"
                             f"{' (did you mean ' + ' or '.join(near) + '?)' if near else ''}: transformers would ignore it "
                             "and build its default; fix the key (model.config holds the config's own keys)")
        try:
            hf_config = config_class(**settings)
        except Exception as error:  # noqa: BLE001 - transformers' validators raise their own classes (huggingface_hub's)
            raise ValueError(f"model.config: transformers' {config_class.__name__} refuses it: {_last_line(error)}") from None
        heads, kv_heads = hf_config.num_attention_heads, getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
        if heads % kv_heads:
            raise ValueError(f"model.config.num_attention_heads={heads} is not a multiple of model.config.num_key_value_heads={kv_heads}: "
                             "each key/value head serves a whole group of query heads; change one of them")
        for key in ("max_position_embeddings", "n_positions"):
            limit = getattr(hf_config, key, None)
            if isinstance(limit, int) and limit < context_length:
                raise ValueError(f"model.config.{key}={limit} is shorter than model.context_length={context_length}: "
                                 "the model has no position for the later tokens")
        register()
        try:
            self.hf = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation=IMPLEMENTATION)
        except Exception as error:  # noqa: BLE001 - not a causal LM (t5), an attention implementation it refuses, a shape it cannot build
            raise ValueError(f"model.config.model_type={config['model_type']!r}: transformers builds no causal language model "
                             f"from it with numdev's attention ({_last_line(error)}): choose a decoder-only type "
                             "(llama, qwen2, gpt2, mistral)") from None
        if not getattr(self.hf, "_supports_attention_backend", False):
            raise ValueError(f"model.config.model_type={config['model_type']!r}: its transformers model does not dispatch "
                             "attention through the attention-function registry, so numdev's backends cannot compute it: "
                             "choose another model type (llama, qwen2, gpt2, mistral)")
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        layers = [m for m in self.hf.modules() if hasattr(m, "layer_idx") and type(m).__name__.endswith("Attention")]
        if not layers:
            raise ValueError(f"model.config.model_type={config['model_type']!r}: no attention layers found in its model")
        for layer in layers:
            layer.numdev_attention = AttentionCall(heads, head_dim, attention, causal=True)
        self.name, self.context_length = name, context_length
        self.vocabulary = hf_config.vocab_size
        self.model_type = config["model_type"]
        name_attention_layers(self)

    def get_input_embeddings(self) -> nn.Module:
        """The token embedding (transformers' own accessor): the token-rows record reads it (GPT-2 has position embeddings too)."""
        return self.hf.get_input_embeddings()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=tokens, use_cache=False).logits
