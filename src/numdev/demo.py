"""numdev-demo: the main job on the embedded defaults (CPU).

Runs the microbenchmark figures (Figs. 3-6 and FA3's Table 3) through the real command line,
one sweep after another, and prints each figure's caption and where it landed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

BENCH_EXPERIMENTS = ("fig3", "fig4", "fig5", "fig6", "fa3_table3")


def latest_sweep(output_root: Path, app: str, name: str) -> Path:
    sweeps = sorted((output_root / app / name).glob("multirun_*"))
    if not sweeps:
        raise FileNotFoundError(f"no sweep of {name} under {output_root / app / name}")
    return sweeps[-1]


def run_bench_figures(output_root: Path) -> dict[str, Path]:
    figures = {}
    for i, experiment in enumerate(BENCH_EXPERIMENTS, start=1):
        print(f"[{i}/{len(BENCH_EXPERIMENTS)}] numdev-bench experiment={experiment}", flush=True)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "numdev.bench.app", f"experiment={experiment}", f"output_root={output_root}"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        sweep = latest_sweep(output_root, "bench", experiment)
        summary = json.loads((sweep / f"{experiment}.json").read_text())
        print(f"    {time.perf_counter() - start:.0f} s: {summary['caption']}\n    -> {sweep / (experiment + '.png')}", flush=True)
        figures[experiment] = sweep / f"{experiment}.png"
    return figures


def main() -> None:
    output_root = Path("outputs")
    run_bench_figures(output_root)


if __name__ == "__main__":
    main()
