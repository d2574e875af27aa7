"""numdev.attention.OutputNoise: unbiased (z ~ N(0, 1)) and biased (s = sign(out)) per-call noise of relative
size delta, against the exact expectations; the default is the old formula bit for bit."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import compose_train
from hydra.utils import instantiate

from numdev.attention import Eager, OutputNoise

N = 2 * 2 * 64 * 16  # elements of one call below


def _call(backend, dtype=torch.float32, seed=0):
    q = torch.randn(2, 2, 64, 16, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return Eager()(q, q, q), backend(q, q, q)


def _relative(clean, noisy):
    clean, noisy = clean.double().flatten(), noisy.double().flatten()
    return (noisy - clean) / clean


@pytest.mark.parametrize("delta", [1e-3, 0.3, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("mode", ["unbiased", "biased"])
def test_the_rms_relative_deviation_is_delta_in_both_modes(mode, delta):
    clean, noisy = _call(OutputNoise(Eager(), delta=delta, seed=5, mode=mode))
    relative = _relative(clean, noisy)
    ratio = float(relative.square().mean()) / delta**2  # E[z^2] = E[s^2] = 1
    if mode == "unbiased":  # mean of n squared N(0, 1): standard deviation sqrt(2 / n)
        assert abs(ratio - 1) < 5 * math.sqrt(2 / N), ratio
    else:  # exactly delta, up to the fp32 product's one rounding
        assert abs(ratio - 1) < 4 * 2.0**-23 * (1 + delta) / delta, ratio


@pytest.mark.parametrize("delta", [0.3, 1.0, 3.0])
def test_biased_moves_every_element_up_by_delta_of_its_magnitude(delta):
    """out + delta |out|: every deviation upward (a signed bias), |deviation| = delta |out| (so the same RMS as unbiased)."""
    clean, noisy = _call(OutputNoise(Eager(), delta=delta, seed=5, mode="biased"))
    c, n = clean.double(), noisy.double()
    bound = 2.0**-23 * (1 + delta) * c.abs()  # fp32(delta |out|) and the sum: one rounding each
    assert bool(((n - c) - delta * c.abs()).abs().le(bound + 1e-30).all())
    assert bool(((n - c)[c != 0] > 0).all())  # sign-consistent: every element moves up
    assert float((n - c).mean()) == pytest.approx(delta * float(c.abs().mean()), rel=1e-6)  # mean deviation delta mean|out|
    # not a gain: positive elements grow by (1 + delta), negative ones shrink by (1 - delta)
    positive, negative = c > 0, c < 0
    assert torch.allclose(n[positive], c[positive] * (1 + delta), rtol=1e-6)
    assert torch.allclose(n[negative], c[negative] * (1 - delta), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("delta", [0.3, 1.0, 3.0])
def test_unbiased_has_no_mean_deviation(delta):
    clean, noisy = _call(OutputNoise(Eager(), delta=delta, seed=5))
    relative = _relative(clean, noisy)
    assert abs(float(relative.mean())) < 5 * delta / math.sqrt(N)  # mean of n N(0, delta^2)
    shift = (noisy.double() - clean.double()) * clean.double().sign()
    assert abs(float(shift.mean())) < 5 * delta * float(clean.double().abs().square().mean().sqrt()) / math.sqrt(N)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_default_is_the_old_formula_bit_for_bit(dtype):
    """unbiased (the default): out * (1 + delta z) formed in fp32, z from torch.Generator(seed), the stream advancing."""
    backend = OutputNoise(Eager(), delta=0.01, seed=3)
    generator = torch.Generator().manual_seed(3)
    for call in range(2):
        clean, noisy = _call(backend, dtype, seed=call)
        z = torch.randn(clean.shape, generator=generator, dtype=torch.float32)
        assert torch.equal(noisy, (clean.float() * (1.0 + 0.01 * z)).to(dtype))
    assert backend.describe()["mode"] == "unbiased"


def test_biased_draws_nothing_and_says_so():
    backend = OutputNoise(Eager(), delta=1.0, seed=3, mode="biased")
    before = backend.generator.get_state()
    _call(backend)
    assert torch.equal(backend.generator.get_state(), before)
    assert backend.describe() == {"backend": "output_noise", "delta": 1.0, "seed": 3, "mode": "biased", "inner": Eager().describe()}


@pytest.mark.parametrize(("options", "message"), [
    ({"mode": "sideways"}, "attention.mode='sideways': use unbiased"),
    ({"delta": 0}, "attention.delta=0 must be a number in (0, 10]"),
    ({"delta": 11}, "attention.delta=11 must be a number in (0, 10]"),
    ({"delta": -0.1}, "attention.delta=-0.1 must be a number in (0, 10]"),
])
def test_bad_settings_name_the_key(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        OutputNoise(Eager(), **options)


def test_the_config_has_the_mode_and_takes_it_from_the_command_line():
    assert instantiate(compose_train("attention=output_noise").attention).mode == "unbiased"
    backend = instantiate(compose_train("attention=output_noise", "attention.mode=biased", "attention.delta=3").attention)
    assert (backend.mode, backend.delta) == ("biased", 3.0)
