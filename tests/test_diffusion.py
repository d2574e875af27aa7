"""Schedule, objective draws, samplers and classifier-free guidance."""

from __future__ import annotations

import pytest
import torch

from numdev.diffusion import (
    NoiseSchedule,
    Sampler,
    diffusion_loss,
    draw_noise,
    guided_epsilon,
    guided_model,
    to_epsilon,
    training_target,
)
from numdev.diffusion.parametrization import check_prediction
from numdev.models import TextFeatures


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_schedule_goes_from_signal_to_noise(kind):
    schedule = NoiseSchedule(1000, kind)
    ab = schedule.alpha_bar
    assert ab.dtype == torch.float64 and torch.all(ab[1:] < ab[:-1])
    assert ab[0] > 0.99 and ab[-1] < 0.01
    x0, noise = torch.ones(2, 1, 2, 2), torch.full((2, 1, 2, 2), 2.0)
    t = torch.tensor([0, 999])
    x_t = schedule.add_noise(x0, noise, t)
    expected = ab[t].sqrt().view(-1, 1, 1, 1) * 1 + (1 - ab[t]).sqrt().view(-1, 1, 1, 1) * 2
    torch.testing.assert_close(x_t, expected.float().expand_as(x_t))


def test_noise_draws_come_from_the_generator_only():
    schedule = NoiseSchedule(100)
    a = draw_noise((8, 3, 4, 4), schedule, 0.5, torch.Generator().manual_seed(1))
    torch.manual_seed(999)  # the global RNG does not matter
    b = draw_noise((8, 3, 4, 4), schedule, 0.5, torch.Generator().manual_seed(1))
    c = draw_noise((8, 3, 4, 4), schedule, 0.5, torch.Generator().manual_seed(2))
    assert torch.equal(a.t, b.t) and torch.equal(a.noise, b.noise) and torch.equal(a.drop_caption, b.drop_caption)
    assert not torch.equal(a.noise, c.noise)
    assert a.noise.dtype == torch.float32 and 0 <= int(a.t.min()) and int(a.t.max()) < 100


def test_loss_is_computed_in_at_least_float32():
    predicted = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert diffusion_loss(predicted, torch.zeros(2)).dtype == torch.float32
    assert diffusion_loss(predicted.double(), torch.zeros(2)).dtype == torch.float64


@pytest.mark.parametrize(("kind", "eta"), [("ddim", 0.0), ("ddim", 1.0), ("ddpm", 0.0)])
def test_samplers_recover_the_data_point_an_oracle_predicts(kind, eta):
    # With one data point x0 the exact noise predictor is (x_t - sqrt(ab) x0) / sqrt(1 - ab).
    schedule = NoiseSchedule(1000)
    x0 = torch.rand(2, 3, 4, 4) * 1.6 - 0.8

    def oracle(x, t):
        ab = schedule.alpha_bar[t].float().view(-1, 1, 1, 1)
        return (x - ab.sqrt() * x0) / (1 - ab).sqrt()

    sampler = Sampler(kind=kind, steps=20, eta=eta)
    out = sampler.sample(oracle, tuple(x0.shape), schedule, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, x0, rtol=0, atol=1e-4)


def test_sampler_timesteps_and_errors():
    schedule = NoiseSchedule(1000)
    ts = Sampler(steps=5).timesteps(schedule)
    assert ts[0] == 999 and ts[-1] == 0 and ts == sorted(ts, reverse=True) and len(ts) == 5
    assert len(Sampler(steps=5000).timesteps(schedule)) == 1000
    for kwargs, message in (({"kind": "euler"}, "unknown sampler"), ({"steps": 0}, "at least 1"), ({"eta": -1}, "eta")):
        with pytest.raises(ValueError, match=message):
            Sampler(**kwargs)
    with pytest.raises(ValueError, match="unknown noise schedule"):
        NoiseSchedule(10, "quadratic")


def test_guidance_batches_conditional_and_unconditional_halves():
    calls = []

    def model(x, t, text):
        calls.append(x.shape[0])
        return x * text.pooled.view(-1, 1, 1, 1)

    text = TextFeatures(tokens=torch.zeros(2, 3, 4), pooled=torch.tensor([3.0, 5.0]))
    null = TextFeatures(tokens=torch.zeros(2, 3, 4), pooled=torch.tensor([1.0, 1.0]))
    x, t = torch.ones(2, 1, 2, 2), torch.zeros(2, dtype=torch.long)
    out = guided_model(model, text, null, 2.0)(x, t)
    assert calls == [4]  # one batch of 2B
    expected = guided_epsilon(x * torch.tensor([3.0, 5.0]).view(-1, 1, 1, 1), x, 2.0)  # uncond + 2 (cond - uncond)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(expected[:, 0, 0, 0], torch.tensor([5.0, 9.0]))
    assert torch.equal(guided_model(model, text, null, 1.0)(x, t), model(x, t, text))


@pytest.mark.parametrize("prediction", ["epsilon", "v"])
def test_an_exact_prediction_gives_back_the_noise(prediction):
    schedule = NoiseSchedule(1000)
    x0, noise = torch.rand(3, 3, 4, 4) * 2 - 1, torch.randn(3, 3, 4, 4)
    t = torch.tensor([0, 500, 999])
    x_t = schedule.add_noise(x0, noise, t)
    target = training_target(schedule, prediction, x0, noise, t)
    torch.testing.assert_close(to_epsilon(schedule, prediction, target, x_t, t), noise, rtol=1e-4, atol=1e-4)
    if prediction == "v":
        a, s = schedule.signal_noise(t, torch.float32)
        torch.testing.assert_close(target, a * noise - s * x0)
    with pytest.raises(ValueError, match="diffusion.prediction='x0'"):
        check_prediction("x0")
