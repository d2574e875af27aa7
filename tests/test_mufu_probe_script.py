"""scripts/mufu_probe.py: the GPU's MUFU.EX2 and MUFU.LG2 alone, bit for bit. No GPU here: the input sets, the
distances and the files are held to exact values with stand-ins for the instructions, and the kernel is compiled
for sm_90 (Triton needs no GPU to compile) and its machine code read: one MUFU instruction, no guard."""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest
import torch
from helpers import load_script


@pytest.fixture(scope="module")
def probe():
    return load_script("mufu_probe")


def test_a_binade_set_is_the_binade_whole_and_a_random_set_stays_in_its_range(probe):
    ex2 = probe.inputs("ex2_binade", 23, 0)
    assert ex2.numel() == 1 << 23 and torch.unique(ex2).numel() == 1 << 23
    assert float(ex2.max()) == -0.5 and float(ex2.min()) == float(torch.nextafter(torch.tensor(-1.0), torch.tensor(0.0)))
    lg2 = probe.inputs("lg2_binade", 23, 0)
    assert float(lg2.min()) == 1.0 and float(lg2.max()) < 2.0 and torch.unique(lg2).numel() == 1 << 23
    ex2_random = probe.inputs("ex2_random", 16, 3)
    assert bool(((ex2_random < 0) & (ex2_random >= -126)).all()) and torch.equal(ex2_random, probe.inputs("ex2_random", 16, 3))
    assert float(ex2_random.abs().min()) < 1e-30  # uniform over bit patterns: every exponent, tiny ones too
    lg2_random = probe.inputs("lg2_random", 16, 3)
    assert bool(((lg2_random >= 1) & (lg2_random < 2.0 ** 24)).all())
    assert not torch.equal(lg2_random, probe.inputs("lg2_random", 16, 4))


@pytest.mark.parametrize(("stand_in", "histogram"), [
    (lambda x: torch.exp2(x.double()).float(), {"0": 1 << 12}),  # correctly rounded: every distance 0
    (lambda x: torch.nextafter(torch.exp2(x.double()).float(), torch.tensor(float("inf"))), {"1": 1 << 12}),  # one ulp up
    (lambda x: torch.nextafter(torch.exp2(x.double()).float(), torch.tensor(0.0)), {"-1": 1 << 12}),
])
def test_the_distance_is_counted_in_ulps_from_the_correctly_rounded_value(probe, monkeypatch, stand_in, histogram):
    monkeypatch.setattr(probe, "instruction", lambda function, device: stand_in)
    summary, distances = probe.measure("ex2_random", 12, 0, "cpu")
    assert summary["histogram_ulps"] == histogram and summary["beyond_int8"] == 0
    assert distances.dtype == np.int8 and distances.shape == (1 << 12,)
    assert summary["correctly_rounded"] == (1.0 if "0" in histogram else 0.0)


def test_the_cpu_rehearsal_writes_its_summary_and_arrays(probe, tmp_path, capsys):
    out, arrays = tmp_path / "m.json", tmp_path / "m.npz"
    assert probe.main(["--device", "cpu", "--size", "12", "--random-size", "10", "--out", str(out), "--out-arrays", str(arrays)]) == 0
    report = json.loads(out.read_text())
    assert report["rehearsal"] is True and set(report["sets"]) == set(probe.SETS)
    with np.load(arrays) as kept:
        assert {name: kept[name].shape for name in kept.files} == {
            "ex2_binade": (1 << 12,), "lg2_binade": (1 << 12,), "ex2_random": (1 << 10,), "lg2_random": (1 << 10,)}
        for name in probe.SETS:  # the arrays are the summary's histogram, input by input
            values, counts = np.unique(kept[name], return_counts=True)
            assert {str(v): int(c) for v, c in zip(values, counts)} == report["sets"][name]["histogram_ulps"]
    assert all(entry["max_abs_ulps"] <= 2 for entry in report["sets"].values())  # torch's float32 exp2, log2 here


@pytest.mark.parametrize(("argv", "says"), [
    (["--device", "cpu", "--size", "24"], "--size 24: at most 23"),
    (["--device", "cpu", "--random-size", "25"], "--random-size 25: at most 24"),
    (["--device", "cpu", "--size", "2"], "argument --size"),
])
def test_bad_arguments_are_one_line(probe, argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        probe.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and says in err, err


def test_cuda_without_a_gpu_says_to_rehearse(probe, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    with pytest.raises(SystemExit) as exit_:
        probe.main(["--device", "cuda"])
    assert exit_.value.code == 2 and "--device cpu rehearses" in capsys.readouterr().err


@pytest.mark.parametrize(("function", "unit"), [("ex2", "MUFU.EX2"), ("lg2", "MUFU.LG2")])
def test_the_kernel_compiles_for_hopper_to_the_bare_instruction(probe, function, unit, tmp_path):
    """What runs on the GPU: one MUFU instruction per element, without exp2f's or __logf's guards (no FSETP)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"X": "*fp32", "Y": "*fp32", "n": "i32", "BLOCK": "constexpr", "ASM": "constexpr"}
    compiled = triton.compile(ASTSource(probe.kernel(), signature, {"BLOCK": 1024, "ASM": probe.INSTRUCTIONS[function]}),
                              target=GPUTarget("cuda", 90, 32))
    assert probe.INSTRUCTIONS[function].split()[0] in compiled.asm["ptx"]
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    sass = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    assert set(re.findall(r"MUFU\.\w+", sass)) == {unit} and "FSETP" not in sass
