"""bf16_kahan, bf16_sr: AdamW on bf16 weights whose parameter update keeps what rounding to nearest loses.

Under precision=bf16-true (Lightning's HalfPrecision: weights, gradients and AdamW's moments in
bf16) every step ends with p <- p + u rounded to the nearest bf16, and an update below half an ulp
of p (2^-9 of |p|) is lost whole: pure-bf16 training stalls where fp32 training keeps moving
(Zamirai et al. 2020, "Revisiting BFloat16 Training"). Their two fixes, as the `update` of one
optimizer, `BF16AdamW`:

  kahan       Kahan-compensated: a compensation buffer c per parameter, in the parameter's dtype
              (bf16), kept in the optimizer state (so checkpoints carry it): y = u - c;
              t = p + y rounded to bf16; c = (t - p) - y; p = t. The arithmetic is fp32, c is stored
              rounded to bf16. What one rounding drops, the next update gets back.
  stochastic  p + u formed in fp32, then rounded stochastically to bf16: a uniform random 16-bit
              integer is added to the low 16 bits of the fp32 bit pattern, which are then cleared.
              It rounds away from zero with probability (low 16 bits) / 2^16, so E[round(x)] = x
              exactly. The bits come from the optimizer's own torch.Generator, seeded with the run's
              seed.rounding, 16 per element (`random_bits`), and its state is in the optimizer's
              state_dict, so a resumed run draws the same bits. inf and NaN pass through; a finite
              x beyond bf16's largest value rounds up to inf with that same probability.
  nearest     round to nearest: torch.optim.AdamW's own result (a reference for the tests).

Everything before p + u is torch.optim.AdamW's single-tensor arithmetic on the bf16 state, op for
op (moments by lerp_ and mul_/addcmul_, denom in bf16), and u = (-lr / bias_correction1) *
exp_avg / denom in fp32, as torch's addcdiv_ computes it: with `nearest` the result is
torch.optim.AdamW's bit for bit (weight decay 0; decay is part of u here, -lr * weight_decay * p,
where torch rounds it separately). So a bf16_kahan or bf16_sr run differs from plain bf16-true
AdamW in the rounding of the parameter update and in nothing else.
"""

from __future__ import annotations

import functools

import torch

from numdev.numerics.formats import SEED_LIMIT, parse_format, round_stochastic
from numdev.optimizations.base import Optimization

UPDATES = ("nearest", "kahan", "stochastic")
LOW_BITS = 1 << 16  # the fp32 bits a bf16 drops
_BF16_SR = parse_format("bf16:sr16")
REFUSED = ("amsgrad", "foreach", "fused", "capturable", "differentiable")  # AdamW paths this update is not written for


def random_bits(shape, generator: torch.Generator) -> torch.Tensor:
    """16 uniform random bits per element (int32 in [0, 2^16)), from `generator`."""
    return torch.randint(0, LOW_BITS, tuple(shape), generator=generator, dtype=torch.int32)


def stochastic_round_bf16(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """fp32 x rounded to bf16 stochastically with the given bits (int32 in [0, 2^16), x's shape):
    numdev.numerics.formats' stochastic rounding to bf16:sr16 (the bits added to the low 16 bits of x's
    fp32 pattern, which are then cleared; inf and NaN returned as they are)."""
    if x.dtype != torch.float32:
        raise TypeError(f"stochastic rounding to bf16 takes float32, not {x.dtype}")
    return round_stochastic(x, _BF16_SR, bits).bfloat16()  # exact: the low 16 bits are 0


class BF16AdamW(torch.optim.AdamW):
    """torch.optim.AdamW for bf16 parameters with the parameter update rounded by `update` (module docstring)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 update: str = "kahan", seed: int = 0):
        if update not in UPDATES:
            raise ValueError(f"optimization.update={update!r}: use one of {', '.join(UPDATES)}")
        options = {"amsgrad": amsgrad, "foreach": foreach, "fused": fused, "capturable": capturable, "differentiable": differentiable}
        for key in REFUSED:
            if options[key]:
                raise ValueError(f"optim.optimizer.{key}={options[key]!r}: the bf16 {update} update is written for AdamW's "
                                 f"plain single-tensor path; leave {key} unset")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize, foreach=False)
        self.update = update
        self.generator = torch.Generator().manual_seed(int(seed)) if update == "stochastic" else None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = float(group["lr"]), group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:  # no gradient (the instability monitor's skip): nothing moves, as in AdamW
                    continue
                if p.dtype != torch.bfloat16:
                    raise ValueError(f"the bf16 {self.update} update needs bf16 parameters (precision=bf16-true), not {p.dtype}")
                grad = -p.grad if group["maximize"] else p.grad
                state = self.state[p]
                if not state:  # as torch.optim.Adam._init_group, plus the compensation
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if self.update == "kahan":
                        state["kahan_compensation"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
                # torch.optim.adam._single_tensor_adam, op for op (not capturable, not differentiable, no amsgrad)
                step_t += 1
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step = step_t.item()
                step_size = lr / (1 - beta1**step)
                denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
                u = exp_avg.float().mul_(-step_size).div_(denom.float())  # addcdiv_'s (value * t1) / t2, in fp32
                if decay != 0:  # AdamW's decoupled decay, part of the same update
                    u.add_(p.float().mul_(-lr * decay))
                self._apply(p, u, state)
        return loss

    def _apply(self, p: torch.Tensor, u: torch.Tensor, state: dict) -> None:
        """p <- p + u (u in fp32), rounded by self.update."""
        if self.update == "nearest":
            p.copy_(p.float().add_(u))
        elif self.update == "stochastic":
            p.copy_(stochastic_round_bf16(p.float().add_(u), random_bits(p.shape, self.generator)))
        else:
            c = state["kahan_compensation"]
            y = u.sub_(c.float())
            t = p.float().add_(y).bfloat16()
            c.copy_(t.float().sub_(p.float()).sub_(y))
            p.copy_(t)

    def state_dict(self):
        out = super().state_dict()
        if self.generator is not None:
            out["rounding_generator"] = self.generator.get_state()
        return out

    def load_state_dict(self, state_dict) -> None:
        state_dict = dict(state_dict)
        generator = state_dict.pop("rounding_generator", None)
        if self.generator is not None:
            if generator is None:
                raise ValueError("the optimizer state has no rounding generator: it was not written by the bf16 stochastic update "
                                 "(optimization=bf16_sr)")
            self.generator.set_state(generator)
        super().load_state_dict(state_dict)


class BF16Update(Optimization):
    """optimization=bf16_kahan / bf16_sr: the run's AdamW replaced by BF16AdamW with that update."""

    kernel = "real"  # the update as written here; torchao's _AdamW(bf16_stochastic_round=True) rounds by the same rule
    precisions = ("bf16-true",)

    def __init__(self, name: str, update: str, precision: str, seed: int | None = None):
        super().__init__(name)
        if update not in UPDATES[1:]:
            raise ValueError(f"optimization.update={update!r}: use kahan or stochastic")
        if precision not in self.precisions:
            raise ValueError(f"optimization={name} rounds the update of bf16 weights: it needs precision=bf16-true (weights, "
                             f"gradients and AdamW's state in bf16), not precision={precision}; add precision=bf16-true")
        if update == "stochastic" and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT):
            raise ValueError(f"optimization.seed={seed!r} must be a non-negative integer below 2^64 (seed.rounding)")
        self.update, self.precision, self.seed = update, precision, seed

    def optimizer(self, factory):
        target = factory.func if isinstance(factory, functools.partial) else factory
        if target is not torch.optim.AdamW:
            raise ValueError(f"optimization={self.name}: optim.optimizer is {getattr(target, '__name__', target)}; the {self.update} "
                             "update is written for torch.optim.AdamW (optim.optimizer._target_)")
        options = factory.keywords if isinstance(factory, functools.partial) else {}
        for key in REFUSED:
            if options.get(key):
                raise ValueError(f"optim.optimizer.{key}={options[key]!r}: optimization={self.name} is written for AdamW's plain "
                                 f"single-tensor path; leave {key} unset")
        return functools.partial(BF16AdamW, *factory.args, **options, update=self.update, seed=self.seed or 0)

    def describe(self, model=None, optimizer=None) -> dict:
        out = {**super().describe(), "update": self.update, "precision": self.precision}
        if self.update == "stochastic":
            out["seed"] = self.seed
        if optimizer is not None:
            out["optimizer"] = type(optimizer).__name__
            out["optimizer_update"] = getattr(optimizer, "update", None)
        return out
