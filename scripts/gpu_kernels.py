"""The emulator against real FlashAttention kernels, bit for bit, and each kernel's deviation from the
FP64 golden value beside Baseline's (the paper's Fig. 4 ratio, measured with the kernels themselves).
Prints JSON.

    python scripts/gpu_kernels.py --out $OUT/gpu_kernels.json             # on a GPU: every kernel found
    python scripts/gpu_kernels.py --dtypes bf16 --n 512 4096 16384        # a part of the grid
    python scripts/gpu_kernels.py --device cpu --n 256 1000 --dims 64     # here: PyTorch's CPU flash kernel
    python scripts/gpu_kernels.py --device cpu --n 1024 2048 --workers 2  # the comparison in 2 processes
    python scripts/gpu_kernels.py --samples $OUT/s.safetensors ...        # also keep the kernels' outputs at sampled rows
    python scripts/gpu_kernels.py --from-samples s.safetensors            # here, later: the presets as they are now against them

Kernels: on CUDA, `sdpa_flash` (PyTorch's SDPA FLASH_ATTENTION: FlashAttention-2's code compiled
into torch), `sdpa_cudnn` when it runs, and every FlashAttention kernel `flash_attn` finds (fa2, fa3,
fa4, fa3_fwd: numdev.attention.flash_attn_backend); on CPU, `sdpa_flash` (PyTorch's CPU kernel).

Per dtype, head dim, causal or not, sequence length N and seed: inputs N(0,1) in (batch, heads, N,
d), each kernel run on the whole batch (a kernel's schedule, e.g. FA2's split-KV, depends on
batch x heads x N), then the first --compare-heads heads of batch 0 compared on the CPU with
  - the emulator (FlashEmulated) in each preset that models the kernel: `fa2` (scores, statistics
    and accumulator in FP32, P rounded before P.V, blocks first to last) with the kernel's tiles
    (TILES); for SDPA flash and flash_attn[fa2] also `fa2_cuda` (numdev.attention.cuda_kernel: the
    CUDA kernel's order and arithmetic, its tiles and split-KV count from cuda_kernel.schedule for this
    GPU's SMs and the whole batch) and, up to --mma-max-n and --mma-rz-max-n, `fa2_cuda_mma16` and
    `fa2_cuda_mma16_rz` (two hypotheses of the tensor cores' sums: numdev.attention.cuda_kernel),
    each also against SDPA flash's log-sum-exp (softmax_lse, float32: the model's statistics m and l,
    which the 16-bit output mostly hides; its share within 2 ulp, since the GPU's log is __logf);
    on CPU `cpu_sdpa` (numdev's model of PyTorch's CPU kernel), `fa2` and the `fa2_cuda` models (for an
    H100's 132 SMs: the CUDA model against the CPU kernel, the gap between the two kernels' arithmetic): the
    share of outputs bit-identical to the kernel, and mean |emulator - kernel| / mean |Baseline - kernel|
    (the paper Baseline's gap, for scale);
  - the FP64 golden value: max and mean |out - golden| of the kernel, the emulator presets and the
    two Baselines (paper: every stage in the run precision; eager: softmax in FP32, P rounded once).
The summary gives, per kernel, dtype, d, causal and N, the bit-identical share (mean and worst seed)
and the Fig. 4 ratio (kernel / paper Baseline, max |d|) as a ratio of means over seeds with its
spread by numdev.stats' rule (95% bootstrap from 5 seeds, else the range of the per-seed ratios).

Where the time goes: the kernels, the golden value and (on a GPU) the two Baselines run on the device
in a moment; the CPU comparison (the emulator presets, ~N^2: each record's compare_s, the report's
comparison_cpu_s) is the slow part. The main process makes each cell's inputs, runs every kernel, the
golden value and the Baselines, and hands the compared heads and the outputs to the comparison:
  - --workers 1: in this process, one cell after another;
  - --workers W > 1: W processes ("spawn": forking after CUDA starts is unsafe), at most 2W cells in
    flight (the inputs of the whole grid are never held at once).
The default is the CPUs less one on cuda (the main process keeps one for the kernels) and 1 on cpu
(the CPU kernel uses every core itself), lowered where the memory left would not hold that many
comparisons at the largest N (~24 bytes per score: ~6.5 GB per worker at N=16384 with one compared
head; the grid records the workers used). The comparison always runs on one torch thread, in this
process as in a worker: torch's float64 reductions (the metrics' means and stds) change in their
last bits with the thread count, and with one thread the rows are bit for bit the same for any W.
Rows are reported in the grid's order (dtype, dim, causal, N, seed, kernel) whatever order the
workers finish in. With --out the file is rewritten (atomically) after every finished cell with
"complete": false, so a run stopped by `timeout` keeps what it measured; a SIGTERM or Ctrl-C stops
the workers (a worker also dies with the main process if that is killed outright: PR_SET_PDEATHSIG)
and exits 143 (130) with one line; a worker that dies (out of memory) ends the run with one line, exit 1.
A kernel that refuses a cell is recorded with its error; one that failed in every cell ends the run,
after the report, with one line each and exit 1.

--samples FILE keeps what the CPU side needs to build a GPU preset of the emulator without another GPU
call: for the cells of --sample-seeds (default the first seed), each kernel's output at --sample-rows
query rows (spread evenly, the first and last among them) of the first compared head, SDPA flash's
log-sum-exp over every row, the cell's inputs' SHA-256 and each preset's share on those rows in the call
(`sampled_bit_identical_fraction` in the rows too); the file is rewritten as each cell's kernels have
run (a run stopped during a cell's comparison keeps its outputs, without its shares) and as each
cell's comparison finishes; about 1.7 MB per dtype for the GPU grid with two kernels.
--from-samples FILE regenerates each cell's inputs from its seed (refused in one line when they hash
differently: torch.randn's CPU values changed, with torch's version or the ISA it dispatches to, or
the file was edited), runs the presets as numdev builds them now, and reports each one's sampled share
beside the call's (`at_call`), SDPA flash's log-sum-exp against the CUDA model's over the first head,
and a summary per kernel, dtype, d and causal. Same machine, same code: the shares are the call's,
bit for bit (tests/test_gpu_kernels_script.py).
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import contextlib
import functools
import hashlib
import json
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import torch

from numdev.attention import (
    Baseline,
    FlashEmulated,
    available_backends,
    build_backend,
    cuda_kernel,
    flash_attn_backend,
    golden_attention,
)
from numdev.bench.metrics import deviation
from numdev.cli.errors import never_ran, one_line
from numdev.cli.script_args import ScriptParser, at_least, run_script
from numdev.cli.script_args import seed as seed_type
from numdev.cli.stop_signals import StopOnSignal, Stopped
from numdev.cli.workers import die_with_parent
from numdev.numerics.formats import float32_ulps
from numdev.numerics.stages import stage_formats
from numdev.runs.atomic import write_bytes, write_text
from numdev.runs.provenance import provenance
from numdev.runs.schemas import FINITE, FileSchema

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# (B_r, B_c) of each kernel on an H100 (../shared/gpu/README.md, from the kernels' sources):
# {head dim: (non-causal tile, causal tile)}.
FA2_TILES = {dim: (tile, tile) for dim, tile in cuda_kernel.FORWARD_TILES.items()}  # without split-KV
FA3_TILES = {64: ((192, 192), (192, 128)), 128: ((128, 176), (128, 128))}
TILES = {
    "sdpa_flash": FA2_TILES,
    "flash_attn[fa2]": FA2_TILES,
    "flash_attn[fa3]": FA3_TILES,
    "flash_attn[fa3_fwd]": FA3_TILES,
    "flash_attn[fa4]": {64: ((192, 128), (192, 128)), 128: ((128, 128), (128, 128))},
}


def kernels(device: str, dtype: torch.dtype) -> dict:
    """{label: backend} for the real kernels that run on `device` with `dtype`."""
    found = {"sdpa_flash": build_backend("sdpa_flash")}
    if device == "cuda":
        if "sdpa_cudnn" in available_backends("cuda", dtype):
            found["sdpa_cudnn"] = build_backend("sdpa_cudnn")
        found.update(flash_attn_backend.runnable("cuda", dtype))
    return found


def cuda_models(label: str, precision: str, dim: int, n: int, shape: dict, mma_max_n: dict) -> dict:
    """{preset label: FlashEmulated} of the FA2 CUDA model for kernel `label` (FA2's own kernels only):
    torch's build (FMUL+FADD) for SDPA flash, flash-attn's FFMA for flash_attn[fa2]."""
    exp = {"sdpa_flash": "exp2", "flash_attn[fa2]": "exp2_ffma"}.get(label)
    if exp is None or dim not in cuda_kernel.FORWARD_TILES:
        return {}
    block_r, block_c, splits = cuda_kernel.schedule(shape["batch"], shape["heads"], n, n, dim, shape["sms"])
    model = {"block_r": block_r, "block_c": block_c, "tile_rule": "explicit", "kv_splits": splits}
    found = {"fa2_cuda": FlashEmulated(stage_formats("fa2_cuda", precision, exp=exp), **model)}
    for matmul, largest in mma_max_n.items():  # the tensor-core hypotheses, where their cost allows
        if n <= largest:
            found[f"fa2_cuda_{matmul}"] = FlashEmulated(stage_formats("fa2_cuda", precision, exp=exp, matmul=matmul), **model)
    return found


def emulators(label: str, device: str, precision: str, dim: int, causal: bool, n: int, shape: dict,
              mma_max_n: dict | None = None) -> dict:
    """{preset label: FlashEmulated} that model kernel `label` (none for a kernel without a tile model);
    shape: the kernel call's batch and heads and the GPU's SMs (the FA2 CUDA model's schedule)."""
    if device == "cpu":
        return {"cpu_sdpa": FlashEmulated(stage_formats("cpu_sdpa", precision), tile_rule="cpu_sdpa"),
                "fa2": FlashEmulated(stage_formats("fa2", precision), tile_rule="cpu_sdpa"),
                **cuda_models("sdpa_flash", precision, dim, n, shape, mma_max_n or {})}
    tiles = TILES.get(label, {}).get(dim)
    if tiles is None:
        return {}
    block_r, block_c = tiles[causal]
    return {"fa2": FlashEmulated(stage_formats("fa2", precision), block_r=block_r, block_c=block_c, tile_rule="explicit"),
            **cuda_models(label, precision, dim, n, shape, mma_max_n or {})}


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.view(torch.int16) == b.view(torch.int16)).double().mean())


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in float32 units in the last place (int64; signed zeros 0 apart)."""
    return float32_ulps(a, b).abs()


def kernel_lse(device: str, q, k, v, causal: bool):
    """SDPA flash's log-sum-exp (softmax_lse, float32 (B, H, N)) and output, through the op SDPA dispatches to."""
    if device == "cuda":
        found = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
    else:
        found = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return found[0], found[1]


def inputs(precision: str, batch: int, heads: int, n: int, dim: int, seed: int) -> tuple:
    """A cell's q, k, v: N(0, 1) in (batch, heads, N, d) from torch's CPU generator seeded `seed`, in `precision`."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, heads, n, dim, generator=g).to(DTYPES[precision]) for _ in range(3))


def inputs_sha256(q, k, v) -> str:
    """The compared heads' inputs, hashed: --from-samples checks that it regenerates the GPU's inputs bit for bit."""
    digest = hashlib.sha256()
    for t in (q, k, v):
        digest.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def sample_rows(n: int, count: int) -> torch.Tensor:
    """`count` query rows spread evenly over 0..n-1, the first and last among them (all when n <= count)."""
    return torch.linspace(0, n - 1, min(count, n)).round().long().unique()


def prepare(device, precision, dim, causal, n, seed, args, real: dict) -> dict:
    """One cell's device work, in the main process: the inputs, every kernel of `real` ({label:
    backend}) on the whole batch and the golden value of the compared heads; what `compare` needs, on
    the CPU."""
    q, k, v = inputs(precision, args.batch, args.heads, n, dim, seed)
    part = (slice(0, 1), slice(0, args.compare_heads))
    cq, ck, cv = (t[part].contiguous() for t in (q, k, v))
    golden = golden_attention(*(t.to(device) for t in (cq, ck, cv)), causal=causal).cpu()
    baselines, baselines_s, baselines_device = paper_and_eager_baselines(device, precision, cq, ck, cv, causal)
    ran = []
    for label, backend in real.items():
        start = time.perf_counter()
        try:
            with torch.no_grad():
                out = backend(*(t.to(device) for t in (q, k, v)), causal=causal)
        except Exception as error:  # a kernel that refuses this shape: recorded, the sweep goes on
            ran.append({"kernel": label, "error": str(error).splitlines()[0][:300]})
            continue
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        ran.append({"kernel": label, "describe": backend.describe(), "first_call_s": round(seconds, 4),
                    "out": out[part].contiguous().cpu()})
        if label == "sdpa_flash":  # its log-sum-exp: the FA2 model's statistics, finer than the 16-bit output shows
            with torch.no_grad():
                again, lse = kernel_lse(device, *(t.to(device) for t in (q, k, v)), causal)
            ran[-1].update(lse=lse[part].contiguous().cpu(), lse_call_same_output=bool(torch.equal(again.view(torch.int16).cpu(), out.view(torch.int16).cpu())))
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else cuda_kernel.SM90_SMS
    sampled = getattr(args, "samples", None) and seed in args.sample_seeds
    return {"device": device, "precision": precision, "dim": dim, "causal": causal,
            "sample_rows": sample_rows(n, args.sample_rows) if sampled else None,
            "shape": {"batch": args.batch, "heads": args.heads, "sms": sms},
            "mma_max_n": {"mma16": args.mma_max_n, "mma16_rz": args.mma_rz_max_n},
            "q": cq, "k": ck, "v": cv, "golden": golden, "kernels": ran,
            "baselines": baselines, "baselines_s": baselines_s, "baselines_device": baselines_device}


def paper_and_eager_baselines(device: str, precision: str, cq, ck, cv, causal: bool) -> tuple[dict, float, str]:
    """The paper and eager Baselines of the compared heads ({name: output on the CPU}), their seconds and
    the device they ran on. On the GPU beside the kernels: at N = 16k they were two thirds of a cell's CPU
    comparison. Their float32 GEMMs and sums then run in the GPU's order, so a value may differ from the
    CPU's in its last bits: the Baselines are compared through statistics (max |d|, mean gaps), never bit
    for bit. On the CPU on one thread, as in a worker (the rows do not depend on --workers); a GPU that
    refuses them leaves them to the CPU."""
    def run(where: str) -> dict:
        inputs = [t.to(where) for t in (cq, ck, cv)]
        with torch.no_grad():
            found = {name: Baseline(stage_formats(name, precision))(*inputs, causal=causal) for name in ("paper", "eager")}
        if where == "cuda":
            torch.cuda.synchronize()
        return {name: out.cpu() for name, out in found.items()}

    started = time.perf_counter()
    if device == "cuda":
        try:
            return run("cuda"), round(time.perf_counter() - started, 6), "cuda"
        except Exception as error:  # out of memory, an op the GPU refuses: the CPU computes them, and says so
            print(f"gpu_kernels: the Baselines on the CPU: on the GPU {one_line(error)}", file=sys.stderr, flush=True)
            started = time.perf_counter()
    with one_thread():
        return run("cpu"), round(time.perf_counter() - started, 6), "cpu"


@contextlib.contextmanager
def one_thread():
    """torch on one thread inside (as in a worker), as it was after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def compare(job: dict) -> list[dict]:
    """One record per kernel of a prepared cell: the CPU comparison, on one thread (module docstring)."""
    with one_thread(), torch.no_grad():
        return _compare(job)


def _compare(job: dict) -> list[dict]:
    device, precision, dim, causal = job["device"], job["precision"], job["dim"], job["causal"]
    cq, ck, cv, golden = job["q"], job["k"], job["v"], job["golden"]
    baselines = job["baselines"]
    base_dev = {name: deviation(out, golden) for name, out in baselines.items()}
    records = []
    for ran in job["kernels"]:
        if "error" in ran:
            records.append(ran)
            continue
        label, out = ran["kernel"], ran["out"]
        started = time.perf_counter()
        record = {"kernel": label, "describe": ran["describe"], "first_call_s": ran["first_call_s"],
                  "vs_golden": deviation(out, golden),
                  "baselines_vs_golden": base_dev,
                  "paper_baseline_vs_kernel_mean_abs": float((baselines["paper"].double() - out.double()).abs().mean()),
                  "emulators": {}}
        for preset, emulator in emulators(label, device, precision, dim, causal, cq.shape[2], job["shape"],
                                          job["mma_max_n"]).items():
            emulated = emulator(cq, ck, cv, causal=causal)
            gap = float((emulated.double() - out.double()).abs().mean())
            lse = {}
            if emulator.formats.cuda_model and "lse" in ran:
                ulps = ulp_distance(emulator.last_lse, ran["lse"])
                lse = {"lse_bit_identical_fraction": float((ulps == 0).double().mean()),
                       "lse_within_2ulp_fraction": float((ulps <= 2).double().mean()), "lse_max_ulp": int(ulps.max()),
                       "lse_max_abs": float((emulator.last_lse.double() - ran["lse"].double()).abs().max()),
                       "lse_call_same_output": ran["lse_call_same_output"]}
            rows = job.get("sample_rows")
            record["emulators"][preset] = {
                **({"kv_splits": emulator.kv_splits, "tiles": [emulator.block_r, emulator.block_c], **lse}
                   if emulator.formats.cuda_model else {}),
                **({"sampled_bit_identical_fraction": bits_equal(emulated[0, 0, rows], out[0, 0, rows])} if rows is not None else {}),
                "bit_identical_fraction": bits_equal(emulated, out),
                "vs_kernel_mean_abs": gap,
                "vs_kernel_relative_to_paper_baseline": gap / record["paper_baseline_vs_kernel_mean_abs"]
                if record["paper_baseline_vs_kernel_mean_abs"] > 0 else None,
                "vs_golden": deviation(emulated, golden),
            }
        # this kernel's emulators' CPU seconds on one thread; the cell's Baselines' seconds (once per cell) and device
        record.update(compare_s=round(time.perf_counter() - started, 6), baselines_s=job["baselines_s"],
                      baselines_device=job["baselines_device"])
        records.append(record)
    return records


def cell(device, precision, dim, causal, n, seed, args, real: dict) -> list[dict]:
    """One record per kernel of `real` ({label: backend}) for one input."""
    return compare(prepare(device, precision, dim, causal, n, seed, args, real))


# -- the comparison in worker processes -----------------------------------------------------------------
# A job crosses to a worker as plain bytes (each tensor's raw bits, its dtype and shape): torch's own
# pickling would share storage through file descriptors and a resource sharer thread.
def _pack(value):
    if isinstance(value, torch.Tensor):
        t = value.contiguous()
        return ("tensor", str(t.dtype).removeprefix("torch."), tuple(t.shape), t.view(-1).view(torch.uint8).numpy().tobytes())
    if isinstance(value, dict):
        return {key: _pack(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_pack(item) for item in value]
    return value


def _unpack(value):
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "tensor":
        _, dtype, shape, data = value
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(getattr(torch, dtype)).reshape(shape)
    if isinstance(value, dict):
        return {key: _unpack(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unpack(item) for item in value]
    return value


def compare_packed(packed: dict) -> list[dict]:
    return compare(_unpack(packed))


def _worker_start(parent: int) -> None:
    """A worker's initializer: one torch thread; Ctrl-C (sent to the whole terminal group) left to the
    main process, which stops the workers; killed with the main process however that dies."""
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:  # the main process died before the line above
        os._exit(1)


def start_pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_start, initargs=(os.getpid(),))


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and end the workers now (shutdown alone waits for running cells)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # shutdown forgets them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join(5)


BYTES_PER_SCORE = 28  # a worker's peak at N=4096 and 8192 (bf16, d=128): ~22-24 bytes per score, plus a margin
WORKER_BASE_BYTES = 0.7e9  # a worker's torch and numdev


def comparison_bytes(compare_heads: int, n: int) -> int:
    """The memory one cell's CPU comparison takes at its peak (the emulators' scores), in bytes."""
    return BYTES_PER_SCORE * compare_heads * n ** 2


def memory_available() -> int | None:
    """The bytes of memory available now (MemAvailable), or None where unknown (no /proc/meminfo)."""
    try:
        with open("/proc/meminfo") as handle:
            return next(int(line.split()[1]) * 1024 for line in handle if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def memory_workers(args, available: float | None = None) -> int | None:
    """How many comparisons at the grid's largest N fit in 3/4 of `available` bytes (default: the
    memory available now; None where unknown, without /proc/meminfo)."""
    available = memory_available() if available is None else available
    if available is None:
        return None
    per_worker = WORKER_BASE_BYTES + comparison_bytes(args.compare_heads, max(args.n))
    return max(1, int(0.75 * available // per_worker))


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def comparison_cpu_s(cells: dict[int, list[dict]]) -> float:
    """The CPU comparison's cost in one-thread seconds: each kernel's emulators, and each cell's Baselines
    once where they ran on the CPU."""
    total = 0.0
    for rows in cells.values():
        timed = [row for row in rows if "compare_s" in row]
        total += sum(row["compare_s"] for row in timed)
        if timed and timed[0]["baselines_device"] == "cpu":
            total += timed[0]["baselines_s"]
    return total


def summarise(rows: list[dict]) -> list[dict]:
    from numdev.stats.intervals import ratio_interval  # scipy.stats: the main process's alone, not each worker's import

    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if "error" not in row:
            groups.setdefault((row["kernel"], row["dtype"], row["dim"], row["causal"], row["n"]), []).append(row)
    summary = []
    for (label, precision, dim, causal, n), group in sorted(groups.items()):
        entry = {"kernel": label, "dtype": precision, "dim": dim, "causal": causal, "n": n, "seeds": len(group)}
        for metric in ("max_abs", "mean_abs"):
            kernel = [r["vs_golden"][metric] for r in group]
            paper = [r["baselines_vs_golden"]["paper"][metric] for r in group]
            entry[f"fig4_ratio_{metric}"] = ratio_interval(kernel, paper).as_dict()
        for preset in group[0]["emulators"]:
            shares = [r["emulators"][preset]["bit_identical_fraction"] for r in group]
            gaps = [r["emulators"][preset]["vs_kernel_relative_to_paper_baseline"] for r in group]
            emulated = [r["emulators"][preset]["vs_golden"]["max_abs"] for r in group]
            paper = [r["baselines_vs_golden"]["paper"]["max_abs"] for r in group]
            lse = [r["emulators"][preset]["lse_within_2ulp_fraction"] for r in group
                   if "lse_within_2ulp_fraction" in r["emulators"][preset]]
            entry[f"emulator[{preset}]"] = {
                **({"lse_within_2ulp_mean": sum(lse) / len(lse),
                    "lse_max_ulp": max(r["emulators"][preset]["lse_max_ulp"] for r in group)} if lse else {}),
                "bit_identical_mean": sum(shares) / len(shares), "bit_identical_worst_seed": min(shares),
                "gap_relative_to_paper_baseline_mean": sum(g for g in gaps if g is not None) / max(1, sum(g is not None for g in gaps)),
                "fig4_ratio_max_abs": ratio_interval(emulated, paper).as_dict(),
            }
        summary.append(entry)
    return summary


# -- the kernels' outputs kept for the CPU side (--samples) and compared there again (--from-samples) -----
# The GPU preset of the emulator is built on the CPU from what the kernels did, and a GPU is lent for
# minutes: --samples keeps, for the seeds of --sample-seeds, each kernel's output at --sample-rows query
# rows of the first compared head (and SDPA flash's log-sum-exp over every row), with each cell's
# inputs' SHA-256 (they are regenerated from the seed) and the sampled share each preset had in the call.
# --from-samples compares the emulator presets, as numdev now builds them, with those outputs on the
# CPU: edit the model (numdev.attention.cuda_kernel, numdev.numerics.stages) and see the share move.
SAMPLES_FORMAT = 1


def take_samples(job: dict) -> dict:
    """A prepared cell's samples: its rows, its inputs' hash and each kernel's output there (and log-sum-exp)."""
    rows = job["sample_rows"]
    kept = {}
    for ran in job["kernels"]:
        if "error" not in ran:
            kept[ran["kernel"]] = {"describe": ran["describe"], "out": ran["out"][0, 0, rows].contiguous(),
                                   **({"lse": ran["lse"][0, 0].contiguous()} if "lse" in ran else {})}
    return {"rows": rows, "inputs_sha256": inputs_sha256(job["q"], job["k"], job["v"]), "kernels": kept}


def write_samples(path, grid: dict, cells: list[tuple[tuple, dict, list[dict]]]) -> None:
    """The samples file (safetensors, atomically): `cells` are (grid key, take_samples' dict, the cell's records)."""
    from safetensors.torch import save

    tensors, entries = {}, []
    for (precision, dim, causal, n, seed), taken, records in cells:
        shares = {r["kernel"]: {preset: e["sampled_bit_identical_fraction"] for preset, e in r.get("emulators", {}).items()}
                  for r in records}
        for label, kept in taken["kernels"].items():
            i = len(entries)
            tensors[f"{i}.rows"], tensors[f"{i}.out"] = taken["rows"], kept["out"]
            if "lse" in kept:
                tensors[f"{i}.lse"] = kept["lse"]
            entries.append({"dtype": precision, "dim": dim, "causal": causal, "n": n, "seed": seed, "kernel": label,
                            "describe": kept["describe"], "inputs_sha256": taken["inputs_sha256"], "lse": "lse" in kept,
                            "sampled_bit_identical_at_call": shares.get(label, {})})
    meta = {"what": "real kernels' outputs at sampled query rows (scripts/gpu_kernels.py --samples)",
            "format": SAMPLES_FORMAT, "grid": grid, "provenance": provenance(), "cells": entries}
    write_bytes(path, save(tensors, metadata={"numdev": json.dumps(meta)}))


SAMPLES_CELL = FileSchema("samples file's cell", required={
    "dtype": str, "dim": int, "causal": bool, "n": int, "seed": int, "kernel": str, "describe": (str, dict),
    "inputs_sha256": str, "lse": bool, "sampled_bit_identical_at_call": dict},
    each={"sampled_bit_identical_at_call": FINITE})
SAMPLES_META = FileSchema("samples file", required={
    "format": int, "cells": list, "provenance": dict,
    "grid": FileSchema("samples file's grid", required={
        "device": str, "batch": int, "heads": int, "compare_heads": int, "sms": int, "mma_max_n": dict})},
    items={"cells": SAMPLES_CELL})


def read_samples(path) -> tuple[dict, dict]:
    """(metadata, tensors) of a samples file, checked: a file that is not one, or whose cells do not match
    their tensors, is a ValueError of one line naming it."""
    from safetensors import SafetensorError, safe_open

    if Path(path).exists() and not Path(path).is_file():
        raise ValueError(f"{path}: a directory or device, not a samples file; give a file that gpu_kernels.py --samples wrote")
    try:
        with safe_open(path, "pt") as handle:
            meta = json.loads((handle.metadata() or {}).get("numdev", "null"))
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file; give a file that gpu_kernels.py --samples wrote") from None
    except (OSError, SafetensorError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a samples file as gpu_kernels.py --samples writes it ({one_line(error)})") from None
    SAMPLES_META.check(path, meta)
    if meta["format"] != SAMPLES_FORMAT:
        raise ValueError(f"{path}: samples format {meta['format']}, not {SAMPLES_FORMAT}: written by another numdev")
    grid = meta["grid"]
    if grid["device"] not in ("cuda", "cpu") or not 1 <= grid["compare_heads"] <= grid["heads"] or grid["batch"] < 1:
        raise ValueError(f"{path}: its grid (device, batch, heads, compare_heads) was edited: {grid}")
    if not meta["cells"]:
        raise ValueError(f"{path}: it holds no cells (a call stopped before its first cell finished): nothing to compare")
    for i, cell in enumerate(meta["cells"]):
        where = f"{path}: cell {i} ({cell['kernel']}, {cell['dtype']}, d={cell['dim']}, N={cell['n']})"
        rows, out = tensors.get(f"{i}.rows"), tensors.get(f"{i}.out")
        lse = tensors.get(f"{i}.lse")
        if cell["dtype"] not in DTYPES or cell["dim"] < 1 or cell["n"] < 1:
            raise ValueError(f"{where}: dtype, d or N out of range: the file was edited")
        if rows is None or out is None or (lse is None) == cell["lse"]:
            raise ValueError(f"{where}: its tensors are missing: the file was edited or truncated")
        if (rows.dtype != torch.int64 or rows.dim() != 1 or len(rows) == 0 or int(rows.min()) < 0
                or int(rows.max()) >= cell["n"] or out.dtype != DTYPES[cell["dtype"]] or tuple(out.shape) != (len(rows), cell["dim"])
                or (lse is not None and (lse.dtype != torch.float32 or tuple(lse.shape) != (cell["n"],)))):
            raise ValueError(f"{where}: its tensors' shapes or types do not match the cell: the file was edited")
    return meta, tensors


def from_samples(path) -> dict:
    """The emulator presets as numdev builds them now against the kernels' sampled outputs, on the CPU on one thread."""
    meta, tensors = read_samples(path)
    grid = meta["grid"]
    shape = {"batch": grid["batch"], "heads": grid["heads"], "sms": grid["sms"]}
    rows_out, started = [], time.perf_counter()
    @functools.lru_cache(maxsize=1)  # a cell's kernels are consecutive: its inputs are made once
    def made(precision: str, n: int, dim: int, seed: int) -> tuple:
        q, k, v = inputs(precision, grid["batch"], grid["heads"], n, dim, seed)
        return tuple(t[:1, :grid["compare_heads"]].contiguous() for t in (q, k, v))

    def compared(cell: dict) -> tuple:
        return made(cell["dtype"], cell["n"], cell["dim"], cell["seed"])

    available = memory_available()
    for i, cell in enumerate(meta["cells"]):  # what a cell needs here: its inputs and one comparison (memory_workers)
        need = 3 * 6 * grid["batch"] * grid["heads"] * cell["n"] * cell["dim"] + comparison_bytes(grid["compare_heads"], cell["n"])
        if available is not None and need > 0.75 * available:
            raise ValueError(f"{path}: cell {i} (N={cell['n']}, d={cell['dim']}, batch {grid['batch']} x {grid['heads']} heads) "
                             f"needs ~{need / 2**30:.1f} GiB here, more than 3/4 of the {available / 2**30:.1f} GiB available: "
                             "compare it on a larger machine (or the file was edited)")
    for i, cell in enumerate(meta["cells"]):  # every cell's inputs checked before the minutes of comparison
        if inputs_sha256(*compared(cell)) != cell["inputs_sha256"]:
            machine, versions = (meta["provenance"].get(key) if isinstance(meta["provenance"].get(key), dict) else {}
                                 for key in ("machine", "versions"))
            raise ValueError(f"{path}: cell {i}: the inputs regenerated here from seed {cell['seed']} differ from the "
                             f"call's (torch {torch.__version__} on {torch.backends.cpu.get_cpu_capability()} here, "
                             f"{versions.get('torch')} on {machine.get('torch_cpu_capability')} "
                             "there; torch.randn's CPU values change with the ISA: ATEN_CPU_CAPABILITY=<theirs> may match), "
                             "or the file was edited; nothing can be compared bit for bit")
    with one_thread(), torch.no_grad():
        for i, cell in enumerate(meta["cells"]):
            cq, ck, cv = compared(cell)
            rows, kernel_out = tensors[f"{i}.rows"], tensors[f"{i}.out"]
            record = {key_: cell[key_] for key_ in ("dtype", "dim", "causal", "n", "seed", "kernel")} | {"rows": len(rows), "emulators": {}}
            for preset, emulator in emulators(cell["kernel"], grid["device"], cell["dtype"], cell["dim"], cell["causal"],
                                              cell["n"], shape, grid["mma_max_n"]).items():
                emulated = emulator(cq, ck, cv, causal=cell["causal"])[0, 0, rows]
                entry = {"sampled_bit_identical_fraction": bits_equal(emulated, kernel_out),
                         "at_call": cell["sampled_bit_identical_at_call"].get(preset),
                         "vs_kernel_mean_abs": float((emulated.double() - kernel_out.double()).abs().mean())}
                if emulator.formats.cuda_model and cell["lse"]:
                    ulps = ulp_distance(emulator.last_lse[0, 0], tensors[f"{i}.lse"])
                    entry.update(lse_bit_identical_fraction=float((ulps == 0).double().mean()),
                                 lse_within_2ulp_fraction=float((ulps <= 2).double().mean()), lse_max_ulp=int(ulps.max()))
                record["emulators"][preset] = entry
            rows_out.append(record)
            print(f"{cell['dtype']} d={cell['dim']} causal={int(cell['causal'])} N={cell['n']} seed {cell['seed']} {cell['kernel']}: "
                  f"{ {p: round(e['sampled_bit_identical_fraction'], 6) for p, e in record['emulators'].items()} }",
                  file=sys.stderr, flush=True)
    return {"what": "the emulator presets as numdev builds them now against real kernels' sampled outputs",
            "samples": str(path), "call": {"grid": grid, "provenance": meta["provenance"]},
            "provenance": provenance(threads=1), "seconds": round(time.perf_counter() - started, 1),
            "summary": sampled_summary(rows_out), "rows": rows_out}


def sampled_summary(rows: list[dict]) -> list[dict]:
    """Per kernel, dtype, d and causal: each preset's share of bit-identical sampled outputs over its cells
    (every N and seed, each cell's rows weighted alike), now and in the call."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["kernel"], row["dtype"], row["dim"], row["causal"]), []).append(row)
    summary = []
    for (label, precision, dim, causal), group in sorted(groups.items()):
        entry = {"kernel": label, "dtype": precision, "dim": dim, "causal": causal, "cells": len(group), "presets": {}}
        for preset in group[0]["emulators"]:
            now = [r["emulators"][preset]["sampled_bit_identical_fraction"] for r in group if preset in r["emulators"]]
            then = [r["emulators"][preset]["at_call"] for r in group if r["emulators"].get(preset, {}).get("at_call") is not None]
            entry["presets"][preset] = {"sampled_bit_identical_mean": sum(now) / len(now), "worst_cell": min(now),
                                        "at_call_mean": sum(then) / len(then) if then else None}
        summary.append(entry)
    return summary


# the options that choose what runs; --from-samples takes them from its file and refuses them here
GRID_OPTIONS = ("device", "dtypes", "dims", "causal", "n", "seeds", "batch", "heads", "compare_heads", "mma_max_n",
                "mma_rz_max_n", "workers", "memory_gib", "sample_seeds", "sample_rows")


def main(argv=None) -> int:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--dims", type=at_least(1), nargs="+", default=[64, 128])
    parser.add_argument("--causal", nargs="+", type=int, default=[0, 1], choices=[0, 1])
    parser.add_argument("--n", type=at_least(1), nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--seeds", type=seed_type, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--batch", type=at_least(1), default=2)
    parser.add_argument("--heads", type=at_least(1), default=8)
    parser.add_argument("--compare-heads", type=at_least(1), default=1, help="heads of batch 0 compared on the CPU")
    parser.add_argument("--mma-max-n", type=at_least(0), default=4096,
                        help="the largest N at which the fa2_cuda_mma16 model is compared too (0: never; it costs "
                             "2-4x fa2_cuda)")
    parser.add_argument("--mma-rz-max-n", type=at_least(0), default=1024,
                        help="the same for fa2_cuda_mma16_rz (it costs ~40-100x fa2_cuda: 2-4 s at N=1024 on one core)")
    parser.add_argument("--workers", type=at_least(1), default=None,
                        help="processes for the CPU comparison (default: CPUs - 1 on cuda, 1 on cpu; "
                             "fewer where the memory would not hold them; 1: in this process)")
    parser.add_argument("--memory-gib", type=at_least(1), default=None,
                        help="the machine's memory for the workers' cap (default: MemAvailable now; a lent GPU "
                             "machine's memory starts small and grows as it is used, so give its size there)")
    parser.add_argument("--out", default=None, help="also write the JSON here (atomically)")
    parser.add_argument("--samples", default=None,
                        help="also keep the kernels' outputs at sampled rows here (safetensors, rewritten after every cell) "
                             "for --from-samples on the CPU")
    parser.add_argument("--sample-seeds", type=seed_type, nargs="+", default=None,
                        help="the seeds whose cells --samples keeps (default: the first of --seeds)")
    parser.add_argument("--sample-rows", type=at_least(1), default=128, help="query rows kept per cell and kernel")
    parser.add_argument("--from-samples", default=None, metavar="FILE",
                        help="instead of running kernels: compare the emulator presets as numdev builds them now with the "
                             "outputs a --samples FILE kept (on the CPU, no GPU needed; the grid, batch, heads and "
                             "--mma-max-n are the file's: the grid options are refused); prints JSON (and --out)")
    args = parser.parse_args(argv)
    if args.from_samples:
        if args.samples:
            parser.error("--from-samples reads a samples file; --samples writes one: give one of them")
        ignored = [f"--{dest.replace('_', '-')}" for dest in GRID_OPTIONS if getattr(args, dest) != parser.get_default(dest)]
        if ignored:
            parser.error(f"--from-samples compares the grid the samples file holds: {' '.join(ignored)} would not be "
                         "read; drop it (run the cells you want with --samples on the GPU)")
        try:
            found = from_samples(args.from_samples)
        except ValueError as error:
            parser.exit(2, f"gpu_kernels: error: --from-samples {one_line(error)}\n")
        text = json.dumps(found, indent=1)
        if args.out:
            write_text(args.out, text + "\n")
        print(text)
        return 0
    args.sample_seeds = args.sample_seeds or args.seeds[:1]
    if args.samples and not set(args.sample_seeds) <= set(args.seeds):
        parser.error(f"--sample-seeds {' '.join(map(str, args.sample_seeds))}: each must be one of --seeds")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_kernels: error: --device cuda but no CUDA GPU here; use --device cpu for PyTorch's CPU kernel", file=sys.stderr)
        return 2
    if not 1 <= args.compare_heads <= args.heads:
        print(f"gpu_kernels: error: --compare-heads {args.compare_heads} must be 1..--heads ({args.heads})", file=sys.stderr)
        return 2
    requested = args.workers
    wanted = requested or (max(1, cpus() - 1) if args.device == "cuda" else 1)
    fit = memory_workers(args, None if args.memory_gib is None else args.memory_gib * 2**30)
    args.workers = min(wanted, fit) if fit else wanted
    if args.workers < wanted:
        print(f"gpu_kernels: {args.workers} workers, not {wanted}: the memory available holds {fit} comparisons "
              f"at N={max(args.n)}", file=sys.stderr, flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False  # the golden value and nothing else runs matmuls on the GPU
    started = time.perf_counter()
    real = {precision: kernels(args.device, DTYPES[precision]) for precision in args.dtypes}  # built once
    versions = {label: backend.describe() for found in real.values() for label, backend in found.items()}
    grid = [(precision, dim, causal, n, seed) for precision in args.dtypes for dim in args.dims
            for causal in map(bool, args.causal) for n in args.n for seed in args.seeds]
    finished: dict[int, list[dict]] = {}  # grid index: its rows

    def rows() -> list[dict]:
        return [row for index in sorted(finished) for row in finished[index]]

    def report(complete: bool) -> dict:
        done = rows()
        return {
            "what": "real FlashAttention kernels against numdev's emulator (bit for bit) and the FP64 golden value",
            "complete": complete,  # false: a partial file, written after each cell so a killed run keeps its rows
            "device": args.device,
            "grid": {key: value for key, value in vars(args).items() if key != "out"}
            | ({"workers_requested": requested} if requested not in (None, args.workers) else {}),
            "kernel_versions": versions,
            "tiles": {label: {str(d): t for d, t in tiles.items()} for label, tiles in TILES.items()},
            "provenance": provenance(seeds=args.seeds),
            "seconds": round(time.perf_counter() - started, 1),
            "comparison_cpu_s": round(comparison_cpu_s(finished), 1),
            "summary": summarise(done),
            "rows": done,
        }

    taken: dict[int, dict] = {}  # grid index: its samples (--samples)
    sample_grid: dict = {}

    def keep_samples() -> None:
        """Rewrite the samples file: every prepared cell's kernel outputs (a cell whose comparison a stop cut short
        keeps them too: its shares are recomputed here later), with the shares of those finished."""
        write_samples(args.samples, sample_grid, [(grid[i], taken[i], finished.get(i, [])) for i in sorted(taken)])

    def finish(index: int, records: list[dict]) -> None:
        precision, dim, causal, n, seed = grid[index]
        finished[index] = [{"dtype": precision, "dim": dim, "causal": causal, "n": n, "seed": seed, **r} for r in records]
        if index in taken:  # the call's shares on the kept rows, before the JSON: a cell the JSON holds has them here
            keep_samples()
        for row in finished[index]:
            shares = {p: round(e["bit_identical_fraction"], 6) for p, e in row.get("emulators", {}).items()}
            print(f"{precision} d={dim} causal={int(causal)} N={n} seed {seed} {row['kernel']}: "
                  f"{row.get('error') or shares}", file=sys.stderr, flush=True)
        if args.out:
            write_text(args.out, json.dumps(report(False), indent=1) + "\n")

    pool = start_pool(args.workers) if args.workers > 1 else None
    pending: dict = {}  # future: grid index

    def collect(block: bool) -> None:
        done = wait(pending, return_when=FIRST_COMPLETED)[0] if block else [f for f in pending if f.done()]
        for future in sorted(done, key=pending.get):
            finish(pending.pop(future), future.result())

    def kept() -> str:
        return f"; {len(finished)} of {len(grid)} cells finished, in {args.out} (complete: false)" if args.out and finished else ""

    with StopOnSignal():
        try:
            for index, (precision, dim, causal, n, seed) in enumerate(grid):
                job = prepare(args.device, precision, dim, causal, n, seed, args, real[precision])
                if job["sample_rows"] is not None:
                    taken[index] = take_samples(job)
                    sample_grid.update(device=args.device, batch=args.batch, heads=args.heads, compare_heads=args.compare_heads,
                                       sms=job["shape"]["sms"], mma_max_n=job["mma_max_n"])
                    keep_samples()  # the GPU's part of the cell, kept before its minutes of CPU comparison
                if pool is None:
                    finish(index, compare(job))
                    continue
                pending[pool.submit(compare_packed, _pack(job))] = index
                del job
                collect(block=False)
                while len(pending) >= 2 * args.workers:
                    collect(block=True)
            while pending:
                collect(block=True)
            if pool is not None:
                pool.shutdown(wait=True)
                pool = None
        except Stopped as stop:
            name = signal.Signals(stop.signum).name
            print(f"gpu_kernels: stopped by {name}{kept()}", file=sys.stderr, flush=True)
            return 128 + stop.signum
        except BrokenProcessPool:  # a worker killed (out of memory, a signal to it alone): no traceback
            print(f"gpu_kernels: error: a comparison worker died (killed: out of memory, or a signal){kept()}; "
                  "fewer --workers need less memory", file=sys.stderr, flush=True)
            return 1
        finally:
            if pool is not None:
                stop_pool(pool)
    final = report(True)
    text = json.dumps(final, indent=1)
    if args.out:
        write_text(args.out, text + "\n")
    print(text)
    failed = never_ran(final["rows"], "kernel")
    for line in failed:
        print(f"gpu_kernels: error: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    run_script(main)
