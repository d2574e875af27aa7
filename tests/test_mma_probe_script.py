"""scripts/mma_probe.py: one tensor-core instruction against the FA2 CUDA model's hypotheses of its sums. No GPU here:
the inputs, the comparison and the files are held to exact values with the hypotheses themselves as stand-ins (each
must be told apart from the others on these inputs), and the kernel is compiled for sm_90 and its machine code read:
one HMMA.16816.F32 per case, the accumulator its C operand (no FADD)."""

from __future__ import annotations

import json
import re
import subprocess
from fractions import Fraction

import numpy as np
import pytest
import torch
from helpers import load_script

from numdev.attention import cuda_kernel
from numdev.numerics.formats import float32_ulps


@pytest.fixture(scope="module")
def probe():
    return load_script("mma_probe")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_inputs_sums_are_exact_in_float64_and_regenerate(probe, precision):
    a, b, c = probe.inputs(precision, "hmma", 4, 7)
    assert a.dtype == probe.DTYPES[precision] and c.dtype == torch.float32 and a.shape == (4, 16, 16) and b.shape == (4, 16, 8)
    wide = torch.baddbmm(c.double(), a.double(), b.double())
    for case, row, col in ((0, 0, 0), (1, 5, 3), (3, 15, 7)):
        exact = Fraction(float(c[case, row, col])) + sum(Fraction(float(a[case, row, k])) * Fraction(float(b[case, k, col]))
                                                          for k in range(16))
        assert Fraction(float(wide[case, row, col])) == exact
    assert all(torch.equal(x, y) for x, y in zip((a, b, c), probe.inputs(precision, "hmma", 4, 7)))


@pytest.mark.parametrize("truth", ["aten", "mma16", "mma16_rz"])
def test_each_hypothesis_is_found_when_it_is_the_truth_and_told_apart_from_the_others(probe, monkeypatch, truth):
    """The positive control: an instruction that sums as `truth` gives it every output and each other hypothesis
    under 90%: the inputs tell them apart."""
    monkeypatch.setattr(probe, "run", lambda instruction, a, b, c, device: cuda_kernel.tensor_core_matmul(a.float(), b.float(), c, truth))
    summary, distances = probe.measure("bf16", "hmma", 64, 0, "cpu")
    shares = {h: e["bit_identical"] for h, e in summary["hypotheses"].items()}
    assert shares[truth] == 1.0 and all(share < 0.9 for h, share in shares.items() if h != truth), shares
    a, b, c = probe.inputs("bf16", "hmma", 64, 0)
    rounded = torch.baddbmm(c.double(), a.double(), b.double()).float()
    recovered = float32_ulps(rounded, torch.zeros_like(rounded)) + torch.from_numpy(distances).long()  # ordered integers
    found = cuda_kernel.tensor_core_matmul(a.float(), b.float(), c, truth)
    assert torch.equal(recovered, float32_ulps(found, torch.zeros_like(found)))  # the arrays give the outputs back exactly


def test_the_cpu_rehearsal_writes_its_summary_and_arrays(probe, tmp_path):
    out, arrays = tmp_path / "m.json", tmp_path / "m.npz"
    assert probe.main(["--device", "cpu", "--cases", "16", "--out", str(out), "--out-arrays", str(arrays)]) == 0
    report = json.loads(out.read_text())
    assert report["rehearsal"] is True and set(report["sets"]) == {"hmma_bf16", "hgmma_bf16", "hmma_fp16", "hgmma_fp16"}
    with np.load(arrays) as kept:
        assert {name: kept[name].size for name in kept.files} == {name: 16 * 128 for name in report["sets"]}
        assert all(kept[name].dtype == np.int32 for name in kept.files)


@pytest.mark.parametrize(("argv", "says"), [
    (["--device", "cpu", "--cases", "9000"], "--cases 9000: at most 8192"),
    (["--device", "cpu", "--cases", "4"], "argument --cases"),
])
def test_bad_arguments_are_one_line(probe, argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        probe.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize(("precision", "instruction", "opcode"), [
    ("bf16", "hmma", "HMMA.16816.F32.BF16"), ("fp16", "hmma", "HMMA.16816.F32"),
    ("bf16", "hgmma", "HGMMA.64x16x16.F32.BF16"), ("fp16", "hgmma", "HGMMA.64x16x16.F32"),
])
def test_a_case_is_one_tensor_core_instruction_with_the_accumulator_inside(probe, precision, instruction, opcode, tmp_path):
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rows, cols, warps = probe.SHAPES[instruction]
    signature = {"A": f"*{precision}", "B": f"*{precision}", "C": "*fp32", "D": "*fp32",
                 "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
    compiled = triton.compile(ASTSource(probe.kernel(), signature, {"BM": rows, "BN": cols, "BK": probe.K}),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    sass = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    assert re.findall(r"\bH[G]?MMA[\w.]*", sass) == [opcode] and not re.search(r"\bFADD\b", sass)
