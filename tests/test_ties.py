"""Qiu & Yao's failure looked for (numdev.analysis.ties, scripts/qiu_yao_search.py): tie rates against a
direct count, the P·V bias isolating the accumulator, and the search over a trained language model's
snapshots (issue 34's fifth item)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import REPO, die_with_parent, train_run
from test_language_model import SMALL

from numdev.analysis.ties import TieProbe, _tie_counts, call_statistics, snapshot_ties, summarise
from numdev.attention import FlashEmulated
from numdev.attention.flash_emulated import TIE_TOLERANCE
from numdev.numerics.stages import prepared_inputs, stage_formats


def _small_integers(seed: int, shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1, 2, shape, generator=g).float().to(torch.bfloat16)  # exact scores: many exact ties


def _direct_counts(q, k, block_c: int, causal: bool) -> dict:
    """Row and block ties counted in float64 NumPy from the exact scores."""
    s = np.einsum("bhqd,bhkd->bhqk", q.double().numpy(), k.double().numpy()) / math.sqrt(q.shape[-1])
    n_q, n_k = s.shape[2], s.shape[3]
    if causal:
        s = np.where(np.arange(n_k)[None, :] > np.arange(n_q)[:, None], -np.inf, s)
    row_max = s.max(axis=-1, keepdims=True)
    rows = np.isfinite(row_max[..., 0])
    row_ties = ((s == row_max).sum(axis=-1) > 1) & rows
    pairs = block_ties = 0
    for start in range(0, n_k, block_c):
        block = s[..., start:start + block_c]
        m = block.max(axis=-1, keepdims=True)
        visible = np.isfinite(m[..., 0])
        pairs += visible.sum()
        block_ties += (((block >= m - TIE_TOLERANCE).sum(axis=-1) > 1) & visible).sum()
    return {"rows": rows.sum(), "row_ties": row_ties.sum(), "pairs": pairs, "block_ties": block_ties}


def _direct_max(q, k, causal: bool) -> float:
    s = np.einsum("bhqd,bhkd->bhqk", q.double().numpy(), k.double().numpy()) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.arange(s.shape[3])[None, :] > np.arange(s.shape[2])[:, None], -np.inf, s)
    return float(s.max())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_c", [8, 13, 40])
def test_tie_counts_are_a_direct_count_of_the_exact_scores(causal, block_c):
    q, k = _small_integers(0, (2, 3, 40, 16)), _small_integers(1, (2, 3, 40, 16))
    backend = FlashEmulated(stage_formats("paper", "bf16"), block_r=8, block_c=block_c)
    qp, kp, _ = prepared_inputs(q, k, k, backend.formats)
    counts = _tie_counts(backend, qp, kp, causal)
    assert float(counts.pop("score_max")) == float(torch.tensor(_direct_max(q, k, causal)))
    got = {name: int(value) for name, value in counts.items()}
    expected = {name: int(value) for name, value in _direct_counts(q, k, block_c, causal).items()}
    assert got == expected
    assert 0 < got["row_ties"] < got["rows"] and 0 < got["block_ties"] < got["pairs"]  # the case exercises both


def test_repeated_keys_tie_every_row_and_distinct_ones_almost_none():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 64, 32, generator=g).to(torch.bfloat16)
    distinct = torch.randn(1, 2, 64, 32, generator=g).to(torch.bfloat16)
    repeated = distinct[:, :, :16].repeat_interleave(4, dim=2)
    backend = FlashEmulated(stage_formats("paper", "bf16"), block_r=16, block_c=16)
    rates = {}
    for name, k in (("distinct", distinct), ("repeated", repeated)):
        out = backend(q, k, k)
        rates[name] = summarise({n: float(v) for n, v in call_statistics(backend, q, k, k, out, False).items()})
    assert rates["repeated"]["row_tie_rate"] == 1.0 and rates["repeated"]["block_tie_rate"] == 1.0
    assert rates["distinct"]["row_tie_rate"] < 0.05
    keys = torch.nn.functional.normalize(distinct.double(), dim=-1)[0]  # key_cosine: the mean over distinct pairs
    gram = keys @ keys.transpose(-1, -2)
    expected = float((gram.sum() - gram.diagonal(dim1=-2, dim2=-1).sum()) / (2 * 64 * 63))
    assert math.isclose(rates["distinct"]["key_cosine"], expected, rel_tol=1e-9, abs_tol=1e-15)
    same = distinct[:, :, :1].expand(-1, -1, 64, -1)  # one key everywhere: every pair has cosine 1
    sums = call_statistics(backend, q, same, same, backend(q, same, same), False)
    assert math.isclose(summarise({n: float(v) for n, v in sums.items()})["key_cosine"], 1.0, rel_tol=1e-12)


def test_the_pv_bias_is_the_accumulator_alone():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 48, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    fa2 = FlashEmulated(stage_formats("fa2", "bf16"), block_r=16, block_c=16)  # FP32 accumulator: O' is O
    sums = call_statistics(fa2, q, k, v, fa2(q, k, v, causal=True), True)
    assert float(sums["pv_sq"]) == 0.0 and float(sums["pv_sum"]) == 0.0
    paper = FlashEmulated(stage_formats("paper", "bf16"), block_r=16, block_c=16)  # a bf16 accumulator
    out = paper(q, k, v, causal=True)
    sums = call_statistics(paper, q, k, v, out, True)
    result = summarise({n: float(x) for n, x in sums.items()})
    assert 1e-4 < result["pv_rel_rms"] < 0.05  # bf16's rounding of O, relative: a few units of 2^-8
    assert 0 <= result["pv_bias_share"] <= 1 and result["pv_column_null"] == 1 / math.sqrt(2 * 48)
    # out_bias: against FP64 attention, computed here directly
    from numdev.attention import golden_attention

    gold = golden_attention(q, k, v, causal=True)
    assert math.isclose(result["out_bias"], float((out.double() - gold).mean() / gold.square().mean().sqrt()), rel_tol=1e-9)


def test_the_probe_pools_calls_by_their_sums():
    g = torch.Generator().manual_seed(4)
    backend = FlashEmulated(stage_formats("paper", "bf16"), block_r=16, block_c=16)
    probe = TieProbe(backend)

    class Call:
        causal, layer_name = True, "a"

    calls = [tuple(torch.randn(1, 2, 32, 16, generator=g).to(torch.bfloat16) for _ in range(3)) for _ in range(2)]
    total = {}
    for q, k, v in calls:
        out = backend(q, k, v, causal=True)
        probe(Call, q, k, v, out)
        for name, value in call_statistics(backend, q, k, v, out, True).items():
            if name == "rows_per_column":
                total[name] = float(value)
            elif name == "score_max":  # the largest over calls, not a sum
                total[name] = max(total.get(name, -math.inf), float(value))
            else:
                total[name] = total.get(name, 0.0) + float(value)
    assert probe.results()["layers"]["a"] == pytest.approx(summarise(total), rel=1e-12)


@pytest.fixture(scope="module")
def bf16_flash_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("ties") / "run"
    train_run(*SMALL, "precision=bf16-mixed", "attention=flash_emulated", "attention.formats.preset=paper",
              "attention.block_c=16", run_dir=run, smoke=False)
    return run


def test_the_search_reads_every_snapshot_of_a_bf16_flash_run(bf16_flash_run):
    rows = snapshot_ties(bf16_flash_run, windows=2, heldout=8)
    assert [r["step"] for r in rows] == [0, 2, 4]
    heldout = json.loads((bf16_flash_run / "heldout.json").read_text())
    assert rows[-1]["heldout_loss"] == heldout["heldout_loss"]  # the run's own evaluation, repeated bit for bit
    assert set(rows[0]["layers"]) == {"blocks.0.attn"}
    for row in rows:
        assert 0 <= row["all"]["row_tie_rate"] <= 1 and row["all"]["pv_rel_rms"] > 0


def test_the_search_refuses_what_it_cannot_read(bf16_flash_run, tmp_path):
    with pytest.raises(ValueError, match=r"no snapshot at step\(s\) \[3\]"):
        snapshot_ties(bf16_flash_run, steps=[3])
    with pytest.raises(ValueError, match=r"windows=100000, heldout=64: more held-out windows than"):
        snapshot_ties(bf16_flash_run, windows=100000)
    forged = tmp_path / "forged"
    shutil.copytree(bf16_flash_run, forged)
    config = forged / "config.yaml"
    config.write_text(config.read_text().replace("threads: 1", "threads: -4"))
    with pytest.raises(ValueError, match=r"config.yaml: threads=-4 must be a positive integer"):
        snapshot_ties(forged)
    other = tmp_path / "baseline"
    train_run(*SMALL, "trainer.max_steps=2", run_dir=other, smoke=False)
    with pytest.raises(ValueError, match="attention=flash_emulated"):
        snapshot_ties(other)


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "qiu_yao_search.py"), *args], capture_output=True,
                          text=True, timeout=600, preexec_fn=die_with_parent)


def test_the_script_writes_its_json_and_refuses_bad_arguments(bf16_flash_run, tmp_path):
    out = tmp_path / "search.json"
    result = _script(str(bf16_flash_run), "--windows", "2", "--heldout", "8", "--out", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["runs"][0]["steps"][-1]["step"] == 4 and data["runs"][0]["status"] == "finished"
    for bad, message in (([str(tmp_path / "nowhere")], "nowhere"), ([str(bf16_flash_run), "--windows", "0"], "--windows")):
        result = _script(*bad)
        assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr


def test_the_fix_keeps_gradients_finite_when_it_shifts_a_large_tied_maximum():
    """A row whose last block ties a maximum of 45.5: the fix exponentiates against 91, the row sum is
    ~e^-45 < 2^-64, and 1/l's gradient as autograd orders it, -g (r r), overflowed to inf (the NaN that
    stopped a 3000-step run at step 815). The gradients must be finite and FP64 attention's, to bf16's
    precision; the forward's bits are those of the call without gradients."""
    from numdev.attention import golden_attention

    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 1, 64, 16, generator=g)
    k = torch.randn(1, 1, 64, 16, generator=g)
    v = torch.randn(1, 1, 64, 16, generator=g)
    q[..., 63, :] = 0.0
    q[..., 63, 0] = 14.0
    k[..., 60, :] = k[..., 61, :] = 0.0
    k[..., 60, 0] = k[..., 61, 0] = 13.0  # q.k = 182, scaled by 1/4: a tie at 45.5 in the last key block
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    upstream = torch.randn(1, 1, 64, 16, generator=g) * 1e-3
    fix = FlashEmulated(stage_formats("paper", "bf16"), block_r=16, block_c=16, tie_fix=True)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = fix(*leaves, causal=True)
    with torch.no_grad():
        assert torch.equal(out, fix(q, k, v, causal=True))
    out.backward(upstream.to(out.dtype))
    wide = [t.double().requires_grad_(True) for t in (q, k, v)]
    golden_attention(*wide, causal=True).backward(upstream.double())
    for got, expected in zip(leaves, wide):
        assert torch.isfinite(got.grad).all()
        error = (got.grad.double() - expected.grad).norm() / expected.grad.norm()
        assert error < 0.05, float(error)


def test_the_reciprocals_gradient_is_autograds_where_it_does_not_overflow():
    from numdev.attention.flash_emulated import _Reciprocal

    g = torch.Generator().manual_seed(6)
    row_sum = torch.rand(4096, generator=g) * 100 + 2.0 ** -60  # from 2^-60 to 100: r r stays finite
    upstream = torch.randn(4096, generator=g)
    ours, theirs = row_sum.clone().requires_grad_(True), row_sum.clone().requires_grad_(True)
    _Reciprocal.apply(ours).backward(upstream)
    (1.0 / theirs).backward(upstream)
    assert torch.equal(ours.grad, theirs.grad)
    tiny = torch.tensor([1e-25], requires_grad=True)
    _Reciprocal.apply(tiny).backward(torch.tensor([1e-30]))
    assert math.isclose(float(tiny.grad), -1e-30 / 1e-50, rel_tol=1e-5)  # finite where autograd's is -inf


def test_the_docs_block_is_the_scripts_from_the_committed_search():
    from helpers import load_script

    from numdev.report.docblocks import read_block

    search = load_script("qiu_yao_search")
    result = json.loads(search.RESULT.read_text(encoding="utf-8"))
    assert read_block(search.DOC, "qiu-yao") == search.block(result).strip()
    assert {r["label"] for r in result["runs"]} >= {"flash (paper formats), bf16-mixed, lr 0.001",
                                                     "flash (paper formats), bf16-mixed, lr 0.001 + flash_tie_fix"}
