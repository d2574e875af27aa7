"""init_perturbation with a step: the weights are perturbed at the start of training step t (after step
t - 1's update), by the rule used at initialisation; the run is its unperturbed twin before that, and
resuming from either side of t perturbs exactly once."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import compose_train

from numdev.models.perturb import Perturbation, parse_perturbation, perturb_relative
from numdev.train.module import DiffusionModule
from numdev.train.run import build_model, train
from numdev.weights.store import load_snapshot

STEPS = ("trainer.max_steps=5", "snapshot.every_n_steps=1", "callbacks.checkpoint.every_n_steps=2", "callbacks.samples=null",
         "callbacks.heldout=null")
RELATIVE = "+init_perturbation={kind:relative,eps:1e-4,step:%d}"


def _run(path, *overrides) -> dict[int, str]:
    record = train(compose_train(*STEPS, *overrides, run_dir=path))
    assert record["status"] == "finished"
    return _hashes(path)


def _hashes(path) -> dict[int, str]:
    return {e["step"]: e["sha256"] for e in json.loads((path / "weights" / "index.json").read_text())["snapshots"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Uninterrupted runs by their perturbation override (None: unperturbed), each trained once: (dir, hashes)."""
    made = {}

    def run(override: str | None):
        if override not in made:
            path = tmp_path_factory.mktemp("run") / "run"
            made[override] = (path, _run(path, *([override] if override else [])))
        return made[override]

    return run


@pytest.fixture
def plain(runs):
    return runs(None)


@pytest.fixture
def at_step_3(runs):
    return runs(RELATIVE % 3)


def test_the_run_is_its_unperturbed_twin_up_to_step_t_minus_1_and_differs_from_t_on(plain, at_step_3):
    (_, before), (_, after) = plain, at_step_3
    assert [before[s] == after[s] for s in range(6)] == [True, True, True, False, False, False]


def test_the_perturbation_at_step_t_is_the_initialisation_rule_of_relative_size_eps(plain, at_step_3):
    """Snapshot 3 of the perturbed run is the twin's snapshot 3 times fp32(1 + eps z), z drawn from
    torch.Generator(seed.perturbation) over the parameters in order: bit for bit, and ||dW|| / ||W|| = eps."""
    cfg = compose_train(*STEPS)
    from hydra.utils import instantiate

    model = build_model(cfg, instantiate(cfg.attention))
    twin, perturbed = load_snapshot(plain[0], 3), load_snapshot(at_step_3[0], 3)
    generator = torch.Generator().manual_seed(cfg.seed.perturbation)
    w, dw = [], []
    for name, parameter in model.named_parameters():
        z = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
        assert torch.equal(perturbed[name], twin[name] * (1.0 + 1e-4 * z)), name
        w.append(twin[name].double().flatten())
        dw.append((perturbed[name].double() - twin[name].double()).flatten())
    size = float(torch.cat(dw).norm() / torch.cat(w).norm())
    assert size == pytest.approx(1e-4, rel=0.01)  # ~2 M weights: the z^2 average is 1 within ~0.1%


def test_a_ulp_at_step_t_moves_every_weight_one_ulp_away_from_zero(plain, tmp_path):
    hashes = _run(tmp_path, "+init_perturbation={kind:ulp,step:2}")
    assert [plain[1][s] == hashes[s] for s in range(6)] == [True, True, False, False, False, False]
    twin, perturbed = load_snapshot(plain[0], 2), load_snapshot(tmp_path, 2)
    for name, w in twin.items():
        assert torch.equal(perturbed[name], torch.nextafter(w, torch.where(w < 0, -torch.inf, torch.inf))), name


def test_step_0_is_the_perturbation_at_initialisation_bit_for_bit(runs):
    assert runs(RELATIVE % 0)[1] == runs("+init_perturbation={kind:relative,eps:1e-4}")[1]


def test_the_relative_rule_is_the_old_formula_bit_for_bit_on_fp32_weights():
    model, frozen = torch.nn.Linear(50, 40), torch.nn.Linear(50, 40)
    frozen.load_state_dict(model.state_dict())
    perturb_relative(model, 1e-4, 7)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in frozen.parameters():  # the rule before steps existed
            parameter.mul_((1.0 + 1e-4 * torch.randn(parameter.shape, generator=generator, dtype=torch.float32)).to(parameter.dtype))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), frozen.parameters()))


def test_on_bf16_weights_the_product_is_rounded_once():
    model = torch.nn.Linear(50, 40).to(torch.bfloat16)
    before = [p.detach().clone() for p in model.parameters()]
    perturb_relative(model, 1e-2, 7)
    generator = torch.Generator().manual_seed(7)
    for w, p in zip(before, model.parameters()):
        z = torch.randn(w.shape, generator=generator, dtype=torch.float32)
        assert torch.equal(p, (w.float() * (1.0 + 1e-2 * z)).bfloat16())


@pytest.mark.parametrize(("step", "side"), [(1, "after"), (2, "at"), (3, "before")])
def test_resume_from_a_checkpoint_perturbs_exactly_once(step, side, runs, tmp_path, monkeypatch):
    """Checkpoints every 2 steps, a crash in step 3: the run resumes from step 2's checkpoint, which is
    after, at (written after the perturbation) or before the perturbation's step; either way it ends
    with the uninterrupted run's snapshots."""
    uninterrupted = runs(RELATIVE % step)[1]
    original = DiffusionModule.training_step

    def crashing(self, batch, batch_idx):
        if self.trainer.global_step == 3:
            raise RuntimeError("simulated crash")
        return original(self, batch, batch_idx)

    monkeypatch.setattr(DiffusionModule, "training_step", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(compose_train(*STEPS, RELATIVE % step, run_dir=tmp_path / "crashed"))
    monkeypatch.setattr(DiffusionModule, "training_step", original)
    record = train(compose_train(*STEPS, RELATIVE % step, "resume=true", run_dir=tmp_path / "crashed"))
    assert record["resumes"][0]["from_step"] == 2
    assert _hashes(tmp_path / "crashed") == uninterrupted


@pytest.mark.parametrize(("spec", "message"), [
    ({"kind": "relative", "eps": 1e-4, "step": -1}, "init_perturbation.step=-1 must be a non-negative integer"),
    ({"kind": "relative", "eps": 1e-4, "step": 1.5}, "init_perturbation.step=1.5 must be a non-negative integer"),
    ({"kind": "ulp", "eps": 1e-4}, "init_perturbation.eps=0.0001: a ulp perturbation has no size"),
    ({"kind": "relative", "eps": 1e-4, "when": 3}, "init_perturbation.when: not a setting"),
    ("relative", "init_perturbation='relative': use null, ulp or"),
])
def test_bad_specs_name_the_key(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_perturbation(spec)


def test_a_spec_reads_as_kind_size_and_step():
    assert parse_perturbation({"kind": "relative", "eps": 1e-4, "step": 100}) == Perturbation("relative", 1e-4, 100)
    assert parse_perturbation("ulp") == Perturbation("ulp", None, 0) == parse_perturbation({"kind": "ulp", "step": 0})
    assert parse_perturbation(None) is None
