"""optimization=bf16_kahan / bf16_sr (numdev.optimizations.bf16_update): stochastic rounding against its
exact expectation and a direct bit-level reference; a long run of updates below half an ulp lost by
plain bf16 AdamW and kept by both fixes against an exact sum; the rest of the step is torch's AdamW bit
for bit; resume is bit-identical; torchao's bf16 stochastic rounding (when installed) rounds the same."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import compose_train
from hydra.utils import instantiate

from numdev.optimizations import bf16_update
from numdev.optimizations.bf16_update import BF16AdamW, BF16Update, random_bits, stochastic_round_bf16
from numdev.train.run import train
from numdev.weights.store import load_snapshot


def _bf16_neighbours(x: float) -> tuple[float, float, float]:
    """(towards zero, away from zero, probability of away) of fp32 x: its pattern's low 16 bits / 2^16."""
    pattern = int(np.float32(x).view(np.uint32))
    low = pattern & 0xFFFF
    towards = np.uint32(pattern & 0xFFFF0000).view(np.float32)
    away = np.uint32((pattern & 0xFFFF0000) + 0x10000).view(np.float32)
    return float(towards), float(away), low / 65536


@pytest.mark.parametrize("x", [1.0 + 2**-10, -3.14159, 0.1, 1e-3 + 1e-9, 2.0**-130 * 1.37, -(2.0**100) * 1.999, 65504.7])
def test_stochastic_rounding_is_unbiased(x):
    n = 1 << 16
    generator = torch.Generator().manual_seed(11)
    rounded = stochastic_round_bf16(torch.full((n,), x, dtype=torch.float32), random_bits((n,), generator)).double()
    towards, away, p = _bf16_neighbours(x)
    assert set(rounded.unique().tolist()) <= {towards, away}
    x32 = float(np.float32(x))
    assert towards + p * (away - towards) == pytest.approx(x32, rel=1e-15)  # the expectation is x, exactly
    sd = abs(away - towards) * (p * (1 - p) / n) ** 0.5
    assert abs(float(rounded.mean()) - x32) <= 5 * sd + 1e-30 * abs(x32)


def _reference(x: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """The rule written out on unsigned patterns: finite x -> (pattern + bits) with the low 16 bits
    cleared, as bf16's 16-bit pattern; inf and NaN -> x's own upper half (NaN kept a NaN)."""
    pattern = x.view(np.uint32).astype(np.uint64)
    out = (((pattern + bits.astype(np.uint64)) & 0xFFFF0000) >> 16).astype(np.uint16)
    special = ~np.isfinite(x)
    out[special] = (x[special].view(np.uint32) >> 16).astype(np.uint16) | np.where(np.isnan(x[special]), 0x0040, 0).astype(np.uint16)
    return out


def test_stochastic_rounding_is_the_direct_reference_bit_for_bit():
    generator = torch.Generator().manual_seed(5)
    values = torch.cat([
        torch.randn(20000, generator=generator) * torch.logspace(-44, 38, 20000, dtype=torch.float64).float(),  # every binade, subnormals too
        torch.tensor([0.0, -0.0, 1.0, -2.5, 3.3895313892515355e38, -3.3895313892515355e38, 3.4028234663852886e38,
                      -3.4028234663852886e38, float("inf"), float("-inf"), float("nan")]),
        torch.tensor([0x7F800001, 0x7FFFFFFF, 0xFF800001, 0x7FC0FFFF], dtype=torch.int64).to(torch.int32).view(torch.float32),  # NaNs
    ])
    bits = random_bits(values.shape, generator)
    got = stochastic_round_bf16(values, bits).view(torch.int16).numpy().view(np.uint16)
    expected = _reference(values.numpy(), bits.numpy())
    nan = np.isnan(values.numpy())
    assert np.array_equal(got[~nan], expected[~nan])
    assert torch.isnan(stochastic_round_bf16(values, bits)[torch.from_numpy(nan)]).all()  # NaN stays NaN (not inf, not -0)
    big = values.abs() == 3.4028234663852886e38  # fp32's largest: beyond bf16's; rounds to bf16's largest or to inf
    assert set(stochastic_round_bf16(values, bits)[big].abs().tolist()) <= {3.3895313892515355e38, float("inf")}


def test_a_value_bf16_holds_is_never_moved():
    x = torch.randn(4096).bfloat16().float()
    assert torch.equal(stochastic_round_bf16(x, torch.full(x.shape, 0xFFFF, dtype=torch.int32)), x.bfloat16())


class Recording(BF16AdamW):
    """BF16AdamW that keeps every update u it applies (fp32), for an exact reference sum."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.total = None

    def _apply(self, p, u, state):
        self.total = u.double() if self.total is None else self.total + u.double()
        super()._apply(p, u, state)


def _train(p0: torch.Tensor, grads, make, steps: int):
    p = torch.nn.Parameter(p0.clone())
    optimizer = make([p])
    for step in range(steps):
        p.grad = grads(step)
        optimizer.step()
    return p.detach(), optimizer


def _ulp(x: torch.Tensor) -> torch.Tensor:
    """bf16 ulp of each value of x (float64)."""
    b = x.bfloat16()
    return (torch.nextafter(b, torch.full_like(b, float("inf"))).double() - b.double()).abs()


N, STEPS = 1 << 12, 400


@pytest.fixture(scope="module")
def tiny_updates():
    """bf16 weights in [1, 2), AdamW with lr 1e-3 (each update below the half-ulp, at least 2^-9, of every
    weight on the way), default betas, a gradient of fixed sign per element; wd 0, so u does not depend on p
    and every optimizer below applies the same updates."""
    generator = torch.Generator().manual_seed(3)
    p0 = (1 + torch.rand(N, generator=generator)).bfloat16()
    sign = torch.where(torch.rand(N, generator=generator) < 0.5, -1.0, 1.0)
    scale = torch.rand(N, generator=generator) + 0.5

    def grads(step):
        return (sign * scale * (1 + 0.1 * torch.sin(torch.tensor(step * 0.1)))).bfloat16()

    runs = {}
    for update in ("nearest", "kahan", "stochastic"):
        p, optimizer = _train(p0, grads, lambda params, update=update: Recording(params, lr=1e-3, weight_decay=0.0, update=update, seed=9), STEPS)
        runs[update] = (p, optimizer.total)
    plain, _ = _train(p0, grads, lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0), STEPS)
    exact = p0.double() + runs["kahan"][1]
    assert torch.equal(runs["kahan"][1], runs["stochastic"][1])  # the same updates, whatever the rounding
    return p0, plain, runs, exact


def test_plain_bf16_adamw_loses_updates_below_half_an_ulp(tiny_updates):
    p0, plain, runs, exact = tiny_updates
    assert float((exact - p0.double()).abs().min()) > 0.3  # the updates add up to a move of many ulps...
    assert torch.equal(plain, p0)  # ...of which round-to-nearest keeps nothing
    assert torch.equal(runs["nearest"][0], p0)


def test_kahan_keeps_them_within_an_ulp_of_the_exact_sum(tiny_updates):
    _, _, runs, exact = tiny_updates
    error = (runs["kahan"][0].double() - exact).abs() / _ulp(exact)
    assert float(error.max()) <= 1.0


def test_stochastic_rounding_keeps_them_unbiased(tiny_updates):
    """Each element's error is a sum of STEPS independent zero-mean roundings, each with variance at most
    ulp^2 / 4: their mean over N elements (in ulps) lies within 5 standard errors of 0, below an ulp."""
    _, _, runs, exact = tiny_updates
    error = (runs["stochastic"][0].double() - exact) / _ulp(exact)
    bound = 5 * (STEPS / 4 / N) ** 0.5
    assert bound < 1 and abs(float(error.mean())) <= bound
    assert float(error.abs().max()) <= 6 * (STEPS / 4) ** 0.5


def test_the_rest_of_the_step_is_torch_adamw_bit_for_bit():
    """update=nearest against torch.optim.AdamW on the same bf16 parameters and gradients, default betas."""
    generator = torch.Generator().manual_seed(1)
    p0 = torch.randn(3000, generator=generator).bfloat16()
    grads = [torch.randn(3000, generator=generator).bfloat16() * 10 ** float(torch.randint(-3, 2, (), generator=generator)) for _ in range(50)]
    ours, _ = _train(p0, grads.__getitem__, lambda params: BF16AdamW(params, lr=3e-3, weight_decay=0.0, update="nearest"), 50)
    torchs, _ = _train(p0, grads.__getitem__, lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0), 50)
    assert torch.equal(ours, torchs)


def test_weight_decay_is_part_of_the_compensated_update():
    """lr * weight_decay * p below half an ulp every step: plain AdamW never decays, Kahan does, as fp32 would."""
    p0 = torch.full((256,), 1.5).bfloat16()
    zero = lambda step: torch.zeros(256, dtype=torch.bfloat16)  # noqa: E731
    plain, _ = _train(p0, zero, lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-1), 2000)
    kahan, _ = _train(p0, zero, lambda params: BF16AdamW(params, lr=1e-3, weight_decay=1e-1, update="kahan"), 2000)
    fp32, _ = _train(p0.float(), lambda step: torch.zeros(256), lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-1), 2000)
    assert torch.equal(plain, p0)
    assert float(((kahan.double() - fp32.double()).abs() / _ulp(fp32.double())).max()) <= 1.0 and float(fp32[0]) < 1.3


def test_the_state_holds_the_compensation_and_the_generator():
    p = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))
    p.grad = torch.ones(8, dtype=torch.bfloat16)
    kahan = BF16AdamW([p], lr=1e-4, update="kahan")
    kahan.step()
    compensation = kahan.state_dict()["state"][0]["kahan_compensation"]
    assert compensation.dtype == torch.bfloat16 and bool((compensation != 0).all())  # what the rounding dropped
    sr = BF16AdamW([p], update="stochastic", seed=4)
    random_bits((5,), sr.generator)
    saved = sr.state_dict()
    again = BF16AdamW([p], update="stochastic", seed=0)
    again.load_state_dict(saved)
    assert torch.equal(random_bits((100,), again.generator), random_bits((100,), sr.generator))
    with pytest.raises(ValueError, match="no rounding generator"):
        again.load_state_dict(kahan.state_dict())


@pytest.mark.parametrize(("options", "message"), [
    ({"update": "kahan", "precision": "fp32"}, "optimization=bf16_x rounds the update of bf16 weights: it needs precision=bf16-true"),
    ({"update": "kahan", "precision": "bf16-mixed"}, "not precision=bf16-mixed; add precision=bf16-true"),
    ({"update": "rounded", "precision": "bf16-true"}, "optimization.update='rounded': use kahan or stochastic"),
    ({"update": "stochastic", "precision": "bf16-true", "seed": -1}, "optimization.seed=-1 must be a non-negative integer"),
])
def test_bad_settings_name_the_key(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        BF16Update("bf16_x", **options)


def test_only_adamw_on_its_plain_path_is_replaced():
    import functools

    optimization = BF16Update("bf16_sr", "stochastic", "bf16-true", seed=3)
    factory = optimization.optimizer(functools.partial(torch.optim.AdamW, lr=1e-3, betas=[0.9, 0.99], weight_decay=0.0))
    optimizer = factory([torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16))])
    assert isinstance(optimizer, BF16AdamW) and optimizer.update == "stochastic" and optimizer.defaults["lr"] == 1e-3
    with pytest.raises(ValueError, match="optim.optimizer is SGD"):
        optimization.optimizer(functools.partial(torch.optim.SGD, lr=1e-3))
    with pytest.raises(ValueError, match="optim.optimizer.amsgrad=True"):
        optimization.optimizer(functools.partial(torch.optim.AdamW, lr=1e-3, amsgrad=True))


def test_the_configs_build_from_the_run_config():
    cfg = compose_train("optimization=bf16_sr", "precision=bf16-true", "seed.rounding=12")
    built = instantiate(cfg.optimization)
    assert (built.update, built.precision, built.seed) == ("stochastic", "bf16-true", 12)
    assert instantiate(compose_train("optimization=bf16_kahan", "precision=bf16-true").optimization).update == "kahan"


# ----------------------------------------------------------------------------- training runs

RUN = ("precision=bf16-true", "callbacks.samples=null", "callbacks.heldout=null", "snapshot.every_n_steps=1")


def _hashes(path) -> dict[int, str]:
    return {e["step"]: e["sha256"] for e in json.loads((path / "weights" / "index.json").read_text())["snapshots"]}


@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory):
    runs = {}
    for name in ("none", "bf16_kahan", "bf16_sr"):
        path = tmp_path_factory.mktemp(name) / "run"
        record = train(compose_train(*RUN, f"optimization={name}", run_dir=path))
        assert record["status"] == "finished"
        runs[name] = (path, record)
    return runs


def test_each_fix_starts_where_plain_bf16_true_does_and_then_differs(bf16_runs):
    plain = _hashes(bf16_runs["none"][0])
    for name in ("bf16_kahan", "bf16_sr"):
        path, record = bf16_runs[name]
        assert record["optimization"]["optimizer"] == "BF16AdamW" and record["precision"] == "bf16-true"
        hashes = _hashes(path)
        assert hashes[0] == plain[0] and hashes[4] != plain[4], name
        state = load_snapshot(path, 4)
        assert all(torch.equal(t, t.bfloat16().float()) for t in state.values())  # still bf16 weights


@pytest.mark.parametrize("name", ["bf16_kahan", "bf16_sr"])
def test_a_resumed_run_ends_with_the_uninterrupted_runs_bits(bf16_runs, name, tmp_path):
    train(compose_train(*RUN, f"optimization={name}", "trainer.max_steps=2", run_dir=tmp_path))
    train(compose_train(*RUN, f"optimization={name}", "trainer.max_steps=4", "resume=true", run_dir=tmp_path))
    assert _hashes(tmp_path) == _hashes(bf16_runs[name][0])


# ----------------------------------------------------------------------------- torchao, when installed


def test_torchao_rounds_by_the_same_rule_given_the_same_bits():
    """torchao rounds away from zero when its random r < the low 16 bits; numdev when bits + low >= 2^16:
    the same rule under bits = 65535 - r. Fed that, every finite value rounds to the same bf16."""
    quant_utils = pytest.importorskip("torchao.optim.quant_utils")
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(100_000, generator=generator) * torch.logspace(-40, 38, 100_000, dtype=torch.float64).float()
    torch.manual_seed(17)  # torchao draws from the global generator
    theirs = quant_utils._fp32_to_bf16_sr(x)
    r = torch.randint(0, 1 << 16, x.shape, generator=torch.Generator().manual_seed(17), dtype=torch.int32)
    ours = stochastic_round_bf16(x, 0xFFFF - r)
    assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16))


@pytest.mark.slow
def test_torchao_adamw_with_bf16_stochastic_rounding_steps_to_the_same_bits(monkeypatch):
    """torchao's _AdamW(bf16_stochastic_round=True) (torch.compile'd; its random draws kept eager's) against
    BF16AdamW(update=stochastic) on steps whose fp32 target both compute exactly (gradients +-2^k, betas 0,
    eps 0): the same bits, step after step."""
    optim = pytest.importorskip("torchao.optim")
    import torch._inductor.config as inductor

    monkeypatch.setattr(inductor, "fallback_random", True)
    generator = torch.Generator().manual_seed(8)
    p0 = [torch.randn(n, generator=generator).bfloat16() for n in (1000, 37)]
    grads = [[(torch.where(torch.rand(p.shape, generator=generator) < 0.5, -1.0, 1.0) * 2.0 ** torch.randint(-4, 4, p.shape, generator=generator))
              .bfloat16() for p in p0] for _ in range(3)]
    theirs = [torch.nn.Parameter(p.clone()) for p in p0]
    ours = [torch.nn.Parameter(p.clone()) for p in p0]
    options = {"lr": 1e-2, "betas": (0.0, 0.0), "eps": 0.0, "weight_decay": 0.0}
    their_optimizer = optim._AdamW(theirs, **options, bf16_stochastic_round=True)
    our_optimizer = BF16AdamW(ours, **options, update="stochastic", seed=23)
    monkeypatch.setattr(bf16_update, "random_bits", lambda shape, g: 0xFFFF - torch.randint(0, 1 << 16, tuple(shape), generator=g, dtype=torch.int32))
    torch.manual_seed(23)
    for step in range(3):
        for params in (theirs, ours):
            for p, g in zip(params, grads[step]):
                p.grad = g.clone()
        their_optimizer.step()
        our_optimizer.step()
        for a, b in zip(theirs, ours):
            assert torch.equal(a.detach().view(torch.int16), b.detach().view(torch.int16)), step
    assert not torch.equal(ours[0].detach(), p0[0])
