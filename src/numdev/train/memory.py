"""How much memory a training run will need, estimated before anything is allocated.

Like the microbenchmark's preflight (numdev.bench.memory), a run whose estimate exceeds the memory
available is refused in one line with the estimate, instead of allocating for minutes (a batch of
10^8 images) or failing inside the model's constructor (a hidden size of 200000). The estimate is
deliberately on the low side, so that a run that fits is never refused:

- parameters: counted exactly by building the model on PyTorch's "meta" device (no memory), times
  16 bytes (float32 weights, gradients, and AdamW's two moments) + 4 (the float32 snapshot copy);
- activations kept for the backward pass: per transformer block, ~8 values per token and hidden
  unit (image tokens (resolution/patch)^2, caption tokens context_length), plus the attention
  probabilities (batch x heads x tokens x keys) for backends that materialise them (baseline,
  eager, sdpa_math); 4 bytes each (2 under a 16-bit mixed precision);
- the batch of images itself, with its noise and noisy copy.

It is compared with MemAvailable (/proc/meminfo) for a CPU trainer, with the free memory of the
GPU for a GPU trainer; where neither can be read, nothing is checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from numdev.runs.provenance import available_bytes, gib

MATERIALISED = ("baseline", "eager", "sdpa_math")  # backends that hold the whole score matrix
SAVED_PER_TOKEN = 8  # values saved for backward per token and hidden unit in one block (low side)
PARAMETER_BYTES = 16 + 4  # weights, gradients, two AdamW moments, the snapshot copy (float32)


@dataclass
class Estimate:
    parameters: int
    parameter_bytes: int
    activation_bytes: int

    @property
    def total(self) -> int:
        return self.parameter_bytes + self.activation_bytes


def count_parameters(cfg: DictConfig, backend) -> int:
    """The model's parameter count, from building it on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = instantiate(cfg.model, attention=backend, _convert_="all")
    return sum(p.numel() for p in model.parameters())


# A language model's (depth, hidden, heads): numdev's GPT keys, or its transformers config's (model=hf*: numdev.models.hf)
_LM_KEYS = (("depth", "hidden", "heads"), ("config.num_hidden_layers", "config.hidden_size", "config.num_attention_heads"),
            ("config.n_layer", "config.n_embd", "config.n_head"))


def _lm_shape(model: DictConfig) -> tuple[int, int, int] | None:
    for keys in _LM_KEYS:
        values = [OmegaConf.select(model, key) for key in keys]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return tuple(values)
    return None


def _integer(data: DictConfig, key: str) -> int:
    """data.<key> as an int, or one line naming it (data.sequence_length is model.context_length unless set)."""
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        origin = " (data=text takes it from model.context_length)" if key == "sequence_length" else ""
        raise ValueError(f"data.{key}={value!r}{origin} must be a positive integer")
    return value


def _model_integer(model: DictConfig, key: str) -> int:
    """model.<key>, or the default its constructor gives it when the key is absent (`~model.depth`):
    the size the model will be built with."""
    import inspect

    from numdev.config.preflight import constructor_parameter

    if key in model:
        return int(model[key])
    parameter = constructor_parameter(model.get("_target_"), key)
    default = parameter.default if parameter is not None else inspect.Parameter.empty
    if default is inspect.Parameter.empty or isinstance(default, bool) or not isinstance(default, int):
        raise ValueError(f"model.{key} is not set and {model.get('_target_')} gives it no default: set model.{key}=...")
    return default


def _size_keys(model: DictConfig) -> str:
    """The model's size settings as key=value, for the message (what to lower)."""
    for keys in _LM_KEYS + (("hidden", "depth"),):
        if all(OmegaConf.select(model, key) is not None for key in keys):
            return ", ".join(f"model.{key}={OmegaConf.select(model, key)}" for key in keys)
    return f"model={model.get('name', '?')}"


def estimate(cfg: DictConfig, backend, parameters: int | None = None) -> Estimate:
    """The estimate; `parameters` None: counted on the meta device, 0: left out (activations only)."""
    model, data = cfg.model, cfg.data
    value_bytes = 2 if str(cfg.precision.get("name", "")).startswith(("bf16-mixed", "fp16-mixed", "16")) else 4
    materialised = getattr(backend, "name", "") in MATERIALISED
    if "sequence_length" in data and _lm_shape(model) is not None:  # token windows (numdev.data.text) through a causal LM
        batch, length = _integer(data, "batch_size"), _integer(data, "sequence_length")
        depth, hidden, heads = _lm_shape(model)
        values = batch * (depth * (length * hidden * SAVED_PER_TOKEN + (heads * length * length if materialised else 0)) + 3 * length)
        parameters = count_parameters(cfg, backend) if parameters is None else parameters
        return Estimate(parameters, parameters * PARAMETER_BYTES, values * value_bytes)
    if "resolution" not in data or "patch" not in model:  # a user's own model (model=custom): its weights only
        parameters = count_parameters(cfg, backend) if parameters is None else parameters
        return Estimate(parameters, parameters * PARAMETER_BYTES, 0)
    batch, resolution = _integer(data, "batch_size"), _integer(data, "resolution")
    image_tokens = (resolution // _model_integer(model, "patch")) ** 2
    text = model.text
    caption_tokens = int(text.context_length)
    per_block = image_tokens * _model_integer(model, "hidden") * SAVED_PER_TOKEN
    if materialised:
        per_block += _model_integer(model, "heads") * image_tokens * (image_tokens + caption_tokens)
    per_text_layer = caption_tokens * int(text.width) * SAVED_PER_TOKEN
    if materialised:
        per_text_layer += int(text.heads) * caption_tokens * caption_tokens
    values = batch * (_model_integer(model, "depth") * per_block + int(text.layers) * per_text_layer + 3 * 3 * resolution * resolution)
    parameters = count_parameters(cfg, backend) if parameters is None else parameters
    return Estimate(parameters, parameters * PARAMETER_BYTES, values * value_bytes)


def available_for(cfg: DictConfig) -> tuple[int | None, str]:
    """(bytes available, where) for the configured accelerator; None where it cannot be read."""
    accelerator = str(cfg.trainer.get("accelerator", "cpu"))
    if accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return free, "free on the GPU"
    return available_bytes(), "available (MemAvailable)"


def check_training_memory(cfg: DictConfig, backend) -> Estimate | None:
    """Refuse (ValueError, one line) a run whose estimate exceeds the memory available."""
    limit, where = available_for(cfg)
    if limit is None:
        return None
    need = estimate(cfg, backend, parameters=0)  # activations first: building even a meta model allocates its buffers
    if need.total <= limit:
        need = estimate(cfg, backend)
    if need.total > limit:
        raise ValueError(
            f"data.batch_size={cfg.data.batch_size}, {_input_size(cfg.data)}, {_size_keys(cfg.model)}"
            f"{f' ({need.parameters:,} parameters)' if need.parameters else ''}: training needs at least ~{gib(need.total)} "
            f"(weights, gradients and optimizer state {gib(need.parameter_bytes)}, activations of one batch "
            f"{gib(need.activation_bytes)}), more than the {gib(limit)} {where}: lower data.batch_size, the model's "
            f"size or {_input_size(cfg.data).split('=')[0]}"
        )
    return need


def _input_size(data: DictConfig) -> str:
    """The data setting that sets a batch's size besides data.batch_size, as key=value."""
    key = "sequence_length" if "sequence_length" in data else "resolution" if "resolution" in data else "train"
    return f"data.{key}={data.get(key)}"
