"""scripts/gpu_kernels.py (the emulator against real kernels, and the Fig. 4 ratio with real kernels),
run here on PyTorch's CPU flash kernel, the one real kernel a CPU has: the same code measures the
GPU kernels on a GPU machine. The script runs as a command once; its argument checks in-process;
--workers (the comparison in spawned processes) against the serial run, and stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import die_with_parent, kill_session, load_script, no_process_left, session_processes, wait_until

from numdev.attention import golden_attention

ROOT = Path(__file__).resolve().parents[1]


def test_on_cpu_the_kernel_model_matches_and_real_flash_beats_the_paper_baseline(tmp_path):
    out = tmp_path / "kernels.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_kernels.py"), "--device", "cpu", "--n", "300", "1100",
         "--dims", "64", "--seeds", "0", "1", "2", "--heads", "2", "--compare-heads", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert json.loads(result.stdout) == report and report["complete"] is True  # partial files say false
    assert report["provenance"]["machine"]["cpu"] and report["kernel_versions"] == {"sdpa_flash": {"backend": "sdpa_flash", "dtype": None}}
    summary = report["summary"]
    assert len(summary) == 2 * 2 * 2  # dtypes x causal x N
    for entry in summary:
        # numerics=cpu_sdpa models this kernel bit for bit (docs/results/validate_cpu_kernel.json)
        assert entry["emulator[cpu_sdpa]"]["bit_identical_worst_seed"] >= 0.999, entry
        # the generic fa2 preset (ATen exp and sums) matches fewer bits; keeping FP32 statistics as the
        # kernel does, it is still nearer the kernel than the all-low-precision Baseline is
        assert entry["emulator[fa2]"]["bit_identical_mean"] < entry["emulator[cpu_sdpa]"]["bit_identical_worst_seed"]
        assert 0 < entry["emulator[fa2]"]["gap_relative_to_paper_baseline_mean"] < 1
        # a real kernel keeps FP32 statistics: closer to FP64 than the paper's all-bf16/fp16 Baseline
        ratio = entry["fig4_ratio_max_abs"]
        assert ratio["method"] == "range" and ratio["n"] == 3 and ratio["high"] < 1, entry
        # the FA2 CUDA model runs its blocks last to first in other tiles: further from this kernel than cpu_sdpa,
        # and its log-sum-exp is compared with the kernel's (float32 ulps: within a few of each other somewhere)
        cuda = entry["emulator[fa2_cuda]"]
        assert cuda["bit_identical_mean"] < entry["emulator[cpu_sdpa]"]["bit_identical_worst_seed"]
        assert 0 < cuda["lse_within_2ulp_mean"] <= 1 and cuda["lse_max_ulp"] >= 0
    assert {r["seed"] for r in report["rows"]} == {0, 1, 2}
    row = report["rows"][0]["emulators"]["fa2_cuda"]
    # N=300 of a (2, 2, N, d) batch on an H100's 132 SMs: the split kernel, 64 x 256 tiles, 2 splits
    assert (row["kv_splits"], row["tiles"], row["lse_call_same_output"]) == (2, [64, 256], True)
    assert row["lse_max_abs"] < 1e-3


@pytest.mark.parametrize("bad", [["--n", "0"], ["--dims", "-64"], ["--seeds", "-1"], ["--batch", "x"]])
def test_bad_grid_values_are_refused_before_anything_runs(bad, capsys):
    with pytest.raises(SystemExit) as exit_:
        load_script("gpu_kernels").main(["--device", "cpu", *bad])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err and f"argument {bad[0]}" in err


def test_bad_heads_are_one_line(capsys):
    assert load_script("gpu_kernels").main(["--device", "cpu", "--heads", "1", "--compare-heads", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--compare-heads 2 must be 1..--heads (1)" in err


def _script(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "gpu_kernels.py"), "--device", "cpu", "--dtypes", "bf16", *args]


TIMINGS = ("first_call_s", "compare_s", "baselines_s")


def _without_timing(rows: list[dict]) -> list[dict]:
    return [{key: value for key, value in row.items() if key not in TIMINGS} for row in rows]


def test_workers_give_the_rows_of_the_serial_run_bit_for_bit_in_grid_order(tmp_path):
    # N=700, d=32, 2 heads: 44800 outputs, past torch's grain for a parallel float64 mean, whose last bits
    # then follow the thread count. The serial run has 2 threads, the workers 1: the comparison runs on
    # one thread in both, so every number is the same (without that, the metrics differ in their last bits).
    grid = ["--n", "700", "96", "--dims", "32", "--seeds", "1", "0", "--heads", "2", "--compare-heads", "2"]
    reports = {}
    for workers, threads in ((1, "2"), (2, "1")):
        out = tmp_path / f"w{workers}.json"
        result = subprocess.run(_script(*grid, "--workers", str(workers), "--out", str(out)), capture_output=True, text=True,
                                timeout=600, env={**os.environ, "OMP_NUM_THREADS": threads}, preexec_fn=die_with_parent)
        assert result.returncode == 0, result.stderr
        reports[workers] = json.loads(out.read_text())
        assert reports[workers]["complete"] is True and reports[workers]["grid"]["workers"] == workers
    serial, parallel = reports[1], reports[2]
    # the comparison's CPU cost: each cell's Baselines once and its one kernel's emulators (one kernel a cell on CPU)
    assert parallel["comparison_cpu_s"] == pytest.approx(sum(r["compare_s"] + r["baselines_s"] for r in parallel["rows"]), abs=0.06)
    assert all(r["compare_s"] > 0 and r["baselines_s"] > 0 for r in parallel["rows"])
    assert _without_timing(parallel["rows"]) == _without_timing(serial["rows"]) and parallel["summary"] == serial["summary"]
    # the grid's order (dtype, dim, causal, N as given, seed as given), whichever cell a worker finished first
    order = [(r["causal"], r["n"], r["seed"]) for r in parallel["rows"]]
    assert order == [(c, n, s) for c in (False, True) for n in (700, 96) for s in (1, 0)]


def test_a_sigterm_stops_the_workers_and_keeps_the_finished_cells(tmp_path):
    out = tmp_path / "kernels.json"
    # one quick cell, then cells of seconds each: the workers are busy when the signal comes
    process = subprocess.Popen(
        _script("--n", "64", "4096", "--dims", "64", "--causal", "0", "--seeds", "0", "1", "2", "--heads", "2",
                "--compare-heads", "2", "--workers", "2", "--out", str(out), "--samples", str(tmp_path / "s.safetensors"),
                "--sample-seeds", "0", "1", "2"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=die_with_parent)
    try:
        workers = lambda: sum("spawn_main" in line for line in session_processes(process.pid))  # noqa: E731
        wait_until(lambda: out.exists() and workers() == 2, "a cell finished with both workers up", process, timeout_s=120)
        os.kill(process.pid, signal.SIGTERM)  # the main process only, as `timeout` signals its child
        assert process.wait(timeout=60) == 143
        err = process.stderr.read()
        assert "Traceback" not in err and "gpu_kernels: stopped by SIGTERM;" in err and "(complete: false)" in err
        assert no_process_left(process.pid) == []
        report = json.loads(out.read_text())
        assert report["complete"] is False and report["rows"] and len(report["rows"]) < 6
        assert report["rows"][0]["n"] == 64 and report["grid"]["workers"] == 2
        # the samples keep every cell whose kernels ran, those still in comparison too (without the call's shares)
        meta, _ = load_script("gpu_kernels").read_samples(tmp_path / "s.safetensors")
        compared = {(r["n"], r["seed"]) for r in report["rows"]}
        kept = {(c["n"], c["seed"]): c["sampled_bit_identical_at_call"] for c in meta["cells"]}
        # (the samples are rewritten before the JSON: a cell compared in the JSON has its shares in the samples, and a
        # stop between the two writes leaves one cell with shares that the JSON lacks)
        assert compared < set(kept) and all(kept[cell] for cell in compared)
        assert any(shares == {} for shares in kept.values())  # a cell in comparison when the stop came
    finally:
        kill_session(process)
        process.wait()


def test_the_workers_are_as_many_as_the_memory_holds_at_the_largest_n():
    from argparse import Namespace

    memory_workers = load_script("gpu_kernels").memory_workers
    # an H200 machine's ~120 GB free: ~8 GB per comparison at N=16384 (one head), so 10 of its 16 CPUs
    assert memory_workers(Namespace(compare_heads=1, n=[512, 16384]), available=120e9) == 10
    assert memory_workers(Namespace(compare_heads=1, n=[4096]), available=120e9) > 16
    assert memory_workers(Namespace(compare_heads=8, n=[16384]), available=16e9) == 1  # never none


def test_the_memory_to_size_the_workers_by_can_be_given(capsys):
    """A lent GPU machine's memory starts small and grows as it is used: gpu_call gives its size."""
    assert load_script("gpu_kernels").main(["--device", "cpu", "--n", "64", "--dims", "16", "--seeds", "0", "--heads", "1",
                                             "--causal", "0", "--workers", "2", "--memory-gib", "1"]) == 0
    captured = capsys.readouterr()
    assert "1 workers, not 2: the memory available holds 1 comparisons at N=64" in captured.err
    assert json.loads(captured.out)["grid"]["workers"] == 1


def test_baselines_that_the_gpu_refuses_are_computed_on_the_cpu_and_said_to_be(capsys, monkeypatch):
    """The Baselines run on the GPU beside the kernels; where that fails (here: no CUDA at all), the CPU
    computes them, the same values as the CPU path, and one line says so."""
    gpu_kernels = load_script("gpu_kernels")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    on_cpu, _, where_cpu = gpu_kernels.paper_and_eager_baselines("cpu", "bf16", q, k, v, True)
    to = torch.Tensor.to

    def to_no_gpu(self, *args, **kwargs):
        if args and args[0] == "cuda":
            raise RuntimeError("no GPU here")
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to_no_gpu)
    fallen, seconds, where = gpu_kernels.paper_and_eager_baselines("cuda", "bf16", q, k, v, True)
    monkeypatch.undo()
    assert (where_cpu, where) == ("cpu", "cpu") and seconds >= 0
    assert all(torch.equal(fallen[name].view(torch.int16), on_cpu[name].view(torch.int16)) for name in ("paper", "eager"))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the Baselines on the CPU: on the GPU" in err and "no GPU here" in err
    # the paper Baseline is the all-bf16 one: on average further from the FP64 value than eager (FP32 softmax)
    golden = golden_attention(q, k, v, causal=True).double()
    assert (on_cpu["paper"].double() - golden).abs().mean() > (on_cpu["eager"].double() - golden).abs().mean()


def test_a_kernel_that_failed_in_every_cell_ends_the_run_with_exit_1(capsys, monkeypatch):
    """A kernel that refuses one cell is recorded with its error; one that ran in no cell is a failed
    measurement: its line after the report, exit 1, and the other kernels' rows and summary kept."""
    gpu_kernels = load_script("gpu_kernels")
    found = gpu_kernels.kernels

    class Broken:  # a real kernel that will not run on this machine
        def describe(self):
            return {"backend": "broken"}

        def __call__(self, q, k, v, causal):
            raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.\nsecond line")

    monkeypatch.setattr(gpu_kernels, "kernels", lambda device, dtype: found(device, dtype) | {"broken": Broken()})
    args = ["--device", "cpu", "--dtypes", "bf16", "--n", "40", "--dims", "16", "--seeds", "0", "1", "--heads", "1",
            "--causal", "0"]
    assert gpu_kernels.main(args) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["complete"] is True
    assert [(r["kernel"], r.get("error")) for r in report["rows"]] == [
        ("sdpa_flash", None), ("broken", "FlashAttention only supports Ampere GPUs or newer.")] * 2
    assert [s["kernel"] for s in report["summary"]] == ["sdpa_flash"]
    assert captured.err.splitlines()[-1] == ("gpu_kernels: error: broken failed in all 2 of its runs "
                                             "(the first: FlashAttention only supports Ampere GPUs or newer.)")



# -- --samples and --from-samples: the kernels' outputs kept for the CPU side ------------------------------------
@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    folder = tmp_path_factory.mktemp("samples")
    script = load_script("gpu_kernels")
    args = ["--device", "cpu", "--n", "200", "520", "--dims", "64", "--seeds", "0", "1", "--heads", "2",
            "--compare-heads", "1", "--samples", str(folder / "s.safetensors"), "--sample-rows", "64",
            "--out", str(folder / "k.json")]
    assert script.main(args) == 0
    return script, folder / "s.safetensors", json.loads((folder / "k.json").read_text())


def test_samples_keep_the_kernels_outputs_and_the_cpu_side_reproduces_the_calls_shares(samples):
    script, path, report = samples
    meta, tensors = script.read_samples(path)
    assert len(meta["cells"]) == 2 * 2 * 2  # dtypes x causal x N, seed 0 only, one kernel
    assert {c["seed"] for c in meta["cells"]} == {0} and meta["grid"]["sms"] == script.cuda_kernel.SM90_SMS
    kernel = script.build_backend("sdpa_flash")
    for i, cell in enumerate(meta["cells"]):
        rows = tensors[f"{i}.rows"]
        assert rows[0] == 0 and rows[-1] == cell["n"] - 1 and len(rows) == min(64, cell["n"]) and cell["lse"]
        # the kept rows are PyTorch's kernel's output on the inputs regenerated from the seed, bit for bit
        q, k, v = (t[:1, :1] for t in script.inputs(cell["dtype"], 2, 2, cell["n"], 64, 0))
        out = kernel(q, k, v, causal=cell["causal"])[0, 0, rows]
        assert torch.equal(out.view(torch.int16), tensors[f"{i}.out"].view(torch.int16))
    again = script.from_samples(path)
    in_call = {(r["dtype"], r["causal"], r["n"]): r for r in report["rows"] if r["seed"] == 0}
    for row in again["rows"]:
        call_row = in_call[(row["dtype"], row["causal"], row["n"])]
        for preset, entry in row["emulators"].items():
            # same machine, same code: the call's sampled shares, bit for bit
            assert entry["sampled_bit_identical_fraction"] == entry["at_call"] == call_row["emulators"][preset]["sampled_bit_identical_fraction"]
        assert row["emulators"]["cpu_sdpa"]["sampled_bit_identical_fraction"] == 1.0  # the CPU kernel's model
        assert row["emulators"]["fa2"]["sampled_bit_identical_fraction"] < 1.0  # a preset that does not model it
        assert 0 <= row["emulators"]["fa2_cuda"]["lse_within_2ulp_fraction"] <= 1
    for entry in again["summary"]:
        assert entry["cells"] == 2 and entry["presets"]["cpu_sdpa"]["sampled_bit_identical_mean"] == 1.0
        fa2 = entry["presets"]["fa2"]
        assert fa2["at_call_mean"] == fa2["sampled_bit_identical_mean"] and fa2["worst_cell"] <= fa2["sampled_bit_identical_mean"]


def test_an_output_changed_in_one_bit_is_found(samples, tmp_path):
    """The positive control: the comparison can fail. One value moved by one bf16 ulp in one cell."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    script, path, _ = samples
    with safe_open(path, "pt") as handle:
        tensors, metadata = {key: handle.get_tensor(key) for key in handle.keys()}, handle.metadata()
    out = tensors["0.out"].clone()
    out.view(torch.int16)[0, 0] += 1
    tensors["0.out"] = out
    save_file(tensors, tmp_path / "edited.safetensors", metadata=metadata)
    rows = script.from_samples(tmp_path / "edited.safetensors")["rows"]
    assert rows[0]["emulators"]["cpu_sdpa"]["sampled_bit_identical_fraction"] == 1 - 1 / out.numel()
    assert rows[0]["emulators"]["cpu_sdpa"]["at_call"] == 1.0
    assert all(r["emulators"]["cpu_sdpa"]["sampled_bit_identical_fraction"] == 1.0 for r in rows[1:])


def _edited(samples, tmp_path, edit) -> Path:
    from safetensors import safe_open
    from safetensors.torch import save_file

    _, path, _ = samples
    with safe_open(path, "pt") as handle:
        tensors, meta = {key: handle.get_tensor(key) for key in handle.keys()}, json.loads(handle.metadata()["numdev"])
    edit(tensors, meta)
    save_file(tensors, tmp_path / "forged.safetensors", metadata={"numdev": json.dumps(meta)})
    return tmp_path / "forged.safetensors"


FORGED = {
    "inputs hash": (lambda t, m: m["cells"][1].update(inputs_sha256="0" * 64), "cell 1: the inputs regenerated here from seed 0 differ"),
    "a tensor gone": (lambda t, m: t.pop("2.out"), "cell 2 (sdpa_flash, bf16, d=64, N=200): its tensors are missing"),
    "lse said, not kept": (lambda t, m: t.pop("0.lse"), "cell 0 (sdpa_flash, bf16, d=64, N=200): its tensors are missing"),
    "out of another shape": (lambda t, m: t.update({"0.out": t["0.out"][:, :16].contiguous()}), "shapes or types do not match"),
    "rows past N": (lambda t, m: t["0.rows"].add_(1), "shapes or types do not match"),
    "another dtype": (lambda t, m: m["cells"][0].update(dtype="fp8"), "dtype, d or N out of range"),
    "format 2": (lambda t, m: m.update(format=2), "samples format 2, not 1"),
    "grid edited": (lambda t, m: m["grid"].update(compare_heads=0), "its grid (device, batch, heads, compare_heads) was edited"),
    "a field gone": (lambda t, m: m["cells"][3].pop("kernel"), "field 'kernel' is missing"),
    "N of ten million": (lambda t, m: (m["cells"][0].update(n=10**7, lse=False), t.pop("0.lse")), "GiB available: compare it on a larger machine"),
    "no cells": (lambda t, m: (m.update(cells=[]), t.clear()), "it holds no cells"),
    "a share NaN": (lambda t, m: m["cells"][0]["sampled_bit_identical_at_call"].update(fa2=float("nan")), "not a finite number"),
}


@pytest.mark.parametrize("case", FORGED)
def test_an_edited_samples_file_is_one_line_naming_it(case, samples, tmp_path, capsys):
    edit, says = FORGED[case]
    forged = _edited(samples, tmp_path, edit)
    with pytest.raises(SystemExit) as exit_:
        samples[0].main(["--from-samples", str(forged)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and str(forged) in err and says in err, err


@pytest.mark.parametrize("content", [b"", b"not a safetensors file", None, "truncated", "no metadata", "a directory"])
def test_a_file_that_is_no_samples_file_is_one_line(content, samples, tmp_path, capsys):
    from safetensors.torch import save_file

    path = tmp_path / "bad.safetensors"
    if content == "truncated":
        path.write_bytes(samples[1].read_bytes()[: samples[1].stat().st_size // 2])
    elif content == "no metadata":
        save_file({"0.out": torch.zeros(2)}, path)
    elif content == "a directory":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(SystemExit) as exit_:
        samples[0].main(["--from-samples", str(path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and str(path) in err, err


@pytest.mark.parametrize("args, says", [
    (["--seeds", "0", "--samples", "{tmp}/s.safetensors", "--sample-seeds", "3"], "--sample-seeds 3: each must be one of --seeds"),
    (["--samples", "{tmp}/s.safetensors", "--from-samples", "{tmp}/s.safetensors"], "give one of them"),
    (["--from-samples", "{tmp}/s.safetensors", "--dims", "64"], "the grid the samples file holds: --dims would not be read"),
    (["--from-samples", "{tmp}/s.safetensors", "--n", "512", "--seeds", "1", "--workers", "3"], ": --n --seeds --workers would"),
    (["--from-samples", "{tmp}/s.safetensors", "--sample-rows", "7"], ": --sample-rows would not be read"),
    (["--samples", "{tmp}"], "--samples"),
    (["--sample-rows", "0"], "argument --sample-rows"),
    (["--samples", "{tmp}/same", "--out", "{tmp}/./same"], "--out and --samples both name {tmp}/same: one would overwrite the other"),
])
def test_bad_sample_arguments_are_one_line(args, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        load_script("gpu_kernels").main(["--device", "cpu", *(a.format(tmp=tmp_path) for a in args)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and says.format(tmp=tmp_path) in err, err


def test_the_inputs_regenerate_alike_under_avx2_and_avx512_dispatch():
    """--from-samples regenerates the call's inputs from their seeds on another machine: torch.randn's CPU values
    must not depend on whether torch dispatches to AVX2 or AVX512 (they do change under DEFAULT, which no x86-64
    machine numdev runs on uses: the samples' hash catches it)."""
    code = ("import sys; sys.path.insert(0, 'tests'); from helpers import load_script; import torch; g = load_script('gpu_kernels'); "
            "print(torch.backends.cpu.get_cpu_capability(), "
            "g.inputs_sha256(*(t[:1, :1] for t in g.inputs('bf16', 2, 8, 1000, 128, 3))))")
    found = {}
    for capability in ("avx2", None):
        env = {key: value for key, value in os.environ.items() if key != "ATEN_CPU_CAPABILITY"}
        if capability:
            env["ATEN_CPU_CAPABILITY"] = capability
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        dispatched, digest = done.stdout.split()
        found[dispatched] = digest
    assert "AVX2" in found and len(set(found.values())) == 1, found
