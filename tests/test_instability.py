"""InstabilityMonitor: loss spikes and NaN/Inf in loss, gradients and attention outputs, per policy."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import compose_train, snapshot_hashes
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from numdev.models.attention import Attention
from numdev.runs.layout import RunDir
from numdev.train.callbacks.instability import LossSpikeDetector, _nonfinite, _norms_finite
from numdev.train.checkpoint_io import load_checkpoint
from numdev.train.module import DiffusionModule
from numdev.train.run import train
from numdev.weights.store import list_snapshots, load_snapshot

LAYER = "blocks.0.cross_attn"


def _events(run_dir) -> list[dict]:
    return json.loads((run_dir / "instability.json").read_text())["events"]



def test_spike_detector_on_a_synthetic_loss_sequence():
    detector = LossSpikeDetector(factor=3.0, beta=0.9, warmup=5)
    losses = [1.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 5.0, 1.0, 1.0, 2.5, 1.0]
    spikes = {i: m for i, loss in enumerate(losses) if (m := detector.observe(loss)) is not None}
    # Reference: the bias-corrected EMA of the losses before each one.
    ema, expected = 0.0, {}
    for i, loss in enumerate(losses):
        average = ema / (1 - 0.9**i) if i else None
        if i >= 5 and loss > 3.0 * average:
            expected[i] = loss / average
        ema = 0.9 * ema + 0.1 * loss
    # 9 at index 1 falls in the warmup; 5 is a spike; 2.5 is below 3x the average.
    assert list(spikes) == list(expected) == [10]
    assert spikes[10] == pytest.approx(expected[10]) and 2.0 < spikes[10] < 5.0
    steady = LossSpikeDetector(factor=3.0, beta=0.9, warmup=5)
    magnitudes = [steady.observe(loss) for loss in [1.0] * 20 + [10.0] + [1.0] * 5]
    assert magnitudes[20] == pytest.approx(10.0) and all(m is None for i, m in enumerate(magnitudes) if i != 20)


@pytest.mark.parametrize("bad", [{"factor": 1.0}, {"beta": 1.0}, {"warmup": -1}])
def test_detector_settings_are_checked(bad):
    with pytest.raises(ValueError, match="callbacks.instability"):
        LossSpikeDetector(**bad)


def _inject(monkeypatch, step: int, layer: str = LAYER, loss_factor: float | None = None):
    """NaN out `layer`'s output (or multiply the loss by loss_factor) in the training step at global step `step`."""
    state = {"step": -1}
    training_step, forward = DiffusionModule.training_step, Attention.forward

    def patched_step(self, batch, batch_idx):
        state["step"] = self.trainer.global_step
        loss = training_step(self, batch, batch_idx)
        return loss * loss_factor if loss_factor is not None and state["step"] == step else loss

    def patched_forward(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if loss_factor is None and self.layer_name == layer and self.training and state["step"] == step:
            out = out * float("nan")
        return out

    monkeypatch.setattr(DiffusionModule, "training_step", patched_step)
    monkeypatch.setattr(Attention, "forward", patched_forward)


@pytest.mark.parametrize("policy", ["record", "skip", "stop", "fail"])
def test_a_nan_in_one_attention_layer_is_named_and_handled_by_the_policy(policy, tmp_path, monkeypatch):
    _inject(monkeypatch, step=2)
    run = train(compose_train(f"callbacks.instability.policy={policy}", "snapshot.every_n_steps=1", run_dir=tmp_path))
    events = [e for e in _events(tmp_path) if e["step"] == 2]
    kinds = {e["kind"]: e for e in events}
    assert set(kinds) == {"nonfinite_attention", "nonfinite_loss", "nonfinite_gradient"}, events
    assert kinds["nonfinite_attention"]["first_layer"] == LAYER  # the later layers follow it
    assert kinds["nonfinite_gradient"]["count"] > 0
    steps = sorted({e["step"] for e in _events(tmp_path)})
    assert steps == ([2, 3] if policy == "record" else [2])  # nothing before; with record the NaN weights stay
    before, after = load_snapshot(tmp_path, 2), load_snapshot(tmp_path, 3)
    if policy == "record":
        assert run["status"] == "finished" and run["final_step"] == 4
        assert {e["action"] for e in events} == {"recorded"}
        assert not all(torch.isfinite(t).all() for t in after.values())  # the NaN update went in
    else:
        assert all(torch.equal(before[k], after[k]) for k in before)  # the update was not applied
        assert {e["action"] for e in events} == {{"skip": "skipped", "stop": "stopped", "fail": "failed"}[policy]}
    if policy == "skip":
        assert run["status"] == "finished" and run["final_step"] == 4
        final = load_snapshot(tmp_path, 4)
        assert all(torch.isfinite(t).all() for t in final.values())
        assert any(not torch.equal(final[k], after[k]) for k in final)  # training went on
        state = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["optimizer_states"][0]["state"]
        assert all(torch.isfinite(v).all() for s in state.values() for v in s.values())  # AdamW not polluted
    if policy in ("stop", "fail"):
        status = {"stop": "stopped", "fail": "failed"}[policy]
        assert run["status"] == status and run["final_step"] == 3 and list_snapshots(tmp_path)[-1] == 3
        assert f"nonfinite_attention at step 2 in {LAYER}" in run["stop_reason"]
        assert json.loads((tmp_path / "run.json").read_text())["status"] == status
    if policy == "fail":  # the first non-finite tensor and its step, for the console line
        assert run["error"].startswith(f"nonfinite_attention at step 2 in {LAYER} (callbacks.instability.policy=fail)")


def test_a_norm_that_overflows_is_a_perhaps_that_the_elements_settle():
    huge = torch.full((1000,), 1e20)  # every element finite; its L2 norm is not (the squares overflow float32)
    assert not bool(_norms_finite([huge, torch.ones(3)])) and _nonfinite([("huge", huge), ("one", torch.ones(3))]) == []
    assert bool(_norms_finite([torch.ones(3), torch.ones(2, dtype=torch.bfloat16)]))
    for bad in (float("nan"), float("inf"), -float("inf")):
        tensors = [("a", torch.ones(4)), ("b", torch.tensor([1.0, bad])), ("c", torch.tensor([bad, 2.0]))]
        assert not bool(_norms_finite([t for _, t in tensors])) and _nonfinite(tensors) == ["b", "c"]


def test_huge_finite_gradients_do_not_stop_a_run_as_nonfinite(tmp_path, monkeypatch):
    """A loss times 1e30 at step 2: every gradient finite, their L2 norms not. The monitor once stopped such a run
    (policy stop) for a "nonfinite_gradient" in no parameter."""
    _inject(monkeypatch, step=2, loss_factor=1e30)
    run = train(compose_train("callbacks.instability.policy=stop", "snapshot.every_n_steps=10", run_dir=tmp_path))
    assert run["status"] == "finished" and run["final_step"] == 4, run.get("stop_reason")
    assert [e for e in _events(tmp_path) if e["kind"].startswith("nonfinite")] == []


def test_a_loss_spike_is_logged_to_json_and_tensorboard(tmp_path, monkeypatch):
    _inject(monkeypatch, step=5, loss_factor=50.0)
    overrides = ["trainer.max_steps=6", "callbacks.instability.warmup_steps=3", "snapshot.every_n_steps=10"]
    run = train(compose_train(*overrides, run_dir=tmp_path))
    assert run["status"] == "finished"
    (spike,) = _events(tmp_path)
    assert spike["kind"] == "loss_spike" and spike["step"] == 5 and spike["action"] == "recorded"
    assert spike["magnitude"] > 10 and spike["loss"] == pytest.approx(spike["magnitude"] * spike["average"])
    events = EventAccumulator(str(RunDir(tmp_path).events()))
    events.Reload()
    (scalar,) = events.Scalars("instability/loss_spike")
    assert scalar.step == 5 and scalar.value == pytest.approx(spike["magnitude"])


def test_the_monitor_leaves_the_trajectory_of_normal_runs_alone(tmp_path):
    train(compose_train(run_dir=tmp_path / "on"))
    train(compose_train("~callbacks.instability", run_dir=tmp_path / "off"))
    assert snapshot_hashes(tmp_path / "on") == snapshot_hashes(tmp_path / "off")
    assert _events(tmp_path / "on") == [] and not (tmp_path / "off" / "instability.json").exists()
