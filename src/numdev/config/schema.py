"""The types and ranges of numdev's config values: one place, checked once when a command starts.

Each section of a config is declared by a dataclass whose fields are the keys, each with its check
(`integer`, `number`, `boolean`, `integers`). `validate(cfg, SCHEMA)` checks every declared key
that the composed config holds and raises one ValueError naming the first bad key:

    model.heads=0 must be a positive integer
    causal='false' must be true or false (unquoted: causal=false)

Strings are never converted: a quoted `"false"` is refused rather than read as true, `"3"` is not an
integer. Keys a schema does not declare are left alone (Hydra already refuses unknown keys), so to
check a new key add one line to its section's dataclass, e.g. in `Inputs`:

    lo: float | None = number()
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from omegaconf import DictConfig, ListConfig, OmegaConf

from numdev.numerics.formats import SEED_LIMIT
from numdev.runs.harm_summary import CLAIMS, PRIMARY_OUTCOME
from numdev.stats.equivalence import TESTS

_ABSENT = object()


@dataclass(frozen=True)
class Check:
    kind: str  # integer | number | boolean (choices: strings also taken) | integers | numbers (a list of `count` numbers) | choice | string
    min: float | None = None  # inclusive
    above: float | None = None  # exclusive lower bound
    max: float | None = None  # inclusive
    below: float | None = None  # exclusive upper bound
    null: bool = False
    count: int | None = None  # numbers: the list's length
    choices: tuple[str, ...] = ()  # choice: the allowed strings

    def describe(self) -> str:
        if self.kind == "boolean":
            return "true or false" + "".join(f" or {c}" for c in self.choices) + (" or null" if self.null else "")
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices) + (" or null" if self.null else "")
        if self.kind == "string":
            return "a name" + (" or null" if self.null else "")
        if self.kind == "numbers":
            item = Check("number", self.min, self.above, self.max, self.below).describe().removeprefix("a number").strip()
            return f"a list of {self.count} numbers, each {item}, e.g. [{', '.join(['0.9'] * (self.count or 1))}]"
        if self.kind == "integers":
            text = "a list of " + ("non-negative integers" if self.min == 0 else "integers")
            text += " below 2^64" if self.below == SEED_LIMIT else ""
            text += ", e.g. [0,1]"
        elif self.kind == "integer":
            if self.below == SEED_LIMIT:
                text = "a non-negative integer below 2^64 (a 64-bit seed)"
            elif self.max is None and self.min in (0, 1):
                text = "a non-negative integer" if self.min == 0 else "a positive integer"
            else:
                text = "an integer" + _range(self.min, self.max)
        else:
            if self.below is not None:
                text = f"a number in [{self.min:g}, {self.below:g})"
            elif self.max is None and self.min is None and self.above is not None:
                text = "a positive number" if self.above == 0 else f"a number > {self.above:g}"
            elif self.max is None and self.min == 0:
                text = "a non-negative number"
            elif self.above is not None:
                text = f"a number in ({self.above:g}, {self.max:g}]" if self.max is not None else f"a number > {self.above:g}"
            else:
                text = "a number" + _range(self.min, self.max)
        return text + (" or null" if self.null else "")

    def ok(self, value) -> bool:
        if value is None:
            return self.null
        if self.kind == "boolean":  # (null handled above)
            return isinstance(value, bool) or (isinstance(value, str) and value in self.choices)
        if self.kind == "choice":
            return isinstance(value, str) and value in self.choices
        if self.kind == "string":
            return isinstance(value, str) and value.strip() != ""
        if self.kind == "integers":
            return isinstance(value, (list, tuple, ListConfig)) and len(value) > 0 and all(
                Check("integer", self.min, below=self.below).ok(v) for v in value
            )
        if self.kind == "numbers":
            return isinstance(value, (list, tuple, ListConfig)) and len(value) == self.count and all(
                Check("number", self.min, self.above, self.max, self.below).ok(v) for v in value
            )
        if isinstance(value, bool) or not isinstance(value, int if self.kind == "integer" else (int, float)):
            return False
        if not math.isfinite(value):
            return False
        return (
            (self.min is None or value >= self.min)
            and (self.above is None or value > self.above)
            and (self.max is None or value <= self.max)
            and (self.below is None or value < self.below)
        )


def _range(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo:g}, {hi:g}]"
    return f" >= {lo:g}" if lo is not None else f" <= {hi:g}" if hi is not None else ""


def integer(min: int | None = None, max: int | None = None, null: bool = False, below: int | None = None):
    return field(default=None, metadata={"check": Check("integer", min=min, max=max, below=below, null=null)})


def seed():
    """A seed: a non-negative integer below 2^64 (what torch.manual_seed takes)."""
    return integer(min=0, below=SEED_LIMIT)


def number(min: float | None = None, max: float | None = None, above: float | None = None, below: float | None = None,
           null: bool = False):
    return field(default=None, metadata={"check": Check("number", min=min, max=max, above=above, below=below, null=null)})


def boolean(*also: str, null: bool = False):
    """true or false (or one of the strings `also`: Lightning's deterministic takes "warn")."""
    return field(default=None, metadata={"check": Check("boolean", choices=also, null=null)})


def name(null: bool = False):
    return field(default=None, metadata={"check": Check("string", null=null)})


def one_of(*choices: str, null: bool = False):
    return field(default=None, metadata={"check": Check("choice", choices=choices, null=null)})


def integers(min: int | None = None, below: int | None = None):
    return field(default=None, metadata={"check": Check("integers", min=min, below=below)})


def numbers(count: int, min: float | None = None, below: float | None = None):
    return field(default=None, metadata={"check": Check("numbers", min=min, below=below, count=count)})


def validate(cfg: DictConfig, schema: dict[str, type]) -> None:
    """Check every key that `schema` ({section prefix: dataclass}) declares and `cfg` holds."""
    for prefix, section in schema.items():
        for f in fields(section):
            key = f"{prefix}.{f.name}" if prefix else f.name
            value = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False)
            if value is _ABSENT:
                continue
            check: Check = f.metadata["check"]
            if not check.ok(value):
                shown = OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value
                hint = ""
                if check.kind == "boolean" and str(shown).lower() in ("true", "false"):
                    hint = f" (unquoted: {key}={str(shown).lower()})"
                elif isinstance(value, float) and not math.isfinite(value):
                    hint = " (finite)"
                raise ValueError(f"{key}={shown!r} must be {check.describe()}{hint}")


# -- sections shared by both commands -------------------------------------------------------------
@dataclass
class Inputs:  # conf/bench/inputs/*.yaml (numdev-bench)
    scale: float = number(above=0)
    quantize: bool = boolean()
    outlier_std: float = number(min=0)
    outlier_prob: float = number(min=0, max=1)


@dataclass
class Shape:
    batch: int = integer(min=1)
    heads: int = integer(min=1)
    seq_q: int = integer(min=1)
    seq_k: int | None = integer(min=1, null=True)
    dim: int = integer(min=1)


@dataclass
class Tiles:
    block_r: int | None = integer(min=1, null=True)
    block_c: int | None = integer(min=1, null=True)
    sram: int | None = integer(min=1, null=True)
    kv_blocks: int | None = integer(min=1, null=True)


@dataclass
class Bench:  # top-level keys of conf/bench/bench.yaml
    causal: bool = boolean()
    seeds: list = integers(min=0, below=SEED_LIMIT)
    memory_limit_gb: float | None = number(above=0, null=True)
    verbose: bool = boolean()


BENCH = {"": Bench, "shape": Shape, "tiles": Tiles, "inputs": Inputs}


# -- numdev-train -------------------------------------------------------------------------------------
@dataclass
class Model:
    hidden: int = integer(min=1)
    depth: int = integer(min=1)
    heads: int = integer(min=1)
    patch: int = integer(min=1)


@dataclass
class TextModel:
    width: int = integer(min=1)
    heads: int = integer(min=1)
    layers: int = integer(min=1)
    context_length: int = integer(min=1)
    output_dim: int = integer(min=1)


@dataclass
class Data:
    resolution: int = integer(min=1)
    batch_size: int = integer(min=1)
    num_workers: int = integer(min=0)
    max_caption_chars: int = integer(min=1)


@dataclass
class Trainer:
    max_steps: int = integer(min=1)
    log_every_n_steps: int = integer(min=1)
    num_nodes: int = integer(min=1)
    gradient_clip_val: float | None = number(min=0, null=True)
    enable_progress_bar: bool = boolean()
    enable_model_summary: bool = boolean()
    deterministic: bool | str | None = boolean("warn", null=True)  # warn: torch.use_deterministic_algorithms(True, warn_only=True)


@dataclass
class Optimizer:
    lr: float = number(above=0)
    weight_decay: float = number(min=0)
    betas: list = numbers(2, min=0, below=1)  # Adam's (beta1, beta2)
    eps: float = number(above=0)
    momentum: float = number(min=0)  # SGD, RMSprop
    amsgrad: bool = boolean()


@dataclass
class Optim:
    warmup_steps: int = integer(min=0)
    cooldown_steps: int = integer(min=0)


@dataclass
class Diffusion:
    p_uncond: float = number(min=0, below=1)  # 1 would never show the model a caption


@dataclass
class Schedule:
    num_steps: int = integer(min=1)


@dataclass
class Sampler:
    steps: int = integer(min=1)
    eta: float = number(min=0, max=1)
    guidance: float = number(min=0)


@dataclass
class Seeds:
    init: int = seed()
    data: int = seed()
    noise: int = seed()
    perturbation: int = seed()
    rounding: int = seed()


@dataclass
class Every:  # a callback with a period
    every_n_steps: int = integer(min=1)


@dataclass
class Snapshot:
    every_n_steps: int = integer(min=1)
    sorted_values: bool = boolean()
    trained_only: bool = boolean()


@dataclass
class Samples:
    every_n_steps: int = integer(min=1)
    num_samples: int = integer(min=1)
    seed: int = seed()


@dataclass
class HeldOut:
    num_images: int = integer(min=1)
    batch_size: int = integer(min=1)
    seed: int = seed()


@dataclass
class Instability:
    spike_factor: float = number(above=1)
    ema_beta: float = number(min=0, below=1)
    warmup_steps: int = integer(min=0)
    check_loss: bool = boolean()
    check_gradients: bool = boolean()
    check_attention: bool = boolean()


@dataclass
class Shadow:
    every_n_steps: int = integer(min=1)
    backward: bool = boolean()


@dataclass
class Sibling:
    timeout_s: float = number(min=0)


@dataclass
class Study:  # conf/train/study/*.yaml and the study experiments
    lr: float = number(above=0)  # experiment=harm's learning rate (lr_x10 scales it)
    kv_block: int = integer(min=1)  # the Flash roles' key/value block
    claim: str | None = one_of(*CLAIMS, null=True)  # a role's pre-registered claim (docs/harm.md#claims)
    claim_than: str | None = name(null=True)  # the other role of claim=more_harm_than


@dataclass
class StudyHarm:  # experiment=harm: the pre-registered judgement (numdev.analysis.harm)
    outcome: str = one_of(PRIMARY_OUTCOME)
    margin: float = number(above=0, max=10)  # relative held-out loss
    accuracy_margin: float = number(above=0, max=1)  # caption agreement, a fraction (0.05: 5 points)
    test: str = one_of(*TESTS)  # what the claims are judged by: the exact sign test or the t test
    learned_below: float | None = number(above=0, null=True)  # a user's model (model=custom): the held-out loss the reference must reach (LEARNED_RULE)


@dataclass
class Train:  # top-level keys of conf/train/train.yaml
    threads: int | None = integer(min=1, null=True)
    verbose: bool = boolean()


TRAIN = {  # the study's own keys first: a value the study sets elsewhere (optim.optimizer.lr: ${study.lr}) is named as typed
    "study": Study, "study.harm": StudyHarm, "": Train, "model": Model, "model.text": TextModel, "data": Data, "trainer": Trainer,
    "optim": Optim, "optim.optimizer": Optimizer, "diffusion": Diffusion, "diffusion.schedule": Schedule,
    "diffusion.sampler": Sampler, "seed": Seeds, "snapshot": Snapshot, "callbacks.checkpoint": Every,
    "callbacks.samples": Samples, "callbacks.heldout": HeldOut, "callbacks.instability": Instability, "callbacks.shadow": Shadow,
    "sibling": Sibling,
}
