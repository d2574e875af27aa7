"""scripts/bench_triton.py: on a GPU it times the Triton kernel beside SDPA flash and the FlashAttention
kernels; here `--device cpu` rehearses the same loop (Triton's interpreter, PyTorch's CPU flash kernel)
as a command once, tiny. In-process: the refusals, and the --out file rewritten after every record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import die_with_parent, load_script

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--seq", "32", "64", "--dims", "32", "--tokens", "64", "--width", "64", "--repeats", "1"]


def test_the_cpu_rehearsal_times_triton_and_sdpa_flash_and_writes_the_report(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_triton.py"), "--device", "cpu", *TINY,
                             "--methods", "triton", "triton[variant=fa1]", "sdpa_flash", "--out", str(out)],
                            capture_output=True, text=True, timeout=600, preexec_fn=die_with_parent)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert json.loads(result.stdout) == report
    assert report["complete"] is True and report["device"] == "cpu" and report["dtype"] == "fp16"
    assert "rehearsal" in report["note"] and report["gpu"] is None
    rows = report["results"]
    assert {(r["method"], r["mode"], r["seq"]) for r in rows} == {
        (m, mode, n) for m in ("triton", "triton[variant=fa1]", "sdpa_flash") for mode in ("fwd", "fwd_bwd") for n in (32, 64)}
    assert all(r["ms"] > 0 and r["tflops"] > 0 and r["heads"] == 2 and r["batch"] == 64 // r["seq"] for r in rows), rows
    assert set(report["summary"]) == {"triton/sdpa_flash fwd, median over shapes", "triton[variant=fa1] / triton, median over shapes"}
    assert all(value > 0 for value in report["summary"].values())
    assert len(result.stderr.splitlines()) == len(rows)  # one progress line a record, nothing else


def test_the_report_is_rewritten_after_every_record_then_marked_complete(tmp_path, monkeypatch):
    bench = load_script("bench_triton")
    written = []
    monkeypatch.setattr(bench, "write_text", lambda path, text: written.append(json.loads(text)))
    out = tmp_path / "bench.json"
    assert bench.main(["--device", "cpu", "--dtype", "fp32", *TINY, "--methods", "sdpa_flash", "--out", str(out)]) == 0
    assert [w["complete"] for w in written] == [False] * 4 + [True]  # 2 lengths x 2 modes, then the final report
    assert [len(w["results"]) for w in written] == [1, 2, 3, 4, 4] and written[-1]["dtype"] == "fp32"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here")
def test_without_a_gpu_it_says_so_in_one_line(capsys):
    assert load_script("bench_triton").main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA GPU here" in err and "--device cpu" in err


def test_bf16_in_the_interpreter_is_refused_in_one_line(capsys):
    assert load_script("bench_triton").main(["--device", "cpu", "--dtype", "bf16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--dtype bf16 on cpu: Triton's interpreter has no bfloat16; use fp16 or fp32" in err
