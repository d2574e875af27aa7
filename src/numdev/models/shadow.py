"""Shadow attention: in every attention call, also compute a second backend on the same q, k, v.

The paper's "compute both in every call": the model trains with its own backend, and a shadow
backend (e.g. Baseline beside Flash) is evaluated on exactly the inputs the real call saw. The
shadow never enters the training graph, so the trajectory is bit-for-bit the one without it.

Forward: max and mean |out_primary - out_shadow| per call, and the signed side: the mean of
out_primary - out_shadow (`bias`: a rounding that leans one way shows here, where |.| hides it) and
its RMS relative to the shadow's (`rel_rms` = rms(out_primary - out_shadow) / rms(out_shadow): the
per-call relative deviation, in the units of numdev.attention.OutputNoise's delta). Both from
float64 sums, with the RMS parts and the element count kept beside them (`diff_rms`, `shadow_rms`,
`count`) so that calls and layers pool exactly (`pooled`).

Backward: hooks capture the upstream gradient dO that reached the primary call's output and the
gradients dQ, dK, dV it produced; `backward_deviation` then runs the shadow backend's own
backward on the same q, k, v and dO and compares. (dQ is the gradient of q alone because q, k, v
feed nothing but the attention call.) The same statistics as the forward's, for each gradient.

Statistics stay on the device as tensors until `collect()`, one host sync per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from numdev.models.attention import AttentionCall

QUANTITIES = ("out", "dq", "dk", "dv")


@dataclass
class _Call:
    layer: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: bool
    grads: dict = field(default_factory=dict)  # "out" (the upstream dO), "dq", "dk", "dv" of the primary


class AttentionShadow:
    """Attach to a model; while `recording`, every Attention call is shadowed by `backend`."""

    def __init__(self, backend, backward: bool = True):
        if backend is None or not callable(backend):
            raise ValueError("a shadow needs an attention backend from numdev.attention")
        self.backend, self.backward = backend, backward
        self.recording = False
        self.calls: list[_Call] = []
        self.stats: list[tuple[str, str, int, torch.Tensor]] = []  # layer, quantity, elements, the statistics (one tensor)
        self.modules: list[AttentionCall] = []

    def attach(self, model: nn.Module) -> AttentionShadow:
        self.modules = [m for m in model.modules() if isinstance(m, AttentionCall)]
        if not self.modules:
            raise ValueError("the model has no numdev Attention module to shadow")
        for module in self.modules:
            if module.probe is not None:
                raise ValueError(f"{module.layer_name}: already has an attention probe")
            module.probe = self
        return self

    def detach(self) -> None:
        for module in self.modules:
            module.probe = None
        self.modules = []

    def __call__(self, module: AttentionCall, q, k, v, out) -> None:
        if not self.recording:
            return
        inputs = (q.detach(), k.detach(), v.detach())
        with torch.no_grad():
            shadow = self.backend(*inputs, causal=module.causal)
        self._add(module.layer_name, "out", out.detach(), shadow)
        if self.backward and out.requires_grad:
            call = _Call(module.layer_name, *inputs, module.causal)
            out.register_hook(_keep(call.grads, "out"))
            for name, tensor in zip(("dq", "dk", "dv"), (q, k, v)):  # the graph's own q, k, v
                if tensor.requires_grad:
                    tensor.register_hook(_keep(call.grads, name))
            self.calls.append(call)

    def backward_deviation(self) -> None:
        """After loss.backward(): the shadow's gradients on the recorded calls, compared with the primary's."""
        calls, self.calls = self.calls, []
        for call in calls:
            if "out" not in call.grads:
                continue  # this call did not reach the loss
            q, k, v = (t.clone().requires_grad_(True) for t in (call.q, call.k, call.v))
            with torch.enable_grad():
                out = self.backend(q, k, v, causal=call.causal)
                shadow = torch.autograd.grad(out, (q, k, v), call.grads["out"], allow_unused=True)
            for name, grad in zip(("dq", "dk", "dv"), shadow):
                if name in call.grads and grad is not None:
                    self._add(call.layer, name, call.grads[name], grad)

    def _add(self, layer: str, quantity: str, primary: torch.Tensor, shadow: torch.Tensor) -> None:
        diff = (primary.float() - shadow.float()).abs()
        signed = primary.double() - shadow.double()  # exact: both hold fp32 (or narrower) values
        self.stats.append((layer, quantity, signed.numel(), torch.stack([
            diff.max().double(), diff.mean().double(), primary.float().abs().max().double(),
            signed.mean(), signed.square().mean().sqrt(), shadow.double().square().mean().sqrt(),
        ])))

    def collect(self) -> list[dict]:
        """The recorded statistics as floats (one host sync), and a fresh start."""
        stats, self.stats = self.stats, []
        self.calls = []
        if not stats:
            return []
        values = torch.stack([s[3] for s in stats]).cpu().tolist()
        rows = []
        for (layer, quantity, count, _), v in zip(stats, values):
            row = {"layer": layer, "quantity": quantity, **dict(zip(("max_abs", "mean_abs", "ref_max_abs", "bias", "diff_rms", "shadow_rms"), v))}
            rows.append({**row, "rel_rms": relative_rms(row["diff_rms"], row["shadow_rms"]), "count": count})
        return rows


def relative_rms(diff_rms: float, shadow_rms: float) -> float:
    """rms(primary - shadow) / rms(shadow); 0 when the two agree (both zero included), inf when only the shadow is zero."""
    if diff_rms == 0:
        return 0.0
    return diff_rms / shadow_rms if shadow_rms > 0 else math.inf


def pooled(rows: list[dict]) -> dict:
    """bias and rel_rms of several calls' rows taken as one tensor (every element weighs the same):
    the `shadow/all/...` values, from the rows' `count`, `bias`, `diff_rms` and `shadow_rms`."""
    count = sum(r["count"] for r in rows)
    diff_sq = sum(r["count"] * r["diff_rms"] ** 2 for r in rows) / count
    shadow_sq = sum(r["count"] * r["shadow_rms"] ** 2 for r in rows) / count
    return {"bias": sum(r["count"] * r["bias"] for r in rows) / count,
            "rel_rms": relative_rms(math.sqrt(diff_sq), math.sqrt(shadow_sq))}


def _keep(store: dict, key: str):
    def hook(grad: torch.Tensor) -> None:
        store[key] = grad.detach()

    return hook
