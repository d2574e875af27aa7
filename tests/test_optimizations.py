"""The optimization group (conf/train/optimization/, numdev.optimizations): each applies what it says and
nothing else, the arithmetic of the low-precision linears against ml_dtypes and float64, Qiu & Yao's
tie fix in the flash emulator, the roles of experiment=optimizations, and adding one."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
import ml_dtypes
import numpy as np
import pytest
import torch
import yaml
from helpers import REPO, compose_train, flat_config

from numdev.attention import FlashEmulated, golden_attention
from numdev.attention.flash_emulated import TIE_BETA, tie_shifted_max
from numdev.numerics.stages import stage_formats
from numdev.optimizations.float8_linear import E4M3, E5M2, Float8Linear, Float8Training, route, scaled_mm, to_float8
from numdev.optimizations.mx_linear import MXLinear, MXTraining, Recipe
from numdev.train.run import train
from numdev.weights.store import load_snapshot

OPTIMIZATIONS = sorted(p.stem for p in (REPO / "conf" / "train" / "optimization").glob("*.yaml"))
SWEEP = yaml.safe_load((REPO / "conf" / "train" / "experiment" / "optimizations.yaml").read_text())["hydra"]["sweeper"]["params"]["study"].split(",")


class BatchOrder(pl.Callback):
    """The data order a run sees: every batch's captions, written at the end (the test's own record)."""

    def __init__(self, path: str):
        self.path, self.batches = path, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append(list(batch["caption"]))

    def on_train_end(self, trainer, pl_module) -> None:
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(self.batches, f)


def _run(tmp_path, name: str, *overrides: str) -> dict:
    run_dir = tmp_path / name
    cfg = compose_train(*overrides, "trainer.max_steps=2", "threads=1", "callbacks.samples=null", "callbacks.heldout=null",
                        "callbacks.checkpoint=null", "+callbacks.order._target_=test_optimizations.BatchOrder",
                        f"+callbacks.order.path={tmp_path / (name + '_order.json')}", run_dir=run_dir)
    record = train(cfg)
    assert record["status"] == "finished"
    return {"record": record, "dir": run_dir, "order": json.loads((tmp_path / (name + "_order.json")).read_text())}


def _same_start(a: dict, b: dict) -> None:
    """Bit-identical step-0 weights, the same batches in the same order."""
    first, second = load_snapshot(a["dir"], 0), load_snapshot(b["dir"], 0)
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
    assert a["order"] == b["order"] and len(a["order"]) == 2


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("baseline"), "none", "optimization=none")


@pytest.mark.parametrize("name, active", [
    ("matmul_bf16", {"float32_matmul_precision": "medium", "kernel": "real"}),
    ("fp8_linear", {"plain_linear_left": 0, "gemm": "auto", "kernel": "emulated",
                    "gemm_route": "FP32 on fp8 values times their scales (torch._scaled_mm's CPU path)"}),
    ("mxfp8_linear", {"plain_linear_left": 0, "block": 32, "kernel": "emulated"}),
    ("fused_adamw", {"fused": True}),
])
def test_each_optimization_starts_where_its_baseline_does_and_is_active(name, active, baseline, tmp_path):
    run = _run(tmp_path, name, f"optimization={name}")
    _same_start(run, baseline)
    described = run["record"]["optimization"]
    assert described["name"] == name
    for key, value in active.items():
        assert described[key] == value, key
    if "replaced" in described:
        assert described["replaced"] == sum(isinstance(m, torch.nn.Linear) for m in _model_modules(baseline))
    assert torch.get_float32_matmul_precision() == "highest"  # restored for whatever runs next in this process
    # the optimization changes the arithmetic: the weights after the first update differ from the baseline's
    assert any(not torch.equal(a, b) for a, b in zip(load_snapshot(run["dir"], 2).values(), load_snapshot(baseline["dir"], 2).values()))


def _model_modules(run):
    cfg = compose_train("trainer.max_steps=2")
    from hydra.utils import instantiate

    from numdev.train.run import build_model

    return list(build_model(cfg, instantiate(cfg.attention)).modules())


def test_the_tie_fix_is_on_in_the_run_and_its_baseline_is_the_emulator(tmp_path):
    emulator = ("attention=flash_emulated", "attention.formats.precision=bf16")
    fixed = _run(tmp_path, "fix", "optimization=flash_tie_fix", *emulator)
    plain = _run(tmp_path, "plain", "optimization=none", *emulator)
    _same_start(fixed, plain)
    assert fixed["record"]["attention"]["tie_fix"] is True and plain["record"]["attention"]["tie_fix"] is False
    assert fixed["record"]["optimization"]["tie_fix_backends"] == 1


def test_the_tie_fix_refuses_another_backend(train_config):
    from hydra.utils import instantiate

    with pytest.raises(ValueError, match="attention=flash_emulated"):
        instantiate(train_config("optimization=flash_tie_fix").optimization).attention(instantiate(train_config().attention))


@pytest.mark.slow
def test_compile_starts_where_its_baseline_does_and_compiles(baseline, tmp_path):
    run = _run(tmp_path, "compile", "optimization=compile")
    _same_start(run, baseline)
    assert set(run["record"]["optimization"]["compiled_modules"]) == {"<model>", "text"}


def test_matmul_bf16_changes_a_cpu_fp32_matmul_where_the_cpu_has_bf16():
    """On a CPU with bf16 support oneDNN computes fp32 matmuls in bf16 under "medium": larger error against fp64."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 512, generator=g, dtype=torch.float64), torch.randn(512, 512, generator=g, dtype=torch.float64)
    exact = a @ b
    errors = {}
    for precision in ("highest", "medium"):
        torch.set_float32_matmul_precision(precision)
        try:
            errors[precision] = float((a.float() @ b.float() - exact).abs().max())
        finally:
            torch.set_float32_matmul_precision("highest")
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no bf16 path: the setting leaves fp32 matmuls as they are")
    assert errors["medium"] > 2 * errors["highest"]
    # bf16 parts: the error stays far below a plain bf16 rounding of the inputs (~2^-9 relative per operand)
    assert errors["medium"] < float((a.to(torch.bfloat16).double() @ b.to(torch.bfloat16).double() - exact).abs().max())


# ----------------------------------------------------------------------------- the arithmetic


def test_float8_casts_are_ml_dtypes_casts_on_every_value():
    """Every float8 value (scaled into range) round-trips; random fp32 inputs round as ml_dtypes rounds them."""
    for dtype, reference in ((E4M3, ml_dtypes.float8_e4m3fn), (E5M2, ml_dtypes.float8_e5m2)):
        codes = np.arange(256, dtype=np.uint8).view(reference)
        values = codes.astype(np.float32)
        finite = np.isfinite(values)
        x = torch.from_numpy(values[finite])
        assert torch.equal(x.to(dtype).float(), x)
        g = torch.Generator().manual_seed(1)
        top = float(torch.finfo(dtype).max)
        y = (torch.randn(100_000, generator=g) * top / 8).clamp(-top, top)
        np.testing.assert_array_equal(y.to(dtype).float().numpy(), y.numpy().astype(reference).astype(np.float32))


def test_to_float8_scales_the_amax_to_the_format_maximum():
    x = torch.tensor([[0.5, -3.0], [1.0, 2.0]])
    q, inverse = to_float8(x, E4M3)
    assert float(q.float().abs().max()) == 448.0 and float(inverse) == pytest.approx(3.0 / 448.0)


@pytest.mark.parametrize("gemm", ["native", "fp32"])
def test_float8_linear_against_float64_of_its_quantised_operands(gemm):
    """Forward: torch._scaled_mm (native) and its CPU path in FP32 (fp32) = the float64 product of the
    dequantised e4m3 operands (exact products, fp32 sums); backward: the output gradient in e5m2,
    grad_input and grad_weight the same way."""
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64, generator=g) * 0.1)
    layer = Float8Linear.from_linear(linear, gemm)
    assert layer.weight is linear.weight and layer.bias is linear.bias
    x = torch.randn(5, 7, 64, generator=g, requires_grad=True)
    out = layer(x)
    xq, xi = to_float8(x.detach().reshape(-1, 64), E4M3)
    wq, wi = to_float8(linear.weight.detach(), E4M3)
    expected = (xq.double() * xi.double()) @ (wq.double() * wi.double()).t() + linear.bias.detach().double()
    torch.testing.assert_close(out.detach().reshape(-1, 48).double(), expected, rtol=64 * 2**-24, atol=1e-6)
    grad = torch.randn(5, 7, 48, generator=g)
    out.backward(grad)
    gq, gi = to_float8(grad.reshape(-1, 48), E5M2)
    dgrad = (gq.double() * gi.double()) @ (wq.double() * wi.double())
    wgrad = (gq.double() * gi.double()).t() @ (xq.double() * xi.double())
    torch.testing.assert_close(x.grad.reshape(-1, 64).double(), dgrad, rtol=64 * 2**-24, atol=1e-6)
    torch.testing.assert_close(linear.weight.grad.double(), wgrad, rtol=64 * 2**-24, atol=1e-5)


def test_the_fp32_route_is_torch_scaled_mm_up_to_the_fp32_summation_order():
    """Both routes of every operand pair the layer uses, on one product: relative gap within the
    gamma_K bound of two FP32 sums (K = 96), and not above it."""
    g = torch.Generator().manual_seed(1)
    for da, db in ((E4M3, E4M3), (E5M2, E4M3)):
        a, b = torch.randn(40, 96, generator=g), torch.randn(96, 24, generator=g)
        (aq, ai), (bq, bi) = to_float8(a, da), to_float8(b, db)
        native, fp32 = scaled_mm(aq, ai, bq, bi, "native"), scaled_mm(aq, ai, bq, bi, "fp32")
        exact = (aq.double() * ai.double()) @ (bq.double() * bi.double())
        bound = 2 * 96 * 2.0**-24 * ((aq.double() * ai.double()).abs() @ (bq.double() * bi.double()).abs())
        assert bool(((native.double() - fp32.double()).abs() <= 2 * bound).all()) and bool(((fp32.double() - exact).abs() <= bound).all())


def test_a_bad_fp8_gemm_setting_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"optimization.gemm='fast': use one of auto, native, fp32"):
        Float8Training(gemm="fast")
    assert route("auto", torch.device("cpu")) == "fp32" and route("auto", torch.device("meta")) == "native"


def test_an_mx_block_with_an_outlier_scales_as_the_specification_says():
    """OCP MX v1.0: scale = 2^(floor(log2 amax) - emax_elem) per 32-block; elements x / scale rounded to
    e4m3 (ml_dtypes), saturated; a small value beside an outlier loses its precision, another block does not."""
    x = torch.full((64,), 0.01)
    x[3] = 1000.0  # the outlier of block 0; block 1 is all 0.01
    q = quantize(x, "e4m3", 32, -1)
    scale0 = 2.0 ** (9 - 8)  # floor(log2 1000) = 9, emax(e4m3) = 8
    scale1 = 2.0 ** (-7 - 8)  # floor(log2 0.01) = -7
    top = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448: x / scale may reach 2^(emax+1), saturated

    def cast(values, scale):
        return np.clip(values / scale, -top, top).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale

    np.testing.assert_array_equal(q.numpy(), np.concatenate([cast(x[:32].numpy(), scale0), cast(x[32:].numpy(), scale1)]))
    assert float(q[3]) == 448.0 * scale0  # 1000 / 2 = 500 saturates to e4m3's 448
    assert float(q[0]) == 3 * 2.0**-9 * scale0  # 0.01 / 2 = 0.005: a subnormal of e4m3 (3 x 2^-9), 17% off
    assert abs(float(q[40]) - 0.01) <= 0.01 * 2**-4  # its own block keeps e4m3's 3 mantissa bits


def quantize(x, fmt, block, axis):
    return Recipe(block=block).quantize(x, fmt, axis)


def test_mx_blocks_run_along_the_axis_and_a_ragged_block_is_its_own():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 48, generator=g)
    along_rows = quantize(x, "e4m3", 32, 0)
    torch.testing.assert_close(along_rows, quantize(x.t(), "e4m3", 32, -1).t(), rtol=0, atol=0)
    tail = quantize(x[:, 32:], "e4m3", 32, -1)
    assert torch.equal(quantize(x, "e4m3", 32, -1)[:, 32:], tail)


def test_mx_linear_multiplies_the_quantised_operands():
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(64, 32)
    layer = MXLinear.from_linear(linear)
    x = torch.randn(10, 64, generator=g)
    expected = quantize(x, "e4m3", 32, -1) @ quantize(linear.weight.detach(), "e4m3", 32, -1).t() + linear.bias.detach()
    torch.testing.assert_close(layer(x).detach(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("recipe", [Recipe("e2m1", "e2m1", 16, "nvfp4"), Recipe("e4m3", "e4m3", 128, "tile"),
                                    Recipe("e4m3", "e5m2", 32, "block", "rceil")])
def test_block_scaled_linears_compute_all_three_gemms_on_their_recipe(recipe):
    """Forward q(x) q(W)ᵀ, grad_x = q(g) q(W), grad_W = q(g)ᵀ q(x) with each operand quantised by
    numdev.numerics.scaling directly (the weight in square tiles for DeepSeek-V3's recipe), against
    the layer's autograd."""
    from numdev.numerics.scaling import quantize as q

    g = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(256, 160, bias=False)
    layer = MXLinear.from_linear(linear, recipe)
    x = torch.randn(200, 256, generator=g, requires_grad=True)
    grad = torch.randn(200, 160, generator=g)
    out = layer(x)
    out.backward(grad)
    fmt, gfmt = {"e2m1": "fp4_e2m1", "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}[recipe.fmt], {"e2m1": "fp4_e2m1", "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}[recipe.grad_fmt]
    w = linear.weight.detach()
    across = recipe.block if recipe.scaling == "tile" else 1
    args = (recipe.scaling, recipe.block)
    xd = x.detach()
    assert torch.equal(out.detach(), q(xd, fmt, *args, -1, recipe.block_scale) @ q(w, fmt, *args, -1, recipe.block_scale, across).t())
    assert torch.equal(x.grad, q(grad, gfmt, *args, -1, recipe.block_scale) @ q(w, fmt, *args, 0, recipe.block_scale, across))
    assert torch.equal(linear.weight.grad, q(grad, gfmt, *args, 0, recipe.block_scale).t() @ q(xd, fmt, *args, 0, recipe.block_scale))
    relative = (out.detach() - xd @ w.t()).norm() / (xd @ w.t()).norm()
    assert relative < {"e2m1": 0.2, "e4m3": 0.06}[recipe.fmt]  # e2m1: 1 mantissa bit; e4m3: 3


def test_block_scaled_linears_refuse_settings_that_do_not_go_together():
    with pytest.raises(ValueError, match="optimization.block_scale='rceil'.*only with scaling=block"):
        MXTraining("x", scaling="nvfp4", block_scale="rceil")
    with pytest.raises(ValueError, match="optimization.scaling='mx'"):
        MXTraining("x", scaling="mx")
    with pytest.raises(ValueError, match="optimization.fmt='fp4'"):
        MXTraining("x", fmt="fp4")


# ----------------------------------------------------------------------------- Qiu & Yao's tie fix


def test_the_tie_shift_follows_the_rule():
    scores = torch.tensor([[[[1.0, 1.0, 0.2]], [[-0.5, -0.5, -2.0]], [[1.0, 0.5, 0.2]], [[0.0, 0.0, -1.0]]]])
    shifted = tie_shifted_max(scores, scores.amax(dim=-1, keepdim=True)).flatten().tolist()
    assert shifted == [TIE_BETA * 1.0, 0.0, 1.0, 0.0]  # tie m > 0: 2m; tie m < 0: 0; no tie: m; m = 0: as is


def test_the_tie_fix_leaves_the_attention_output_as_accurate_and_removes_p_equal_one():
    """Repeated keys tie the row maximum; with the fix no P equals 1 and the output is as close to FP64."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 32, 16, generator=g)
    k = torch.randn(2, 2, 8, 16, generator=g).repeat(1, 1, 4, 1)  # every key four times: every row max ties
    v = torch.randn(2, 2, 32, 16, generator=g)
    formats = stage_formats("fa2", "bf16")
    golden = golden_attention(q, k, v)
    outs = {}
    for fix in (False, True):
        emulator = FlashEmulated(formats, block_r=16, block_c=16, native=False, tie_fix=fix)
        outs[fix] = emulator(q, k, v)
        assert emulator.last_path == "eager"
    error = {fix: float((out.double() - golden).abs().max()) for fix, out in outs.items()}
    assert error[True] <= 2 * error[False] + 2**-8
    assert not torch.equal(outs[True], outs[False])


# ----------------------------------------------------------------------------- the roles, and adding one


def test_every_optimization_has_a_role_in_the_catalogue():
    """Every optimization that applies to the catalogue's precision (its reference's: fp32) is a role of it;
    one that applies to other precisions only (Optimization.precisions: bf16_kahan, bf16_sr need bf16-true)
    is not, and says so by refusing the catalogue's precision."""
    from hydra.utils import get_class

    roles = {yaml.safe_load((REPO / "conf" / "train" / "study" / f"{r}.yaml").read_text())["study"].get("baseline") for r in SWEEP}
    assert roles - {None} <= set(SWEEP)  # a baseline is a role of the sweep
    precision = compose_train("experiment=optimizations", "study=reference", "run_dir=/tmp/x", smoke=False).precision.name
    for name in OPTIMIZATIONS:
        target = yaml.safe_load((REPO / "conf" / "train" / "optimization" / f"{name}.yaml").read_text())["_target_"]
        precisions = get_class(target).precisions
        if getattr(get_class(target), "extra", None):  # needs an optional extra: its own catalogue
            other = yaml.safe_load((REPO / "conf" / "train" / "experiment" / "optimizations_torchao.yaml").read_text())
            assert f"opt_{name}" in other["hydra"]["sweeper"]["params"]["study"].split(",") and f"opt_{name}" not in SWEEP
        elif precisions is not None and precision not in precisions:
            assert f"opt_{name}" not in SWEEP, f"opt_{name} cannot run at the catalogue's precision {precision}"
        elif name != "none":
            assert f"opt_{name}" in SWEEP, f"conf/train/optimization/{name}.yaml has no role opt_{name} in experiment=optimizations"
    assert SWEEP.index("attn_flash_emulated") < SWEEP.index("opt_flash_tie_fix")


@pytest.mark.parametrize("role", [r for r in SWEEP if r.startswith(("opt_", "attn_"))])
def test_each_optimization_role_changes_only_what_it_says(role):
    def flat(name):
        return flat_config("experiment=optimizations", f"study={name}", "study.replicate=1", smoke=False)

    reference, other = flat("reference"), flat(role)
    ignored = ("study.", "sibling.", "callbacks.sibling.", "snapshot.sorted_values", "callbacks.snapshots.sorted_values")
    differ = {k for k in set(reference) | set(other) if reference.get(k) != other.get(k) and not k.startswith(ignored)}
    allowed = ("optimization.", "attention.") if "flash" in role else ("optimization.",)
    assert differ and all(k.startswith(allowed) for k in differ), differ
    for key in ("seed.init", "seed.data", "seed.noise", "precision.name", "trainer.max_steps"):
        assert other[key] == reference[key]


class HalfLearningRate:
    """A new optimization, written as a user would (the recipe in docs/optimizations.md): halve the lr."""

    kernel = "real"

    def __new__(cls, name: str):
        import functools

        from numdev.optimizations import Optimization

        class _Half(Optimization):
            def optimizer(self, factory):
                return functools.partial(factory, lr=factory.keywords["lr"] / 2)

            def describe(self, model=None, optimizer=None):
                return {**super().describe(), "lr": optimizer.defaults["lr"] if optimizer is not None else None}

        return _Half(name)


def test_adding_an_optimization_is_a_config_file_and_a_role(tmp_path, baseline):
    """The recipe: conf/train/optimization/<name>.yaml (+ a module), conf/train/study/opt_<name>.yaml; here in a search-path dir."""
    (tmp_path / "conf" / "optimization").mkdir(parents=True)
    (tmp_path / "conf" / "study").mkdir()
    (tmp_path / "conf" / "optimization" / "half_lr.yaml").write_text(
        "_target_: test_optimizations.HalfLearningRate\nname: half_lr\n")
    role = (REPO / "conf" / "train" / "study" / "opt_fused_adamw.yaml").read_text().replace("fused_adamw", "half_lr")
    (tmp_path / "conf" / "study" / "opt_half_lr.yaml").write_text(role)
    cfg = compose_train("experiment=optimizations", "study=opt_half_lr", "run_dir=/tmp/x",
                        f"hydra.searchpath=[file://{tmp_path / 'conf'}]", smoke=False)
    assert cfg.study.role == "opt_half_lr" and cfg.optimization.name == "half_lr" and cfg.study.baseline == "reference"
    run = _run(tmp_path, "half", "optimization=half_lr", f"hydra.searchpath=[file://{tmp_path / 'conf'}]")
    _same_start(run, baseline)
    assert run["record"]["optimization"]["lr"] == pytest.approx(compose_train().optim.optimizer.lr / 2)


@pytest.mark.slow
def test_the_smoke_catalogue_writes_the_table_and_the_report_shows_it(tmp_path):
    """experiment=optimizations_smoke through the real command line: every role, 3 replicates, the table."""
    from helpers import run_cli

    from numdev.report.app import build_report

    study = tmp_path / "study"
    run_cli("numdev.train.app", "experiment=optimizations_smoke", f"hydra.sweep.dir={study}", cwd=tmp_path, timeout=1800)
    summary = json.loads((study / "summary.json").read_text())
    rows = {row["role"]: row for row in summary["optimizations"]["rows"]}
    assert {f"opt_{name}" for name in OPTIMIZATIONS if name != "none"} <= set(rows)
    assert rows["opt_flash_tie_fix"]["baseline"] == "attn_flash_emulated"
    assert rows["opt_fp8_linear"]["kernel"] == rows["opt_mxfp8_linear"]["kernel"] == "emulated"  # fp8: gemm=auto on a CPU
    assert rows["flash"]["phase1"]["status"] == "measured" and rows["flash"]["phase1"]["max_abs"]["mean"] > 0
    for row in rows.values():
        assert row["step_time_ratio"]["estimate"]["n"] == 3 and row["equivalent"]["text"]
        assert row["downstream"]["heldout_loss"]["n"] == 3 and "held-out loss" in row["downstream"]["text"]
    report = build_report([], study, tmp_path / "report")
    assert "opt_fp8_linear" in Path(report).read_text()


def test_the_phase1_cell_of_a_matrix_product_row_is_one_linear_call_against_fp64():
    """fp8 operands (tensorwise e4m3) move one linear call far more than fp32 does; the rows say measured."""
    from numdev.analysis.optimizations import linear_call

    base = {"model": {"hidden": 64, "patch": 4}, "data": {"resolution": 16}}
    fp8 = linear_call({**base, "optimization": {"_target_": "numdev.optimizations.float8_linear.Float8Training", "name": "fp8_linear"}})
    none = linear_call({**base, "optimization": {"_target_": "numdev.optimizations.Optimization", "name": "none"}})
    assert fp8["status"] == none["status"] == "measured" and fp8["shape"] == [8 * 16, 64, 64]
    # e4m3 keeps 3 mantissa bits (relative step 2^-4) against fp32's 24: orders of magnitude apart
    assert fp8["mean_abs"]["mean"] > 1e3 * none["mean_abs"]["mean"]
    assert none["max_abs"]["high"] < 1e-5 and fp8["max_abs"]["low"] > 1e-3


def test_the_downstream_cell_is_the_held_out_change_against_the_rows_own_baseline():
    """Paired by replicate against the row's baseline (the tie fix against the emulator, not the
    reference), set against another data order's |Δ|; 3 replicates give a range, labelled so."""
    from numdev.analysis.optimizations import YARDSTICK, _downstream, _heldout_change

    values = {"reference": [1.00, 1.10, 1.20], YARDSTICK: [1.05, 1.02, 1.26],  # |Δ| 0.05, 0.08, 0.06
              "attn_flash_emulated": [1.01, 1.12, 1.19], "opt_flash_tie_fix": [1.01, 1.12, 1.19],
              "opt_fp8_linear": [1.30, 1.35, 1.50]}
    heldout = {role: {"per_replicate": {str(r): v for r, v in enumerate(vs)}} for role, vs in values.items()}
    yardstick = _heldout_change(heldout, YARDSTICK, "reference")
    assert yardstick["mean_abs"] == pytest.approx((0.05 + 0.08 + 0.06) / 3)

    tie = _downstream(heldout, "opt_flash_tie_fix", "attn_flash_emulated", yardstick)
    assert tie["heldout_loss"]["estimate"]["value"] == 0.0 and tie["more_than_a_seed"] is False
    fp8 = _downstream(heldout, "opt_fp8_linear", "reference", yardstick)
    assert fp8["heldout_loss"]["estimate"]["value"] == pytest.approx(np.mean([0.30, 0.25, 0.30]))
    assert fp8["more_than_a_seed"] is True and "range of 3" in fp8["text"] and "more than a seed" in fp8["text"]
    assert "yardstick" in _downstream(heldout, YARDSTICK, "reference", yardstick)["text"]
    assert "not measured" in _downstream({}, "opt_fp8_linear", "reference", None)["text"]


def test_the_catalogue_measures_held_out_loss():
    cfg = compose_train("experiment=optimizations", smoke=False)
    assert cfg.callbacks.heldout is not None and cfg.callbacks.samples is None
