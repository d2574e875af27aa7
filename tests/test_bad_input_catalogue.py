"""The bad-input catalogue: every user-facing command, fed bad input, says what is wrong in one line
and leaves no half-written output.

Each entry of CATALOGUE is one mistake: the command, its arguments, the text the error line must
contain, and optionally a setup (the broken input), a simulated write failure (a disk that fills
up: `fault` names the file whose write fails) and the files that must come out byte-for-byte
unchanged. Every entry is checked for:

- exit code 2 (a run that started and failed: 1; an input handled with a warning: 0, style
  "warning" - exactly one `<command>: warning:` or logged line containing `expect` - or "quiet"; Hydra's own composition errors - an unknown config group option or key - keep
  Hydra's exit code 1 and its few-line message, style "hydra"; argparse usage errors print the usage
  first, style "argparse");
- our errors: stderr is exactly one line, `<command>: error: ...`, containing `expect`;
- no Python traceback;
- no temporary file left anywhere, the `intact` files unchanged, and no run output (weights,
  checkpoints, run records) from a run refused before it started.

Commands run in-process (main() with its argv) to keep this fast; the real console scripts are
exercised in test_cli.py, test_distributed.py, test_launchers.py and test_kill_resume.py. To add a
mistake, append a Case; `CATALOGUE_SIZE` in README.md's Reliability section counts them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from helpers import compose_train
from hydra.core.global_hydra import GlobalHydra
from PIL import Image

import numdev.atomic


@dataclass
class Case:
    id: str
    program: str  # numdev-train, numdev-bench, numdev-gather, numdev-figure, numdev-report, numdev-compare, numdev-study
    args: list[str]  # "{tmp}" is the test's temporary directory
    expect: str  # the error line contains this ("{tmp}" substituted)
    setup: Callable[[Path], None] | None = None
    style: str = "ours"  # ours | hydra | argparse
    fault: str | None = None  # writes of files whose name contains this fail with ENOSPC
    intact: tuple[str, ...] = ()  # files under {tmp} that must be unchanged
    refused_before_start: bool = True  # numdev-train: no weights/, checkpoints/, run.json written
    extra: dict = field(default_factory=dict)
    code: int = 2  # the exit code: 2 refused, 1 a run that started and failed, 0 ran with a warning
    after: Callable[[Path], None] | None = None  # asserts that nothing was lost (records, statuses)


TRAIN = ["experiment=train_smoke", "hydra.run.dir={tmp}/run"]
BENCH = ["shape.seq_q=32", "shape.dim=16", "numerics.precision=fp16", "seeds=[0]", "hydra.run.dir={tmp}/bench"]


# -- setups: the broken inputs ---------------------------------------------------------------------
def _images(root: Path, count: int = 2, corrupt: int = 0) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        path = root / f"{i}.png"
        if i < corrupt:
            path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
        else:
            Image.new("RGB", (20, 20), (50 * i, 100, 200)).save(path)
        (root / f"{i}.txt").write_text(f"picture {i}")


def _manifest(text: str, name: str = "m.jsonl") -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        _images(tmp / "data")
        (tmp / "data" / name).write_text(text)

    return setup


def _trained_run(tmp: Path) -> None:
    threads = torch.get_num_threads()
    from numdev.train.run import train

    try:
        train(compose_train("trainer.max_steps=2", run_dir=tmp / "run"))
    finally:
        torch.set_num_threads(threads)


def _truncate_checkpoint(tmp: Path) -> None:
    _trained_run(tmp)
    path = tmp / "run" / "checkpoints" / "last.ckpt"
    path.write_bytes(path.read_bytes()[:1000])


def _records(tmp: Path, text: str, where: str = "sweep/0") -> None:
    (tmp / where).mkdir(parents=True, exist_ok=True)
    (tmp / where / "results.jsonl").write_text(text)


GOOD_RECORD = json.dumps({"kind": "vs_golden", "method": "flash", "seed": 0, "metrics": {"max_abs": 1.0e-3}}) + "\n"


def _bench_results(text: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "bench").mkdir(parents=True)
        (tmp / "bench" / "results.jsonl").write_text(text)

    return setup


def _report_sweep(tmp: Path, summary: str | None = None) -> None:
    sweep = tmp / "sweep"
    sweep.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8)).save(sweep / "fig3.png")
    (sweep / "fig3.json").write_text(summary if summary is not None else json.dumps({"figure": "fig3", "caption": "measured"}))
    (tmp / "report").mkdir(exist_ok=True)
    (tmp / "report" / "index.html").write_text("<html>the previous report</html>")


def _snapshots(tmp: Path, name: str, shapes: dict | None = None, steps=(0, 2)) -> None:
    from numdev.snapshot_store import SnapshotWriter

    shapes = shapes or {"w": [3, 2]}
    writer = SnapshotWriter(tmp / name, "m", shapes)
    for step in steps:
        writer.write(step, {k: torch.full(v, float(step)) for k, v in shapes.items()})


def _corrupt_snapshot(tmp: Path) -> None:
    _snapshots(tmp, "a")
    _snapshots(tmp, "b")
    path = tmp / "b" / "weights" / "step_00000002.safetensors"
    path.write_bytes(path.read_bytes()[:-1] + b"\x01")


def _compare_pair(tmp: Path) -> None:
    _snapshots(tmp, "a")
    _snapshots(tmp, "b")
    (tmp / "cmp").mkdir()
    (tmp / "cmp" / "distances.csv").write_text("the,previous\n")


# -- reliability (issue 13): setups and what must survive --------------------------------------------
HELD_LOCKS = []  # locks a setup holds for the whole case: "another live run"


def _live_run(tmp: Path) -> None:
    from numdev.run_lock import RunLock

    HELD_LOCKS.append(RunLock(tmp / "run").acquire())


def _run_status(status: str, error: str | None = None) -> Callable[[Path], None]:
    def after(tmp: Path) -> None:
        run = json.loads((tmp / "run" / "run.json").read_text())
        assert run["status"] == status, run
        if error is not None:
            assert error in run["error"], run["error"]
        assert (tmp / "run" / "weights" / "step_00000000.safetensors").is_file()  # the snapshots so far are kept

    return after


def _edit_run(path: str, edit: Callable[[str], str]) -> Callable[[Path], None]:
    """A trained run whose file `path` (relative to the run) was then edited."""

    def setup(tmp: Path) -> None:
        _trained_run(tmp)
        target = tmp / "run" / path
        target.write_text(edit(target.read_text()))

    return setup


def _edit_index(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        _snapshots(tmp, "a")
        _snapshots(tmp, "b")
        path = tmp / "b" / "weights" / "index.json"
        index = json.loads(path.read_text())
        edit(index)
        path.write_text(json.dumps(index))

    return setup


def _huge_caption(tmp: Path) -> None:
    _images(tmp / "data")
    (tmp / "data" / "0.txt").write_text("a red circle " * 800_000)  # 10.4 MB


def _records_of(path: str, kinds: dict[str, int]) -> Callable[[Path], None]:
    def after(tmp: Path) -> None:
        records = [json.loads(line) for line in (tmp / path).read_text().splitlines()]
        counted = {}
        for r in records:
            counted[f"{r['kind']}:{r['method']}"] = counted.get(f"{r['kind']}:{r['method']}", 0) + 1
        assert counted == kinds, counted

    return after


def _finished(tmp: Path) -> None:
    assert json.loads((tmp / "run" / "run.json").read_text())["status"] == "finished"


ZERO_CHECKS = ["callbacks.instability.check_loss=false", "callbacks.instability.check_gradients=false",
               "callbacks.instability.check_attention=false"]
RESUME = [*TRAIN, "trainer.max_steps=4", "resume=true"]
KEPT = ("run/run.json", "run/config.yaml", "run/weights/index.json", "run/checkpoints/last.ckpt")


# -- the catalogue ---------------------------------------------------------------------------------
CATALOGUE = [
    # numdev-train: unknown config values
    Case("train-unknown-option", "numdev-train", [*TRAIN, "attention=nope"], "attention/nope", style="hydra"),
    Case("train-unknown-key", "numdev-train", [*TRAIN, "trainer.nope=1"], "nope", style="hydra"),
    Case("train-unknown-format", "numdev-train", [*TRAIN, "precision.compute=fp12"], "unknown float format 'fp12'"),
    Case("train-unknown-policy", "numdev-train", [*TRAIN, "callbacks.instability.policy=explode"],
         "callbacks.instability.policy='explode': use one of record, skip, stop"),
    Case("train-unknown-resume", "numdev-train", [*TRAIN, "resume=maybe"], "resume='maybe': use true, false or auto"),
    Case("train-unknown-sampler", "numdev-train", [*TRAIN, "diffusion.sampler.kind=euler"], "unknown sampler 'euler'"),
    # numdev-train: wrong types
    Case("train-type-max-steps", "numdev-train", [*TRAIN, "trainer.max_steps=abc"], "trainer.max_steps='abc' must be a positive integer"),
    Case("train-type-batch-size", "numdev-train", [*TRAIN, "data.batch_size=abc"], "data.batch_size='abc' must be a positive integer"),
    Case("train-type-hidden", "numdev-train", [*TRAIN, "model.hidden=abc"], "model.hidden='abc' must be a positive integer"),
    Case("train-type-lr", "numdev-train", [*TRAIN, "optim.optimizer.lr=abc"], "optim.optimizer.lr='abc' must be a positive number"),
    Case("train-type-seed", "numdev-train", [*TRAIN, "seed.init=abc"], "seed.init='abc' must be a non-negative integer"),
    Case("train-type-devices", "numdev-train", [*TRAIN, "trainer.devices=abc"], "trainer: `devices` selected with `CPUAccelerator` should be an int > 0.: a value under trainer has the wrong type"),
    Case("train-type-spike-factor", "numdev-train", [*TRAIN, "callbacks.instability.spike_factor=abc"],
         "callbacks.instability.spike_factor='abc' must be a number > 1"),
    # numdev-train: impossible sizes and combinations
    Case("train-tile-zero", "numdev-train", [*TRAIN, "attention=flash_emulated", "attention.block_c=0"],
         "tile size block_c=0 must be a positive integer"),
    Case("train-tile-type", "numdev-train", [*TRAIN, "attention=flash_emulated", "attention.block_r=abc"],
         "tile size block_r='abc' must be a positive integer"),
    Case("train-heads", "numdev-train", [*TRAIN, "model.heads=3"], "not divisible by 3 heads"),
    Case("train-backend-on-cpu", "numdev-train", [*TRAIN, "attention=flash_attn"], "cannot run here"),
    Case("train-gpu-without-gpu", "numdev-train", [*TRAIN, "trainer=fsdp_gpu"], "no CUDA device is visible: use trainer=cpu"),
    Case("train-ddp-in-sweep", "numdev-train", ["-m", "experiment=train_smoke", "trainer=ddp_cpu", "hydra.sweep.dir={tmp}/sweep"],
         "a -m sweep with trainer.devices=2"),
    # numdev-train: data
    Case("train-data-missing-folder", "numdev-train", [*TRAIN, "data=folder", "data.root={tmp}/nowhere"], "is not a directory"),
    Case("train-data-empty-folder", "numdev-train", [*TRAIN, "data=folder", "data.root={tmp}/data"], "no images",
         setup=lambda tmp: (tmp / "data").mkdir()),
    Case("train-data-corrupt-image", "numdev-train", [*TRAIN, "data=folder", "data.root={tmp}/data", "data.on_bad_image=error"],
         "cannot decode image {tmp}/data/0.png", setup=lambda tmp: _images(tmp / "data", 2, corrupt=1)),
    Case("train-data-all-corrupt", "numdev-train", [*TRAIN, "data=folder", "data.root={tmp}/data"],
         "none of the 2 images could be decoded", setup=lambda tmp: _images(tmp / "data", 2, corrupt=2)),
    Case("train-data-corrupt-manifest", "numdev-train", [*TRAIN, "data=folder", "data.root={tmp}/data", "data.manifest=m.jsonl"],
         "{tmp}/data/m.jsonl, line 2: not valid JSON", setup=_manifest('{"image": "0.png", "caption": "a"}\n{"image": "1.p\n')),
    Case("train-data-manifest-columns", "numdev-train", [*TRAIN, "data=folder", "data.root={tmp}/data", "data.manifest=m.csv"],
         "the header lacks column(s) caption", setup=_manifest("image,text\n0.png,a\n", "m.csv")),
    # numdev-train: runs that are not there, or not the same
    Case("train-resume-missing-run", "numdev-train", [*TRAIN, "resume=true"], "resume=true but {tmp}/run/checkpoints/last.ckpt does not exist"),
    Case("train-resume-other-architecture", "numdev-train", [*TRAIN, "trainer.max_steps=4", "resume=true", "model.hidden=64"],
         "the config differs from the run's config.yaml at model.hidden (32 -> 64)", setup=_trained_run,
         intact=("run/weights/index.json", "run/checkpoints/last.ckpt", "run/run.json", "run/config.yaml"), refused_before_start=False),
    Case("train-overwrite-run", "numdev-train", [*TRAIN, "trainer.max_steps=2"], "already holds a run: add resume=true", setup=_trained_run,
         intact=("run/weights/index.json", "run/checkpoints/last.ckpt", "run/run.json"), refused_before_start=False),
    Case("train-truncated-checkpoint", "numdev-train", [*TRAIN, "trainer.max_steps=4", "resume=true"],
         "{tmp}/run/checkpoints/last.ckpt is not a readable checkpoint", setup=_truncate_checkpoint,
         intact=("run/weights/index.json", "run/run.json"), refused_before_start=False),
    # numdev-train: the disk fills up
    Case("train-disk-full-snapshot", "numdev-train", TRAIN, "could not write {tmp}/run/weights/step_00000000.safetensors: No space left",
         fault="step_", refused_before_start=False, extra={"absent": ("run/weights/index.json",)}),
    Case("train-disk-full-checkpoint", "numdev-train", TRAIN, "could not write {tmp}/run/checkpoints/last.ckpt: No space left",
         fault="last.ckpt", refused_before_start=False, extra={"absent": ("run/checkpoints/last.ckpt",)}),
    # numdev-bench
    Case("bench-unknown-option", "numdev-bench", [*BENCH, "numerics=fastest"], "fa2", style="hydra"),
    Case("bench-unknown-preset", "numdev-bench", [*BENCH, "numerics.preset=fastest"], "unknown numerics preset 'fastest'"),
    Case("bench-unknown-variant", "numdev-bench", [*BENCH, "variant=fa9"], "unknown flash variant 'fa9'"),
    Case("bench-tile-zero", "numdev-bench", [*BENCH, "tiles.block_c=0"], "block_c=0 must be a positive integer"),
    Case("bench-tile-type", "numdev-bench", [*BENCH, "tiles.block_r=abc"], "tiles.block_r='abc' must be a positive integer or null"),
    Case("bench-type-seq", "numdev-bench", [*BENCH, "shape.seq_q=abc"], "shape.seq_q='abc' must be a positive integer"),
    Case("bench-negative-seq", "numdev-bench", [*BENCH, "shape.seq_q=-3"], "shape.seq_q=-3 must be a positive integer"),
    Case("bench-overflow", "numdev-bench", [*BENCH, "inputs.scale=1000000"], "inputs overflow the input format fp16"),
    Case("bench-torn-results", "numdev-bench", BENCH, "{tmp}/bench/results.jsonl does not end with a newline: it was truncated",
         setup=_bench_results(GOOD_RECORD + '{"method": "fl'), intact=("bench/results.jsonl",)),
    Case("bench-disk-full", "numdev-bench", BENCH, "could not write {tmp}/bench/results.jsonl: No space left",
         setup=_bench_results(GOOD_RECORD), fault="results.jsonl", intact=("bench/results.jsonl",)),
    # numdev-gather
    Case("gather-missing-dir", "numdev-gather", ["{tmp}/nowhere"], "no such sweep directory: {tmp}/nowhere"),
    Case("gather-empty-dir", "numdev-gather", ["{tmp}/sweep"], "no results.jsonl under {tmp}/sweep",
         setup=lambda tmp: (tmp / "sweep").mkdir()),
    Case("gather-corrupt-line", "numdev-gather", ["{tmp}/sweep"], "{tmp}/sweep/0/results.jsonl, line 2: not valid JSON",
         setup=lambda tmp: _records(tmp, GOOD_RECORD + "{garbage\n" + GOOD_RECORD)),
    Case("gather-torn-last-line", "numdev-gather", ["{tmp}/sweep"],
         "{tmp}/sweep/0/results.jsonl, line 2: incomplete record (no newline at the end): the file was truncated",
         setup=lambda tmp: _records(tmp, GOOD_RECORD + '{"method": "flash", "max_abs": 1')),
    Case("gather-not-an-object", "numdev-gather", ["{tmp}/sweep"], "{tmp}/sweep/0/results.jsonl, line 1: a list, not a JSON object",
         setup=lambda tmp: _records(tmp, "[1, 2]\n")),
    Case("gather-binary-garbage", "numdev-gather", ["{tmp}/sweep"], "{tmp}/sweep/0/results.jsonl: not UTF-8 text",
         setup=lambda tmp: _records(tmp, "") or (tmp / "sweep/0/results.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")),
    Case("gather-disk-full", "numdev-gather", ["{tmp}/sweep"], "could not write {tmp}/sweep/table.csv: No space left",
         setup=lambda tmp: _records(tmp, GOOD_RECORD) or (tmp / "sweep/table.csv").write_text("the,previous\n"),
         fault="table.csv", intact=("sweep/table.csv",)),
    # numdev-figure
    Case("figure-unknown-figure", "numdev-figure", ["fig99", "{tmp}/sweep"], "invalid choice: 'fig99'", style="argparse"),
    Case("figure-no-results", "numdev-figure", ["fig3", "{tmp}/sweep"], "no results.jsonl under {tmp}/sweep",
         setup=lambda tmp: (tmp / "sweep").mkdir()),
    Case("figure-other-experiment", "numdev-figure", ["fig3", "{tmp}/sweep"], "the records lack the field",
         setup=lambda tmp: _records(tmp, GOOD_RECORD)),
    Case("figure-torn-results", "numdev-figure", ["fig3", "{tmp}/sweep"], "incomplete record (no newline at the end)",
         setup=lambda tmp: _records(tmp, '{"method": "fl')),
    # numdev-report
    Case("report-nothing", "numdev-report", ["--outputs", "{tmp}/outputs", "-o", "{tmp}/report"], "nothing to report"),
    Case("report-missing-run-dir", "numdev-report", ["--bench", "{tmp}/nowhere", "-o", "{tmp}/report"],
         "{tmp}/nowhere has no figure summary"),
    Case("report-corrupt-summary", "numdev-report", ["--bench", "{tmp}/sweep", "-o", "{tmp}/report"],
         "{tmp}/sweep/fig3.json: not valid JSON", setup=lambda tmp: _report_sweep(tmp, '{"figure": "fig3", "capt'),
         intact=("report/index.html",)),
    Case("report-corrupt-multirun-yaml", "numdev-report", ["--bench", "{tmp}/sweep", "-o", "{tmp}/report"],
         "{tmp}/sweep/multirun.yaml: not a Hydra multirun.yaml",
         setup=lambda tmp: _report_sweep(tmp) or (tmp / "sweep/multirun.yaml").write_text("hydra: [unclosed\n"),
         intact=("report/index.html",)),
    # sibling runs: numdev-train with a reference, numdev-compare, numdev-study
    Case("train-sibling-missing", "numdev-train", [*TRAIN, "sibling.reference={tmp}/nowhere/run"],
         "{tmp}/nowhere/run does not exist (nor does its parent directory)", refused_before_start=False,
         extra={"absent": ("run/weights/step_00000002.safetensors",)}),
    Case("train-sibling-other-architecture", "numdev-train",
         ["experiment=train_smoke", "hydra.run.dir={tmp}/wide", "model.hidden=48", "sibling.reference={tmp}/run"],
         "has shape (", setup=_trained_run, intact=("run/weights/index.json",), refused_before_start=False),
    Case("compare-missing-run", "numdev-compare", ["{tmp}/a", "{tmp}/nowhere"], "is not a training run directory with snapshots",
         setup=lambda tmp: _snapshots(tmp, "a")),
    Case("compare-not-a-run", "numdev-compare", ["{tmp}/a", "{tmp}"], "{tmp}/weights/index.json does not exist",
         setup=lambda tmp: _snapshots(tmp, "a")),
    Case("compare-corrupt-snapshot", "numdev-compare", ["{tmp}/a", "{tmp}/b"], "step_00000002.safetensors: sha256 does not match",
         setup=_corrupt_snapshot),
    Case("compare-different-models", "numdev-compare", ["{tmp}/a", "{tmp}/b"], "the runs have different architectures",
         setup=lambda tmp: _snapshots(tmp, "a") or _snapshots(tmp, "b", shapes={"v": [5]})),
    Case("compare-no-common-step", "numdev-compare", ["{tmp}/a", "{tmp}/b"], "share no snapshot step",
         setup=lambda tmp: _snapshots(tmp, "a", steps=(1,)) or _snapshots(tmp, "b", steps=(2,))),
    Case("compare-disk-full", "numdev-compare", ["{tmp}/a", "{tmp}/b", "-o", "{tmp}/cmp"],
         "could not write {tmp}/cmp/distances.csv: No space left", setup=_compare_pair, fault="distances.csv",
         intact=("cmp/distances.csv",)),
    Case("study-not-a-study", "numdev-study", ["{tmp}"], "is not a finished study"),
    Case("report-disk-full", "numdev-report", ["--bench", "{tmp}/sweep", "-o", "{tmp}/report"],
         "could not write {tmp}/report/index.html: No space left", setup=_report_sweep, fault="index.html",
         intact=("report/index.html",)),
    # -- reliability (issue 13), by kind ---------------------------------------------------------
    # 1. silent failure: non-finite loss, weights or attention outputs end the run failed (exit 1)
    Case("train-nonfinite-lr", "numdev-train", [*TRAIN, "optim.optimizer.lr=1e30"],
         "run failed: nonfinite_loss at step 1 (callbacks.instability.policy=fail); the update of that step was not applied; "
         "{tmp}/run/run.json says failed", code=1, refused_before_start=False,
         after=_run_status("failed", "nonfinite_loss at step 1")),
    Case("train-nonfinite-weights-unchecked", "numdev-train", [*TRAIN, "optim.optimizer.lr=1e30", *ZERO_CHECKS],
         "run failed: nonfinite_weights after step 4 in ", code=1, refused_before_start=False,
         after=_run_status("failed", "nonfinite_weights after step 4")),
    # 2. collisions: a second live run in one directory
    Case("train-live-run-directory", "numdev-train", TRAIN, "{tmp}/run is in use by another live run (process "
         f"{os.getpid()}): wait for it to end, or give this run its own directory (hydra.run.dir=...)", setup=_live_run),
    # 5. unbounded inputs: a 10 MB caption is cut at load, named in one warning, and the run finishes
    Case("train-data-huge-caption", "numdev-train", [*TRAIN, "data=folder", "data.root={tmp}/data"],
         "{tmp}/data/0.txt: caption of 10399999 characters cut to 1000 (data.max_caption_chars)", setup=_huge_caption,
         style="warning", code=0, refused_before_start=False, after=_finished),
    Case("train-data-huge-csv-caption", "numdev-train", [*TRAIN, "data=folder", "data.root={tmp}/data", "data.manifest=m.csv"],
         "{tmp}/data/m.csv, line 2: not valid CSV (field larger than field limit", setup=_manifest("image,caption\n0.png," + "a" * 200_000 + "\n", "m.csv")),
    # 6. memory: refused before anything runs, or a method skipped (recorded) and the others kept
    Case("bench-shape-too-big", "numdev-bench", [*BENCH, "shape.batch=100000000"],
         "shape 100000000x1x32x16: the inputs and the FP64 golden value alone need ~"),
    Case("bench-method-over-memory", "numdev-bench", [*BENCH, "shape.seq_q=1024", "memory_limit_gb=0.05"], "", style="quiet", code=0,
         after=_records_of("bench/results.jsonl", {"vs_golden:flash": 1, "skipped:baseline": 1, "skipped:flash-baseline": 1})),
    # 7. config values: type, range, booleans never read from strings; every message names the key
    Case("train-heads-zero", "numdev-train", [*TRAIN, "model.heads=0"], "model.heads=0 must be a positive integer"),
    Case("train-lr-inf", "numdev-train", [*TRAIN, "optim.optimizer.lr=inf"], "optim.optimizer.lr=inf must be a positive number (finite)"),
    Case("train-p-uncond-range", "numdev-train", [*TRAIN, "diffusion.p_uncond=2"], "diffusion.p_uncond=2 must be a number in [0, 1)"),
    Case("train-sibling-timeout-type", "numdev-train", [*TRAIN, "sibling.timeout_s=abc"], "sibling.timeout_s='abc' must be a non-negative number"),
    Case("train-bool-string", "numdev-train", [*TRAIN, 'trainer.enable_progress_bar="false"'],
         "trainer.enable_progress_bar='false' must be true or false (unquoted: trainer.enable_progress_bar=false)"),
    Case("train-threads-zero", "numdev-train", [*TRAIN, "threads=0"], "threads=0 must be a positive integer or null"),
    Case("bench-causal-string", "numdev-bench", [*BENCH, 'causal="false"'], "causal='false' must be true or false (unquoted: causal=false)"),
    Case("bench-seeds-type", "numdev-bench", [*BENCH, "seeds=abc"], "seeds='abc' must be a list of non-negative integers, e.g. [0,1]"),
    Case("bench-scale-type", "numdev-bench", [*BENCH, "inputs.scale=abc"], "inputs.scale='abc' must be a positive number"),
    Case("bench-scale-zero", "numdev-bench", [*BENCH, "inputs.scale=0"], "inputs.scale=0 must be a positive number"),
    # 7. files read back: schema-checked, the error names the file and the field
    Case("train-resume-run-json-list", "numdev-train", RESUME, "{tmp}/run/run.json: holds a list, not a mapping: the run record is corrupt",
         setup=_edit_run("run.json", lambda text: "[1, 2]"), intact=KEPT, refused_before_start=False),
    Case("train-resume-run-json-truncated", "numdev-train", RESUME,
         "{tmp}/run/run.json: not valid JSON (Unterminated string starting at at line 1): the run record is corrupt or truncated",
         setup=_edit_run("run.json", lambda text: '{"status": "fin'), intact=KEPT, refused_before_start=False),
    Case("train-resume-run-json-field", "numdev-train", RESUME, "{tmp}/run/run.json: field 'status' is a list, not a string",
         setup=_edit_run("run.json", lambda text: json.dumps({**json.loads(text), "status": ["finished"]})), intact=KEPT,
         refused_before_start=False),
    Case("train-resume-config-corrupt", "numdev-train", RESUME, "{tmp}/run/config.yaml: not valid YAML",
         setup=_edit_run("config.yaml", lambda text: "model: [unclosed\n"), intact=KEPT, refused_before_start=False),
    Case("train-resume-config-not-a-config", "numdev-train", RESUME, "{tmp}/run/config.yaml: field 'model' is missing",
         setup=_edit_run("config.yaml", lambda text: "just: text\n"), intact=KEPT, refused_before_start=False),
    Case("train-resume-instability-corrupt", "numdev-train", RESUME, "{tmp}/run/instability.json: field 'events' is missing",
         setup=_edit_run("instability.json", lambda text: "{}"), refused_before_start=False,
         intact=("run/config.yaml", "run/checkpoints/last.ckpt")),
    Case("compare-index-no-sha256", "numdev-compare", ["{tmp}/a", "{tmp}/b"], "index.json: snapshots[0]: field 'sha256' is missing",
         setup=_edit_index(lambda index: index["snapshots"][0].pop("sha256"))),
    Case("compare-index-no-param-shapes", "numdev-compare", ["{tmp}/a", "{tmp}/b"], "{tmp}/b/weights/index.json: field 'param_shapes' is missing",
         setup=_edit_index(lambda index: index.pop("param_shapes"))),
    # 8. trust nothing in a run directory: an index pointing outside weights/
    Case("compare-index-path-escape", "numdev-compare", ["{tmp}/a", "{tmp}/b"],
         "{tmp}/b/weights/index.json: step 0 lists file '../../a/weights/step_00000000.safetensors', not 'step_00000000.safetensors': the index was edited",
         setup=_edit_index(lambda index: index["snapshots"][0].update(file="../../a/weights/step_00000000.safetensors"))),
]
CATALOGUE_SIZE = len(CATALOGUE)


# -- running a command in-process ------------------------------------------------------------------
def _main(program: str):
    if program == "numdev-train":
        from numdev.train.app import main
    elif program == "numdev-bench":
        from numdev.bench.app import main
    elif program == "numdev-gather":
        from numdev.bench.gather import main
    elif program == "numdev-figure":
        from numdev.bench.figures import main
    elif program == "numdev-report":
        from numdev.report.app import main
    elif program == "numdev-compare":
        from numdev.analysis.compare import main
    elif program == "numdev-study":
        from numdev.analysis.study import main
    else:
        raise AssertionError(f"unknown program {program}")
    return main


def _invoke(program: str, args: list[str], monkeypatch) -> int:
    main = _main(program)
    try:
        if program in ("numdev-train", "numdev-bench"):  # Hydra apps read sys.argv
            # Hydra's logging setup would bind handlers to this test's captured stderr, which is
            # closed after the test: keep logging as it is.
            quiet = ["hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
            monkeypatch.setattr(sys, "argv", [program, *args, *quiet])
            monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
            main()
        else:
            main(args)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    finally:
        GlobalHydra.instance().clear()
    return 0


def _fail_writes_to(pattern: str, monkeypatch) -> None:
    """Make numdev.atomic's fsync fail with ENOSPC for files whose name contains `pattern`."""
    real_fsync = os.fsync

    def fsync(fd):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = pattern  # no /proc: fail every write
        if pattern in Path(target).name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(numdev.atomic.os, "fsync", fsync)


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


@pytest.mark.parametrize("case", CATALOGUE, ids=[c.id for c in CATALOGUE])
def test_bad_input(case: Case, tmp_path, monkeypatch, capsys):
    while HELD_LOCKS:  # a previous case's "other live run"
        HELD_LOCKS.pop().release()
    monkeypatch.chdir(tmp_path)
    if case.setup is not None:
        case.setup(tmp_path)
    before = {name: _digest(tmp_path / name) for name in case.intact}
    assert all(before.values()), f"the setup did not create {case.intact}"
    if case.fault is not None:
        _fail_writes_to(case.fault, monkeypatch)
    logged = []  # every logger.warning call (Hydra's logging is off in-process, so none is printed)
    monkeypatch.setattr(logging.Logger, "warning", lambda self, msg, *args, **kwargs: logged.append(str(msg) % args if args else str(msg)))
    capsys.readouterr()

    threads = torch.get_num_threads()
    try:
        code = _invoke(case.program, [a.format(tmp=tmp_path) for a in case.args], monkeypatch)
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    expect = case.expect.format(tmp=tmp_path)

    assert "Traceback" not in err, err
    if case.style == "hydra":
        assert code == 1 and expect in err, err
    elif case.style in ("warning", "quiet"):
        assert code == case.code, (code, err)
        assert not any(line.startswith(f"{case.program}: error:") for line in lines), err
        if case.style == "warning":  # on stderr, or logged
            warned = [line for line in [*lines, *logged] if expect in line]
            assert len(warned) == 1, (err, logged)
    else:
        assert code == case.code, (code, err)
        error_lines = [line for line in lines if line.startswith(f"{case.program}: error: ")]
        assert len(error_lines) == 1, err
        assert expect in error_lines[0], error_lines[0]
        if case.style == "ours":
            assert lines == error_lines, f"more than the error line on stderr: {err}"

    leftovers = [str(p) for p in tmp_path.rglob("*.tmp")]
    assert leftovers == [], leftovers
    for name, digest in before.items():
        assert _digest(tmp_path / name) == digest, f"{name} was changed"
    for name in case.extra.get("absent", ()):
        assert not (tmp_path / name).exists(), f"{name} exists"
    if case.after is not None:
        case.after(tmp_path)
    if case.program == "numdev-train" and case.refused_before_start:
        for name in ("run/weights", "run/checkpoints", "run/run.json", "run/config.yaml"):
            assert not (tmp_path / name).exists(), f"{name} was written by a run that was refused"


def test_the_readme_states_the_catalogue_size():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"{CATALOGUE_SIZE} bad inputs" in readme
