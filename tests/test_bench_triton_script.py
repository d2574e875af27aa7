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


def test_a_method_that_failed_in_every_record_ends_the_run_with_exit_1(tmp_path, monkeypatch, capsys):
    """A record that fails is kept and the loop goes on (a run with a failure at one length still exits
    0); a method that never ran is a failed measurement: exit 1, one line naming it, after the report."""
    bench = load_script("bench_triton")
    timed = bench._time
    refuse = {"at": {32}}

    def refusing(do_bench, backend, q, *rest):
        if q.shape[2] in refuse["at"]:
            raise RuntimeError(f"CUDA out of memory at N={q.shape[2]}\nthe allocator's second line")
        return timed(do_bench, backend, q, *rest)

    monkeypatch.setattr(bench, "_time", refusing)
    out = tmp_path / "bench.json"
    args = ["--device", "cpu", "--dtype", "fp32", *TINY, "--methods", "sdpa_flash", "--out", str(out)]
    assert bench.main(args) == 0
    rows = json.loads(out.read_text())["results"]
    assert [("error" in r, r["seq"]) for r in rows] == [(True, 32), (True, 32), (False, 64), (False, 64)]
    assert rows[0]["error"] == "CUDA out of memory at N=32"
    capsys.readouterr()
    refuse["at"] = {32, 64}
    assert bench.main(args) == 1
    report, err = json.loads(out.read_text()), capsys.readouterr().err
    assert report["complete"] is True and all("error" in r for r in report["results"])
    assert err.splitlines()[-1] == ("bench_triton: error: sdpa_flash failed in all 4 of its runs "
                                    "(the first: CUDA out of memory at N=32)")


def test_never_ran_counts_a_skipped_record_as_neither():
    from numdev.cli.errors import never_ran

    records = [{"k": "a", "error": "x\ny"}, {"k": "a", "skipped": "forward-only"}, {"k": "b", "ms": 1.0},
               {"k": "b", "error": "z"}, {"k": "c", "skipped": "forward-only"}, {"k": "d", "error": "w"}]
    assert never_ran(records, "k") == ["a failed in all 1 of its runs (the first: x y)",
                                       "d failed in all 1 of its runs (the first: w)"]
    assert never_ran([], "k") == []
