"""Training instability: loss spikes, and NaN/Inf in losses, gradients and attention outputs.

`InstabilityMonitor` is a Lightning callback. Per optimizer step it looks at

- the loss: a spike is a loss above `spike_factor` x its running average (an exponential moving
  average with `ema_beta`, bias-corrected, over the finite losses so far), after `warmup_steps`
  finite losses; a non-finite loss is a `nonfinite_loss` event;
- the gradients (after fp16 unscaling, before clipping): one fused norm over all of them; only
  when that is not finite are the parameters checked one by one to name them
  (`nonfinite_gradient`);
- the output of every `numdev.models.Attention` (a forward hook per layer that queues one
  flag on the device: whether the output's float32 sum is finite, which is one reduction and no
  boolean copy; `nonfinite_attention` names the layers in call order, the first being where it
  started).

All flags of a step are read back with a single host sync, in `on_before_optimizer_step`.

What happens then is config (`policy` for non-finite values, `spike_policy` for spikes):

- `fail` (the default for non-finite values): the step is skipped as below, training stops, and
  the run ends `failed` (run.json `status` and `error`, a non-zero exit, one console line naming
  the first non-finite tensor and its step). Non-finite weights left at the end of training (an
  update that made them so, e.g. lr=inf) fail the run the same way;
- `record`: log and continue (the default for spikes: it never changes a run's trajectory);
- `skip`: the step's update is not applied. All gradients are set to None before the optimizer
  step, so AdamW leaves the weights and its moments and step counts untouched (zeroing the
  gradients instead would still move the weights by the momentum and decay the moments). The
  LR schedule and the global step still advance: step numbers stay aligned with other runs;
- `stop`: the step is skipped as above and training stops (`trainer.should_stop`); run.json gets
  `"status": "stopped"` and `stop_reason`.

Under DDP the skip/stop decision is reduced over ranks (any rank -> all ranks), so the replicas
never diverge; events are recorded by global rank 0 from what it sees (gradients are all-reduced,
so gradient events are the same on every rank; loss and attention events are rank 0's).

Every event goes to TensorBoard (`instability/loss_spike` = magnitude, `instability/nonfinite` =
1) and to `<run_dir>/instability.json`, rewritten atomically:
`{"format": 1, "settings": {...}, "events": [{"step", "kind", "action", ...}, ...]}` where `step`
is the global step whose update was being computed (the weights of snapshot `step` went in).
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

from numdev.models.attention import AttentionCall, name_attention_layers
from numdev.runs.atomic import write_json
from numdev.runs.layout import RunDir
from numdev.train.trackers import log_metrics

FORMAT = 1
POLICIES = ("record", "skip", "stop", "fail")


def _policy(name: str, value) -> str:
    if value not in POLICIES:
        raise ValueError(f"{name}={value!r}: use one of {', '.join(POLICIES)}")
    return value


class LossSpikeDetector:
    """loss > factor x running average (bias-corrected EMA of the finite losses), after `warmup` losses."""

    def __init__(self, factor: float = 4.0, beta: float = 0.98, warmup: int = 50):
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
            raise ValueError(f"callbacks.instability.spike_factor={factor!r} must be a number > 1")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < 1:
            raise ValueError(f"callbacks.instability.ema_beta={beta!r} must be in [0, 1)")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"callbacks.instability.warmup_steps={warmup!r} must be a non-negative integer")
        self.factor, self.beta, self.warmup = float(factor), float(beta), warmup
        self.ema, self.count = 0.0, 0

    @property
    def average(self) -> float | None:
        return self.ema / (1 - self.beta**self.count) if self.count else None

    def observe(self, loss: float) -> float | None:
        """Feed one finite loss; returns its magnitude (loss / average) if it is a spike, else None."""
        average = self.average
        spike = None
        if self.count >= self.warmup and average is not None and average > 0 and loss > self.factor * average:
            spike = loss / average
        self.ema = self.beta * self.ema + (1 - self.beta) * loss
        self.count += 1
        return spike

    def state_dict(self) -> dict:
        return {"ema": self.ema, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.ema, self.count = float(state["ema"]), int(state["count"])


def _norms_finite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Whether every tensor's L2 norm is finite, as one boolean on their device (one fused torch._foreach_norm). A norm
    is NaN or inf whenever an element is, on every device (its sum propagates both), but also when finite values near
    1e19 overflow float32's squares. So False means "perhaps": the elements say (_nonfinite). A max-abs norm would
    not overflow, but a max need not propagate NaN (CUDA's fmaxf drops it)."""
    return torch.isfinite(torch.stack([n.float() for n in torch._foreach_norm(tensors)])).all()


def _nonfinite(named: list[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the tensors that hold a NaN or an inf, element by element (after _norms_finite said perhaps)."""
    return [name for name, t in named if not torch.isfinite(t).all()]


class InstabilityMonitor(pl.Callback):
    def __init__(
        self,
        run_dir: str,
        spike_factor: float = 4.0,
        ema_beta: float = 0.98,
        warmup_steps: int = 50,
        policy: str = "fail",
        spike_policy: str = "record",
        check_loss: bool = True,
        check_gradients: bool = True,
        check_attention: bool = True,
    ):
        self.run_dir = Path(run_dir)
        self.detector = LossSpikeDetector(spike_factor, ema_beta, warmup_steps)
        self.policy = _policy("callbacks.instability.policy", policy)
        self.spike_policy = _policy("callbacks.instability.spike_policy", spike_policy)
        self.check_loss, self.check_gradients, self.check_attention = check_loss, check_gradients, check_attention
        self.events: list[dict] = []
        self.stop_reason: str | None = None
        self.failure: str | None = None  # set when a `fail` policy ended the run: the console line
        self._losses: list[torch.Tensor] = []
        self._attention: list[tuple[str, torch.Tensor]] = []
        self._handles: list = []

    # -- setup -------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if not self.check_attention or self._handles:
            return
        model = getattr(pl_module, "model", pl_module)
        layers = [m for m in model.modules() if isinstance(m, AttentionCall)]
        if any(not m.layer_name for m in layers):
            name_attention_layers(model)
        self._handles = [m.register_forward_hook(self._attention_hook) for m in layers]

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _attention_hook(self, module, inputs, output) -> None:
        if module.training and torch.is_grad_enabled():  # training forward passes only, not sampling
            # One reduction, no boolean copy: a sum is NaN/Inf exactly when an element is (or when
            # it overflows float32, i.e. values near 1e38: an instability too).
            total = output.detach().sum(dtype=torch.float64 if output.dtype == torch.float64 else torch.float32)
            self._attention.append((module.layer_name, torch.isfinite(total)))

    def on_train_start(self, trainer, pl_module) -> None:
        run = RunDir(self.run_dir)
        if trainer.global_step > 0 and run.instability.is_file():  # resumed: keep the events before the checkpoint
            previous = run.read_instability()["events"]  # one-line error naming file and field
            self.events = [e for e in previous if e["step"] < trainer.global_step]
        if trainer.is_global_zero:
            self._write()

    # -- per step ----------------------------------------------------------------------------
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self._losses:  # a new optimizer step (several batches under gradient accumulation)
            self._attention.clear()

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        self._losses.append(loss.detach().float().reshape(()))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        step = trainer.global_step
        losses, attention = self._losses, self._attention
        self._losses, self._attention = [], []
        params = [(n, p) for n, p in getattr(pl_module, "model", pl_module).named_parameters() if p.grad is not None]
        flags = []  # float32 flags and values on the training device, read back together
        if losses:
            flags.append(torch.stack(losses).mean().reshape(1))
        grads_bad_at = None
        if self.check_gradients and params:
            grads_bad_at = len(flags)
            flags.append((~_norms_finite([p.grad.detach() for _, p in params])).float().reshape(1))
        attn_at = len(flags)
        if self.check_attention and attention:
            flags.append((~torch.stack([ok for _, ok in attention])).float())
        device = flags[0].device if flags else None
        values = torch.cat([f.to(device) for f in flags]).tolist() if flags else []  # the one host sync of the step

        events = []  # in causal order: attention output, loss, gradients
        if self.check_attention and attention:
            layers = [name for (name, _), bad in zip(attention, values[attn_at:]) if bad]
            if layers:
                events.append({"step": step, "kind": "nonfinite_attention", "first_layer": layers[0], "layers": layers})
        if losses:
            loss = values[0]
            if not math.isfinite(loss):
                if self.check_loss:
                    events.append({"step": step, "kind": "nonfinite_loss", "value": str(loss)})
            else:
                average = self.detector.average
                magnitude = self.detector.observe(loss)
                if magnitude is not None:
                    events.append({
                        "step": step, "kind": "loss_spike", "loss": loss,
                        "average": average, "magnitude": magnitude, "factor": self.detector.factor,
                    })
        bad = _nonfinite([(n, p.grad) for n, p in params]) if grads_bad_at is not None and values[grads_bad_at] else []
        if bad:  # an overflowing norm of finite gradients is none (it once stopped a run for a gradient in no parameter)
            event = {"step": step, "kind": "nonfinite_gradient", "parameters": bad[:20], "count": len(bad)}
            scaler = getattr(trainer.precision_plugin, "scaler", None)
            if scaler is not None and scaler.is_enabled():
                event["handled_by"] = "grad_scaler"  # fp16 overflow: the scaler skips the step itself
            events.append(event)
        self._act(trainer, pl_module, step, events)

    def _act(self, trainer, pl_module, step: int, events: list[dict]) -> None:
        def wants(policy_name: str) -> bool:
            for e in events:
                policy = self.spike_policy if e["kind"] == "loss_spike" else self.policy
                if policy == policy_name and "handled_by" not in e:
                    return True
            return False

        fail = wants("fail")
        skip, stop = wants("skip") or wants("stop") or fail, wants("stop") or fail
        if trainer.world_size > 1 and (self.policy != "record" or self.spike_policy != "record"):
            skip = trainer.strategy.reduce_boolean_decision(skip, all=False)
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
            fail = trainer.strategy.reduce_boolean_decision(fail, all=False)
        if skip:
            for p in pl_module.parameters():
                p.grad = None  # AdamW skips parameters without gradients: weights and moments untouched
        for e in events:
            e["action"] = "failed" if fail else "stopped" if stop else "skipped" if skip else "recorded"
        if stop:
            first = events[0] if events else {"kind": "instability on another rank", "step": step}
            where = first.get("first_layer") or ", ".join(first.get("parameters", [])[:3])
            self.stop_reason = (
                f"{first['kind']} at step {step}{' in ' + where if where else ''} "
                f"(callbacks.instability.policy={self.policy}); the update of that step was not applied"
            )
            trainer.should_stop = True
            if fail:
                self.failure = self.stop_reason
            else:
                rank_zero_warn(f"numdev-train: stopping: {self.stop_reason}")
        if events:
            self.events.extend(events)
            if trainer.is_global_zero:
                self._log(trainer, events)
                self._write()

    def on_train_end(self, trainer, pl_module) -> None:
        """Weights made non-finite by the last update(s) (nothing after them was computed to see it)."""
        if self.policy == "record" or self.failure is not None:
            return
        params = list(getattr(pl_module, "model", pl_module).named_parameters())
        if not params:
            return
        if bool(_norms_finite([p.detach() for _, p in params])):  # one host sync
            return
        bad = _nonfinite([(name, p.detach()) for name, p in params])
        if not bad:  # finite weights whose norm overflows float32
            return
        step = trainer.global_step
        event = {"step": step, "kind": "nonfinite_weights", "parameters": bad[:20], "count": len(bad), "action": "failed"}
        self.events.append(event)
        self.failure = self.stop_reason = (
            f"nonfinite_weights after step {step} in {bad[0]} ({len(bad)} of {len(params)} tensors) "
            f"(callbacks.instability.policy={self.policy})"
        )
        if trainer.is_global_zero:
            self._log(trainer, [event])
            self._write()

    def _log(self, trainer, events: list[dict]) -> None:
        for e in events:
            if e["kind"] == "loss_spike":
                log_metrics(trainer, {"instability/loss_spike": e["magnitude"]}, step=e["step"])
            else:
                log_metrics(trainer, {"instability/nonfinite": 1.0}, step=e["step"])

    def _write(self) -> None:
        settings = {
            "policy": self.policy, "spike_policy": self.spike_policy, "spike_factor": self.detector.factor,
            "ema_beta": self.detector.beta, "warmup_steps": self.detector.warmup, "check_loss": self.check_loss,
            "check_gradients": self.check_gradients, "check_attention": self.check_attention,
        }
        write_json(RunDir(self.run_dir).instability, {"format": FORMAT, "settings": settings, "events": self.events})

    # -- resume: the running average continues exactly --------------------------------------
    def results(self) -> dict:
        if not self.stop_reason:
            return {}
        return {"stop_reason": self.stop_reason, **({"error": self.failure} if self.failure else {})}

    def state_dict(self) -> dict:
        return {"detector": self.detector.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        if "detector" in state_dict:
            self.detector.load_state_dict(state_dict["detector"])
