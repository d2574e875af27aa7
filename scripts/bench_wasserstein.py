"""What a live sibling weight comparison costs, in µs per parameter, and that its numbers equal SciPy's.
Prints JSON (and writes it with --out). Target: live_comparison <= 0.03 µs per parameter.

    python scripts/bench_wasserstein.py [--model dit_tiny] [--repeats 5] [--threads 2] [--out bench.json]

Two runs are stood in for by the model's initial weights (seed.init=0) moved twice by N(0, 1e-3)
noise (of the token embedding only the rows the shapes captions index), written as snapshots at
steps 1 and 2 with a token_rows.json into temporary run directories, as training writes them; the
reference also writes its sorted values beside each snapshot, as the study's reference does
(snapshot.sorted_values=true: numdev.train.callbacks.snapshots.WeightSnapshots). Cases, each the median
(and min, max) of --repeats wall-clock timings, divided by the parameter count, and the median CPU
time of all threads (cpu_us_per_parameter_median):

  live_comparison   what a comparing run's sibling callback does at a snapshot step after the
                    first: load and verify the reference's snapshot, read the reference's sorted
                    values from disk and check them against it, sort this run's own sets that
                    changed since the previous snapshot step and its pooled values, compare the
                    sets that changed on either side, write the CSV
                    (numdev.train.callbacks.sibling.SiblingDistance.measure + write_rows)
  live_comparison_first_step   the same with nothing prepared before (every set of this run
                    sorted, every set of the reference read and checked)
  live_comparison_sorting_both the old full path: the same step with no sorted values beside the
                    reference's snapshots (a reference without snapshot.sorted_values, or a file
                    that failed its checks), so both sides are sorted here, as before
  prepare_one_side  numdev.weights.distances.prepare of one state, every set sorted
  prepare_reference_from_disk  the same with its sorts read from the reference's file and checked
  compare_prepared  numdev.weights.distances.compare of two prepared states (no cache)
  write_sorted_values  what the reference adds per snapshot: writing its sorted values (fsync'd)
  histogram         TensorBoard's histogram of every difference (sibling.histograms=model), not in the above
  scipy_pooled_w1   scipy.stats.wasserstein_distance of the two whole models (float64), for scale

Equality: every set's W1 and the pooled W1 against scipy.stats.wasserstein_distance in float64
(the largest relative difference), and the live rows with the sorted values read from disk against
the rows of the old path (sorting both sides): equal bit for bit (live_rows_equal_old_path).
Threads are pinned (torch, and the comparison's own pool) and recorded with the machine
(numdev.runs.provenance). Timings on a shared machine are not comparable.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import contextlib
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy.stats
import torch
from hydra import compose, initialize_config_module
from hydra.utils import instantiate
from torch.utils.tensorboard import SummaryWriter

from numdev.cli.script_args import ScriptParser, run_script
from numdev.runs.atomic import write_json
from numdev.runs.layout import RunDir, indexed_rows
from numdev.runs.provenance import provenance
from numdev.runs.scratch import scratch
from numdev.train.callbacks.sibling import SiblingDistance
from numdev.train.run import build_model
from numdev.weights.distances import CompareCache, compare, distance_rows, prepare, split_sets
from numdev.weights.store import (
    SnapshotWriter,
    SortedSets,
    load_snapshot_entry,
    open_sorted_values,
    parameter_state,
    write_sorted_values,
)
from numdev.weights.token_rows import TokenRows, embedding_name


def timed(fn, repeats: int) -> dict:
    """Wall and CPU seconds (all threads; less sensitive to a shared machine) of `repeats` calls."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {"wall": wall, "cpu": cpu}


def per_parameter(timing: dict, parameters: int) -> dict:
    wall, cpu = timing["wall"], timing["cpu"]
    return {
        "us_per_parameter_median": statistics.median(wall) / parameters * 1e6,
        "us_per_parameter_min": min(wall) / parameters * 1e6,
        "us_per_parameter_max": max(wall) / parameters * 1e6,
        "cpu_us_per_parameter_median": statistics.median(cpu) / parameters * 1e6,
        "seconds_median": statistics.median(wall),
        "repeats": len(wall),
    }


def make_runs(root: Path, model_name: str) -> tuple[Path, Path, dict[int, dict[str, torch.Tensor]]]:
    """Two run directories with snapshots at steps 1 and 2 (the trained sets move between them, the
    unindexed embedding rows do not, as in training); returns this run's states by step."""
    with initialize_config_module(config_module="numdev.conf.train", version_base="1.3"):
        cfg = compose(config_name="train", overrides=["run_dir=unused", f"model={model_name}"])
    model = build_model(cfg, instantiate(cfg.attention))
    datamodule = instantiate(cfg.data)
    initial = parameter_state(model.named_parameters())
    embedding = embedding_name(model)
    runs = {"reference": root / "reference", "mine": root / "mine"}
    for run_dir in runs.values():
        TokenRows(run_dir, embedding, initial[embedding].shape[0], model.tokenize).start(datamodule.caption_vocabulary(), 0)
    rows = torch.from_numpy(indexed_rows([RunDir(runs["mine"]).read_token_rows()], 0)[embedding])
    g = torch.Generator().manual_seed(0)

    def moved(state):
        out = {k: v + torch.randn(v.shape, generator=g) * 1e-3 for k, v in state.items()}
        out[embedding] = state[embedding].clone()
        out[embedding][rows] += torch.randn(len(rows), state[embedding].shape[1], generator=g) * 1e-3
        return out

    shapes = {k: list(v.shape) for k, v in initial.items()}
    states = {}
    for name, run_dir in runs.items():
        writer = SnapshotWriter(run_dir, model_name, shapes)
        states[name] = {1: moved(initial)}
        states[name][2] = moved(states[name][1])
        prepared = None
        for step, state in states[name].items():
            sorted_sets = None
            if name == "reference":  # as WeightSnapshots does with snapshot.sorted_values=true
                own_rows = indexed_rows([RunDir(run_dir).read_token_rows()], step)
                prepared = prepare(state, own_rows, previous=prepared)
                sorted_sets = SortedSets(prepared.sorted, prepared.pooled_sorted, own_rows)
            writer.write(step, state, sorted_sets)
    return runs["mine"], runs["reference"], states["mine"]


def main() -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dit_tiny")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads and the comparison's thread pool")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with scratch("numdev_bench_wasserstein_") as tmp, contextlib.redirect_stdout(sys.stderr):  # stdout: the JSON only
        mine_dir, reference_dir, states = make_runs(Path(tmp), args.model)
        unsorted_dir = Path(tmp) / "reference_without_sorted_values"
        shutil.copytree(reference_dir, unsorted_dir, ignore=shutil.ignore_patterns("sorted_*"))
        mine = states[2]
        parameters = sum(t.numel() for t in mine.values())

        def live_case(reference: Path) -> tuple[dict, dict, SiblingDistance]:
            callback = SiblingDistance(str(mine_dir), str(reference), label="bench", threads=args.threads)

            def live(step: int):
                distances, _, theirs = callback.measure(step, states[step])
                callback.rows = distance_rows(step, distances)
                callback.write_rows()
                live.result = (distances, theirs)

            def first_step():  # nothing prepared yet: every set of both sides is sorted (or read)
                callback._reference, callback._mine, callback._cache = None, None, CompareCache()
                live(2)

            live(1)
            after_step_1 = (callback._reference, callback._mine, dict(callback._cache.parts))

            def next_step():  # step 1 prepared: the unchanged sets (the unindexed embedding rows) are reused
                callback._reference, callback._mine = after_step_1[:2]
                callback._cache.parts = dict(after_step_1[2])
                live(2)

            return {"next": next_step, "first": first_step}, live, callback

        cases = {}
        runs, live, callback = live_case(reference_dir)
        cases["live_comparison"] = per_parameter(timed(runs["next"], args.repeats), parameters)
        distances, theirs = live.result
        used_from_disk = list(callback._reference[1].stored)
        cases["live_comparison_first_step"] = per_parameter(timed(runs["first"], args.repeats), parameters)
        old_runs, old_live, old_callback = live_case(unsorted_dir)
        cases["live_comparison_sorting_both"] = per_parameter(timed(old_runs["next"], args.repeats), parameters)
        old_distances, _ = old_live.result
        assert not old_callback._reference[1].stored and callback.stored_problem is None, "the cases did not take the paths they name"

        rows = indexed_rows([RunDir(mine_dir).read_token_rows(), RunDir(reference_dir).read_token_rows()], 1)
        prepared_mine, prepared_theirs = prepare(mine, rows, args.threads), prepare(theirs, rows, args.threads)
        cases["prepare_one_side"] = per_parameter(timed(lambda: prepare(mine, rows, args.threads), args.repeats), parameters)
        sha256 = load_snapshot_entry(reference_dir, 2)[1]

        def from_disk():
            with open_sorted_values(reference_dir, 2, sha256) as stored:
                return prepare(theirs, rows, args.threads, stored=stored)

        cases["prepare_reference_from_disk"] = per_parameter(timed(from_disk, args.repeats), parameters)
        cases["compare_prepared"] = per_parameter(
            timed(lambda: compare(prepared_mine, prepared_theirs, args.threads), args.repeats), parameters
        )
        own_rows = indexed_rows([RunDir(reference_dir).read_token_rows()], 2)
        sorted_sets = SortedSets(prepared_theirs.sorted, prepared_theirs.pooled_sorted, own_rows)
        sorted_dir = Path(tmp) / "scratch"
        cases["write_sorted_values"] = per_parameter(
            timed(lambda: write_sorted_values(sorted_dir, 2, sha256, sorted_sets), args.repeats), parameters
        )
        writer = SummaryWriter(str(Path(tmp) / "tensorboard"))
        cases["histogram"] = per_parameter(timed(lambda: callback.log_histograms(writer, 2, mine, theirs), args.repeats), parameters)
        writer.close()
        whole = [np.concatenate([s[n].numpy().reshape(-1) for n in sorted(s)]).astype(np.float64) for s in (mine, theirs)]
        cases["scipy_pooled_w1"] = per_parameter(timed(lambda: scipy.stats.wasserstein_distance(*whole), 1), parameters)

        sets_mine, sets_theirs = split_sets(mine, rows), split_sets(theirs, rows)
        relative = [
            abs(distances["per_tensor"][n]["wasserstein"] - ref) / ref
            for n in sets_mine
            if (ref := scipy.stats.wasserstein_distance(sets_mine[n].astype(np.float64), sets_theirs[n].astype(np.float64))) > 0
        ]
        pooled = scipy.stats.wasserstein_distance(*whole)
        report = {
            "script": "scripts/bench_wasserstein.py " + " ".join(sys.argv[1:]),
            "provenance": provenance(threads=args.threads),
            "model": args.model,
            "parameters": parameters,
            "sets": len(sets_mine),
            "target_us_per_parameter": 0.03,
            "cases": cases,
            "live_within_target": cases["live_comparison"]["us_per_parameter_median"] <= 0.03,
            "live_sets_read_from_disk": len(used_from_disk),
            "live_rows_equal_old_path": distance_rows(2, distances) == distance_rows(2, old_distances),
            "equal_to_scipy": {
                "per_set_w1_max_relative_difference": max(relative),
                "pooled_w1_relative_difference": abs(distances["model"]["pooled_wasserstein"] - pooled) / pooled,
            },
        }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        write_json(Path(args.out), report)


if __name__ == "__main__":
    run_script(main)
