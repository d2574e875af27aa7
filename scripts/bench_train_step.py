"""Training-step time per attention backend and precision, and what a weight snapshot and a live
sibling comparison cost. Prints JSON (and writes it with --out).

    python scripts/bench_train_step.py                      dit_tiny on CPU, fp32 and bf16-mixed (+ dit_base on a GPU, if any)
    python scripts/bench_train_step.py --cpu-precision bf16-mixed --threads 2
    python scripts/bench_train_step.py --steps 30 --gpu-backends sdpa_flash,baseline

A step is what the LightningModule does per batch - noise draw, text tower, DiT forward, loss,
backward, gradient clipping, AdamW - on the run's own config (conf/train/train.yaml + overrides), timed
outside Lightning's loop so only the model's work is measured (median of --steps after
--warmup). The snapshot cost is one full WeightSnapshots write (float32 copy, safetensors,
sha256, atomic file + index writes) divided by the training time between two snapshots at the
default interval (snapshot.every_n_steps x the baseline's step time). The sibling comparison cost
is what the sibling callback adds at each snapshot step (scripts/bench_wasserstein.py's
live_comparison: load and verify the reference's snapshot, sort, compare, write the CSV), divided
the same way. Threads are pinned (--threads) and recorded with the machine (numdev.runs.provenance).

Low precision on CPUs without bf16/fp16 instructions (numdev.train.precision): `--cpu-gemm
native,fp32` times every bf16/fp16 row with PyTorch's own low-precision kernels and with FP32 GEMMs
on rounded operands; `precision_ratios` is each row's step time over the fp32 row of the same
backend, measured in the same run, and `auto_route` what precision.gemm=auto picks here. Another CPU
kind's kernel choice can be seen on this machine by capping the libraries' instruction sets, e.g.
ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 (recorded in
`environment`; an emulation of an AVX2-only CPU's kernel choice, not that CPU).
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from bench_wasserstein import make_runs  # scripts/ is on sys.path when a script in it runs
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

from numdev.cli.script_args import ScriptParser, run_script
from numdev.runs.atomic import write_json
from numdev.runs.provenance import provenance
from numdev.runs.scratch import scratch
from numdev.train.callbacks.sibling import SiblingDistance
from numdev.train.precision import resolve
from numdev.train.run import build_model, build_module
from numdev.weights.distances import distance_rows
from numdev.weights.store import SnapshotWriter, parameter_state


def config(overrides: list[str]):
    with initialize_config_module(config_module="numdev.conf.train", version_base="1.3"):
        return compose(config_name="train", overrides=["run_dir=unused", *overrides])


def setup(overrides: list[str], device: torch.device):
    cfg = config(overrides)
    backend = instantiate(cfg.attention)
    model = build_model(cfg, backend)
    plugin = instantiate(cfg.precision.plugin)
    module = plugin.convert_module(build_module(cfg, model)).to(device)
    module.log = lambda *args, **kwargs: None  # no trainer attached
    optimizer = module.configure_optimizers()["optimizer"]
    batch = next(iter(instantiate(cfg.data).train_dataloader()))
    batch = {"image": plugin.convert_input(batch["image"]).to(device), "caption": batch["caption"]}
    return cfg, module, optimizer, plugin, batch


def time_steps(module, optimizer, plugin, batch, steps: int, warmup: int, device: torch.device) -> list[float]:
    scaler = getattr(plugin, "scaler", None)

    def step():
        with plugin.forward_context():
            loss = module.training_step(batch, 0)
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        torch.nn.utils.clip_grad_norm_(module.model.parameters(), 1.0)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()

    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def bench(model: str, backends: list[str], precision: str, extra: list[str], steps: int, warmup: int, device: torch.device,
          gemm: str | None = None) -> list[dict]:
    rows = []
    for backend in backends:
        overrides = [f"model={model}", f"attention={backend}", f"precision={precision}", *extra]
        if gemm is not None and precision in LOW_PRECISIONS:
            overrides.append(f"precision.gemm={gemm}")
        cfg, module, optimizer, plugin, batch = setup(overrides, device)
        times = time_steps(module, optimizer, plugin, batch, steps, warmup, device)
        route = plugin.describe_route() if hasattr(plugin, "describe_route") else None
        rows.append({
            "model": model,
            "backend": backend,
            "precision": precision,
            "gemm": route,  # bf16/fp16 products: native kernels or FP32 GEMMs (numdev.train.precision)
            "device": device.type,
            "batch": cfg.data.batch_size,
            "resolution": cfg.data.resolution,
            "image_tokens": (cfg.data.resolution // cfg.model.patch) ** 2,
            "parameters": sum(p.numel() for p in module.model.parameters()),
            "step_seconds_median": statistics.median(times),
            "step_seconds_min": min(times),
            "steps_timed": len(times),
        })
        del module, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    reference = rows[0]["step_seconds_median"]
    for row in rows:
        row["relative_to_" + rows[0]["backend"]] = row["step_seconds_median"] / reference
    return rows


LOW_PRECISIONS = ("bf16-mixed", "fp16-mixed", "bf16-true")


def precision_ratios(rows: list[dict]) -> list[dict]:
    """Each low-precision row's median step time over the fp32 row of the same backend (measured in this run)."""
    fp32 = {r["backend"]: r["step_seconds_median"] for r in rows if r["precision"] == "fp32"}
    return [{"backend": r["backend"], "precision": r["precision"], "gemm_route": (r["gemm"] or {}).get("route"),
             "gemm_setting": (r["gemm"] or {}).get("setting"),
             "step_time_over_fp32": r["step_seconds_median"] / fp32[r["backend"]]}
            for r in rows if r["precision"] != "fp32" and r["backend"] in fp32]


def snapshot_cost(model: str, step_seconds: float, repeats: int = 3) -> dict:
    cfg = config([f"model={model}"])
    net = build_model(cfg, instantiate(cfg.attention))
    named = list(net.named_parameters())
    seconds = []
    with scratch("numdev_bench_train_step_") as run_dir:
        writer = SnapshotWriter(run_dir, cfg.model.name, {n: list(p.shape) for n, p in named})
        for step in range(repeats):
            start = time.perf_counter()
            writer.write(step, parameter_state(named))
            seconds.append(time.perf_counter() - start)
    every = cfg.snapshot.every_n_steps
    write = statistics.median(seconds)
    return {
        "model": model,
        "every_n_steps": every,
        "write_seconds_median": write,
        "file_megabytes": sum(p.numel() for _, p in named) * 4 / 1e6,
        "interval_seconds": every * step_seconds,
        "fraction_of_training_time": write / (every * step_seconds),
        "under_5_percent": write / (every * step_seconds) < 0.05,
    }


def sibling_cost(model: str, step_seconds: float, threads: int, repeats: int = 3) -> dict:
    """A live sibling comparison at a snapshot step after the first, against the training time between snapshots."""
    with scratch("numdev_bench_train_step_") as root:
        mine_dir, reference_dir, states = make_runs(Path(root), model)
        callback = SiblingDistance(str(mine_dir), str(reference_dir), label="bench", threads=threads)
        callback.measure(1, states[1])
        after_step_1 = (callback._reference, callback._mine)
        seconds = []
        for _ in range(repeats):
            callback._reference, callback._mine = after_step_1
            start = time.perf_counter()
            distances, _, _ = callback.measure(2, states[2])
            callback.rows = distance_rows(2, distances)
            callback.write_rows()
            seconds.append(time.perf_counter() - start)
    parameters = sum(t.numel() for t in states[2].values())
    every = config([f"model={model}"]).snapshot.every_n_steps
    compare = statistics.median(seconds)
    return {
        "model": model,
        "parameters": parameters,
        "compare_seconds_median": compare,
        "us_per_parameter": compare / parameters * 1e6,
        "fraction_of_training_time": compare / (every * step_seconds),
    }


def main() -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cpu-backends", default="baseline,sdpa_flash,flash_emulated")
    parser.add_argument("--gpu-backends", default="baseline,sdpa_flash,flash_emulated")
    parser.add_argument("--gpu-precision", default="bf16-mixed")
    parser.add_argument("--gpu-resolution", type=int, default=32, help="dit_base has patch 2: 32 -> 256 image tokens")
    parser.add_argument("--gpu-batch", type=int, default=32)
    parser.add_argument("--cpu-precision", default="fp32,bf16-mixed", help="comma-separated precision configs for the CPU rows")
    parser.add_argument("--cpu-gemm", default="auto", help="comma-separated precision.gemm settings for the low-precision CPU rows (auto, native, fp32)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--no-costs", action="store_true", help="skip the snapshot and sibling-comparison costs")
    parser.add_argument("--no-gpu", action="store_true")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    cpu = torch.device("cpu")
    report = {
        "script": "scripts/bench_train_step.py " + " ".join(sys.argv[1:]),
        "provenance": provenance(threads=torch.get_num_threads()),
        "host": {"machine": platform.machine(), "processor": platform.processor(), "threads": torch.get_num_threads()},
        "torch": torch.__version__,
        "environment": {k: os.environ[k] for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS") if k in os.environ},
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "load_average_before": list(os.getloadavg()),  # 1, 5, 15 minutes: what else ran beside the rows
        "cpu": [
            row
            for precision in args.cpu_precision.split(",")
            for gemm in (args.cpu_gemm.split(",") if precision in LOW_PRECISIONS else [None])
            for row in bench("dit_tiny", args.cpu_backends.split(","), precision, [], args.steps, args.warmup, cpu, gemm)
        ],
    }
    report["load_average_after"] = list(os.getloadavg())
    report["precision_ratios"] = precision_ratios(report["cpu"])
    report["auto_route"] = {name: dict(zip(("route", "why"), resolve("auto", dtype, "cpu")))
                            for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16))}
    if not args.no_costs:
        step_seconds = report["cpu"][0]["step_seconds_median"]
        report["snapshot"] = snapshot_cost("dit_tiny", step_seconds)
        report["sibling"] = sibling_cost("dit_tiny", step_seconds, torch.get_num_threads())
        report["snapshot_and_sibling_fraction"] = report["snapshot"]["fraction_of_training_time"] + report["sibling"]["fraction_of_training_time"]
    if torch.cuda.is_available() and not args.no_gpu:
        gpu = torch.device("cuda")
        report["gpu_name"] = torch.cuda.get_device_name(0)
        extra = ["trainer=gpu", f"data.resolution={args.gpu_resolution}", f"data.batch_size={args.gpu_batch}"]
        report["gpu"] = bench("dit_base", args.gpu_backends.split(","), args.gpu_precision, extra, args.steps, args.warmup, gpu)
    else:
        report["gpu"] = None
    print(json.dumps(report, indent=2))
    if args.out:
        write_json(Path(args.out), report)


if __name__ == "__main__":
    run_script(main)
