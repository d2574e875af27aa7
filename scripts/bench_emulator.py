"""Time and peak memory of the flash emulator against Baseline Attention on CPU; and the time of
the whole paper-figure suite. Prints JSON.

    python scripts/bench_emulator.py                 # N = 1k, 4k, 16k and the figure suite
    python scripts/bench_emulator.py --no-suite --lengths 1024 4096

Each measurement runs in a fresh subprocess, so its peak resident memory (ru_maxrss) is its own;
"extra" memory is the peak during the attention call minus the resident size just before it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def measure(method: str, n: int, dim: int, block_c: int, repeats: int) -> dict:
    import torch

    from numdev.attention import Baseline, FlashEmulated
    from numdev.formats import round_to
    from numdev.numerics import stage_formats

    torch.manual_seed(0)
    q, k, v = (round_to(torch.randn(1, 1, n, dim), "bf16") for _ in range(3))
    formats = stage_formats("paper", "bf16")
    attention = FlashEmulated(formats, block_r=64, block_c=block_c) if method == "flash_emulated" else Baseline(formats)
    with torch.no_grad():
        attention(q[:, :, :256], k[:, :, :256], v[:, :, :256])  # warm up kernels and the allocator
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            attention(q, k, v)
            times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"method": method, "n": n, "dim": dim, "block_c": block_c, "seconds": min(times),
            "extra_peak_bytes": max(0, peak - before)}


def run_isolated(method: str, n: int, dim: int, block_c: int, repeats: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", method, str(n), str(dim), str(block_c), str(repeats)],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)


def figure_suite_seconds() -> dict:
    import tempfile

    from numdev.figures import BENCH_FIGURES  # the one list of figures

    seconds = {}
    with tempfile.TemporaryDirectory() as root:
        for experiment in BENCH_FIGURES:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "numdev.bench.app", f"experiment={experiment}", f"output_root={root}"],
                           check=True, capture_output=True)
            seconds[experiment] = time.perf_counter() - start
    return {"per_experiment_seconds": seconds, "total_seconds": sum(seconds.values())}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        method, n, dim, block_c, repeats = sys.argv[2], *map(int, sys.argv[3:7])
        print(json.dumps(measure(method, n, dim, block_c, repeats)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--block-c", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-suite", action="store_true", help="skip timing the paper-figure suite")
    args = parser.parse_args()
    rows = []
    for n in args.lengths:
        pair = {m: run_isolated(m, n, args.dim, args.block_c, args.repeats if n < 16384 else 1)
                for m in ("baseline", "flash_emulated")}
        flash, base = pair["flash_emulated"], pair["baseline"]
        rows.append({
            "n": n,
            "baseline_seconds": base["seconds"],
            "flash_emulated_seconds": flash["seconds"],
            "time_ratio_flash_over_baseline": flash["seconds"] / base["seconds"],
            "baseline_extra_peak_mb": base["extra_peak_bytes"] / 2**20,
            "flash_emulated_extra_peak_mb": flash["extra_peak_bytes"] / 2**20,
            # One (N x B_c) float32 score block, and the N x N matrix the emulator must never build.
            "score_block_mb": n * args.block_c * 4 / 2**20,
            "n_by_n_mb": n * n * 4 / 2**20,
        })
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    report = {"device": "cpu", "preset": "paper", "precision": "bf16", "dim": args.dim, "block_c": args.block_c,
              "threads": __import__("torch").get_num_threads(), "lengths": rows}
    if not args.no_suite:
        report["figure_suite"] = figure_suite_seconds()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
