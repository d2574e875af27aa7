"""The bad-input catalogue: every user-facing command, fed bad input, says what is wrong in one line
and leaves no half-written output.

Each entry of CATALOGUE is one mistake: the command, its arguments, the text the error line must
contain, and optionally a setup (the broken input), a simulated write failure (a disk that fills
up: `fault` names the file whose write fails) and the files that must come out byte-for-byte
unchanged. Every entry is checked for:

- exit code 2 (a run that started and failed: 1; an input handled with a warning: 0, style
  "warning" - exactly one `<command>: warning:` or logged line containing `expect` - or "quiet"; Hydra's own composition errors that numdev does not catch first keep
  Hydra's exit code 1 and its few-line message, style "hydra"; argparse usage errors print the usage
  first, style "argparse");
- our errors: stderr is exactly one line, `<command>: error: ...`, containing `expect`;
- no Python traceback;
- no temporary file left anywhere, the `intact` files unchanged, and no run output (weights,
  checkpoints, run records) from a run refused before it started.

Commands run in-process (main() with its argv) to keep this fast; one mistake of each kind runs
through the real console script too (test_a_mistake_is_one_line_from_the_real_command). This file is
the one home of bad input: the catalogue, the real commands, and the checks behind the messages
(numdev.config.groups, numdev.config.preflight, the file readers). To add a mistake, append a Case;
`CATALOGUE_SIZE` in README.md's Reliability section counts them.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from helpers import REPO, png_bytes, run_numdev, tar_bytes, train_run
from hydra.core.global_hydra import GlobalHydra
from PIL import Image

import numdev.runs.atomic


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


_TRAINED: dict[tuple[str, ...], Path] = {}  # a finished 2-step run per set of overrides, made once per test process


def _finished_run(tmp: Path, *overrides: str) -> None:
    """A finished 2-step run made with `overrides`, copied into {tmp}/run: trained once per test process
    (a copied run directory is a run like any other: test_checkpoints.py's copied run resumes and compares)."""
    if overrides not in _TRAINED:
        made = Path(tempfile.mkdtemp(prefix="numdev-catalogue-run-")) / "run"
        atexit.register(shutil.rmtree, made.parent, True)
        threads = torch.get_num_threads()
        try:
            train_run("trainer.max_steps=2", *overrides, run_dir=made)
        finally:
            torch.set_num_threads(threads)
        _TRAINED[overrides] = made
    shutil.copytree(_TRAINED[overrides], tmp / "run", symlinks=True)


def _trained_run(tmp: Path) -> None:
    _finished_run(tmp)


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
    from numdev.weights.store import SnapshotWriter

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
    from numdev.runs.lock import RunLock

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
    Case("train-unknown-option", "numdev-train", [*TRAIN, "attention=flash_emulate"],
         "attention has no option 'flash_emulate': did you mean attention=flash_emulated"),
    Case("train-unknown-option-in-a-sweep", "numdev-train", ["-m", *TRAIN, "precision=fp32,bf16"],
         "precision has no option 'bf16': did you mean precision=bf16-true"),
    Case("train-unknown-tracker-in-a-list", "numdev-train", [*TRAIN, "logger=[tensorboard,mlfow]"],
         "logger has no option 'mlfow': did you mean logger=mlflow"),
    Case("train-group-set-to-null", "numdev-train", [*TRAIN, "logger=null"],
         "logger=null: a config group cannot be set to null: to choose none of its options, remove it with ~logger"),
    Case("train-unknown-experiment", "numdev-train", ["experiment=harm_confrm"], "did you mean experiment=harm_confirm"),
    Case("train-reference-is-a-file", "numdev-train", [*TRAIN, "sibling.reference={tmp}/ref"],
         "compares with sibling.reference={tmp}/ref, which is a file, not a run directory",
         setup=lambda tmp: (tmp / "ref").write_text("x")),
    Case("train-unknown-key", "numdev-train", [*TRAIN, "trainer.nope=1"], "trainer.nope=1: trainer has no setting nope: its settings are"),
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
    # a key the nested backend's _target_ does not take (output_noise's inner switched from eager to the Flash kernel)
    Case("train-nested-key", "numdev-train", [*TRAIN, "attention=output_noise", "attention.inner._target_=numdev.attention.SdpaFlash"],
         "attention.inner.precision is not a setting of attention.inner's _target_ (_Sdpa.__init__() got an unexpected keyword "
         "argument 'precision'): delete it with '~attention.inner.precision'"),
    Case("train-tile-zero", "numdev-train", [*TRAIN, "attention=flash_emulated", "attention.block_c=0"],
         "tile size block_c=0 must be a positive integer"),
    Case("train-tile-type", "numdev-train", [*TRAIN, "attention=flash_emulated", "attention.block_r=abc"],
         "tile size block_r='abc' must be a positive integer"),
    Case("train-heads", "numdev-train", [*TRAIN, "model.heads=3"], "not divisible by 3 heads"),
    # a forward-only attention (no backward pass) is refused before training, and before any job of a sweep
    Case("train-forward-only-cuda-model", "numdev-train",
         [*TRAIN, "attention=flash_emulated", "attention.formats.preset=fa2_cuda", "precision=bf16-true"],
         "attention=flash_emulated: the FA2 CUDA model (formats preset fa2_cuda) is forward only"),
    Case("train-forward-only-cpu-kernel-preset", "numdev-train",
         [*TRAIN, "attention=flash_emulated", "attention.formats.preset=cpu_sdpa", "precision=bf16-true"],
         "formats preset cpu_sdpa's numerics.exp=fexp_u20 and numerics.matmul=blas (PyTorch's CPU flash kernel, forward only)"),
    Case("train-forward-only-shadow-whose-gradients-are-compared", "numdev-train",
         [*TRAIN, "attention@shadow=flash_emulated", "shadow.formats.preset=fa2_cuda", "precision=bf16-true"],
         "attention@shadow=flash_emulated: the FA2 CUDA model (formats preset fa2_cuda) is forward only: train through the "
         "emulator with the fa2 preset (shadow.formats.preset=fa2); or compare its outputs only: callbacks.shadow.backward=false"),
    Case("train-attention-target-not-a-backend", "numdev-train", [*TRAIN, "attention._target_=torch.nn.Identity"],
         "attention._target_='torch.nn.Identity' builds a torch.nn.modules.linear.Identity, not an attention backend"),
    Case("train-shadow-target-not-a-backend", "numdev-train", [*TRAIN, "attention@shadow=eager", "shadow._target_=builtins.dict"],
         "shadow._target_='builtins.dict' builds a builtins.dict, not an attention backend"),
    Case("train-sweep-with-a-forward-only-job", "numdev-train",
         ["-m", *TRAIN, "attention=flash_emulated", "attention.formats.preset=fa2,fa2_cuda", "precision=bf16-true"],
         "sweep job 1 (attention.formats.preset=fa2_cuda): attention=flash_emulated: the FA2 CUDA model"),
    Case("train-backend-on-cpu", "numdev-train", [*TRAIN, "attention=flash_attn"], "cannot run here"),
    Case("train-flash-attn-unknown-kernel", "numdev-train", [*TRAIN, "attention=flash_attn", "attention.kernel=fa5"],
         "attention.kernel='fa5': use one of auto, fa2, fa3, fa4, fa3_fwd"),
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
    Case("train-disk-full-checkpoint", "numdev-train", TRAIN, "could not write {tmp}/run/checkpoints/last.ckpt",  # (its checksum first)
         fault="last.ckpt", refused_before_start=False, extra={"absent": ("run/checkpoints/last.ckpt",)}),
    # numdev-bench
    Case("bench-unknown-option", "numdev-bench", [*BENCH, "numerics=fastest"], "numerics has no option 'fastest': (its options: "),
    Case("bench-unknown-preset", "numdev-bench", [*BENCH, "numerics.preset=fastest"], "unknown numerics preset 'fastest'"),
    Case("bench-unknown-variant", "numdev-bench", [*BENCH, "variant=fa9"], "unknown flash variant 'fa9'"),
    Case("bench-rounding-bits", "numdev-bench", [*BENCH, "numerics.prob=bf16:sr0"], "the prob format: 'bf16:sr0': stochastic rounding takes 1-32 random bits"),
    Case("bench-rounding-unknown", "numdev-bench", [*BENCH, "numerics.accum=bf16:up"], "the accum format: unknown rounding 'up' in 'bf16:up': write rne"),
    Case("bench-rounding-seed", "numdev-bench", [*BENCH, "numerics.prob=bf16:sr", "numerics.seed=-1"], "numerics.seed=-1 must be a non-negative integer"),
    Case("bench-tile-zero", "numdev-bench", [*BENCH, "tiles.block_c=0"], "block_c=0 must be a positive integer"),
    Case("bench-unknown-figure", "numdev-bench", [*BENCH, "figure=nope"], "figure=nope: unknown figure 'nope'"),
    Case("bench-study-figure", "numdev-bench", [*BENCH, "figure=fig7"], "figure=fig7 is made by the study"),
    Case("bench-tile-type", "numdev-bench", [*BENCH, "tiles.block_r=abc"], "tiles.block_r='abc' must be a positive integer or null"),
    Case("bench-type-seq", "numdev-bench", [*BENCH, "shape.seq_q=abc"], "shape.seq_q='abc' must be a positive integer"),
    Case("bench-negative-seq", "numdev-bench", [*BENCH, "shape.seq_q=-3"], "shape.seq_q=-3 must be a positive integer"),
    Case("bench-overflow", "numdev-bench", [*BENCH, "inputs.scale=1000000"], "inputs overflow the input format fp16"),
    Case("bench-torn-results", "numdev-bench", BENCH, "{tmp}/bench/results.jsonl, line 2: incomplete record (no newline at the end): the file was truncated",
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
    Case("figure-other-experiment", "numdev-figure", ["fig3", "{tmp}/sweep"], "records of experiment 'fig4', not of fig3",
         setup=lambda tmp: _records(tmp, json.dumps({**json.loads(GOOD_RECORD), "experiment": "fig4"}) + "\n")),
    Case("figure-torn-results", "numdev-figure", ["fig3", "{tmp}/sweep"], "incomplete record (no newline at the end)",
         setup=lambda tmp: _records(tmp, '{"method": "fl')),
    # numdev-report
    Case("report-nothing", "numdev-report", ["--outputs", "{tmp}/outputs", "-o", "{tmp}/report"], "nothing to report"),
    Case("report-catalogue-missing", "numdev-report", ["--bench", "{tmp}/sweep", "--catalogue", "{tmp}/nowhere", "-o", "{tmp}/report"],
         "{tmp}/nowhere/summary.json does not exist: give the multirun directory of a finished numdev-train experiment=optimizations",
         setup=lambda tmp: _report_sweep(tmp)),
    Case("report-catalogue-not-one", "numdev-report", ["--bench", "{tmp}/sweep", "--catalogue", "{tmp}/study", "-o", "{tmp}/report"],
         "{tmp}/study/summary.json: no optimizations table",
         setup=lambda tmp: _report_sweep(tmp) or (tmp / "study").mkdir() or shutil.copyfile(
             REPO / "docs/results/flash_stability_early_summary.json", tmp / "study/summary.json")),
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
    # a section or a key the run reads deleted (~key): one line before the run's directory exists
    Case("train-delete-section", "numdev-train", [*TRAIN, "~trainer"], "~trainer: numdev-train reads trainer on every run, "
         "so deleting it would fail after the run's directory exists: choose another option (trainer=...) or change its keys"),
    Case("train-delete-scalar", "numdev-train", [*TRAIN, "~threads"], "~threads: numdev-train reads threads on every run, "
         "so deleting it would fail after the run's directory exists: set a value (threads=...) instead"),
    Case("train-delete-read-key", "numdev-train", [*TRAIN, "~optim.optimizer"],
         "the config has no optim.optimizer, which numdev-train reads (~optim.optimizer deleted it?): put it back or set it"),
    Case("bench-delete-section", "numdev-bench", [*BENCH, "~shape"], "~shape: numdev-bench reads shape on every run"),
    Case("bench-delete-read-key", "numdev-bench", [*BENCH, "~shape.batch"],
         "the config has no shape.batch, which numdev-bench reads (~shape.batch deleted it?)"),
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
    Case("train-deterministic-not-lightnings", "numdev-train", [*TRAIN, "trainer.deterministic=maybe"],
         "trainer.deterministic='maybe' must be true or false or warn or null"),
    Case("train-threads-zero", "numdev-train", [*TRAIN, "threads=0"], "threads=0 must be a positive integer or null"),
    Case("train-precision-gemm-unknown", "numdev-train", [*TRAIN, "precision=bf16-mixed", "precision.gemm=fastest"],
         "precision.gemm='fastest': use one of auto, native, fp32"),
    Case("bench-causal-string", "numdev-bench", [*BENCH, 'causal="false"'], "causal='false' must be true or false (unquoted: causal=false)"),
    Case("bench-seeds-type", "numdev-bench", [*BENCH, "seeds=abc"], "seeds='abc' must be a list of non-negative integers below 2^64, e.g. [0,1]"),
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
# -- reliability, round two (issue 23): whole classes, many variants each ------------------------------
def _good_shard(n: int = 6) -> bytes:
    png = png_bytes((200, 30, 30), size=(16, 16))
    return tar_bytes([m for i in range(n) for m in ((f"{i:03d}.png", png), (f"{i:03d}.txt", f"a red square {i}".encode()))])


def _member_offset(data: bytes, index: int) -> int:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getmembers()[index].offset


def _shard(data: bytes) -> Callable[[Path], None]:
    return lambda tmp: (tmp / "s.tar").write_bytes(data)


_GOOD = _good_shard()
_PNG = png_bytes((1, 2, 3), size=(16, 16))
SHARD = [*TRAIN, "data=webdataset", "data.shards={tmp}/s.tar", "data.shuffle_buffer=2"]
# 1. data that cannot be read: refused before the run starts (the shard's tar structure) ...
SHARDS_REFUSED = {
    "zero-bytes": (b"", "shard {tmp}/s.tar is empty (0 bytes)"),
    "empty-archive": (tar_bytes([]), "shard {tmp}/s.tar holds no samples"),
    "cut-at-a-member": (_GOOD[: _member_offset(_GOOD, 6)], "shard {tmp}/s.tar is truncated"),
    "cut-at-a-sample": (_GOOD[: _member_offset(_GOOD, 4)], "shard {tmp}/s.tar is truncated"),
    "cut-inside-data": (_GOOD[: _member_offset(_GOOD, 6) + 700], "shard {tmp}/s.tar is truncated"),
    "cut-inside-a-header": (_GOOD[: _member_offset(_GOOD, 6) + 100], "shard {tmp}/s.tar is truncated"),
    "end-marker-missing": (_GOOD[: _member_offset(_GOOD, 11) + 1024], "shard {tmp}/s.tar is truncated"),
    "gzip": (__import__("gzip").compress(_GOOD), "shard {tmp}/s.tar is gzip-compressed"),
    "text-file": (b"not a tar\n" * 300, "shard {tmp}/s.tar is truncated or not a tar file"),
}
# ... or ending the run that started, failed, in one line (what only reading every sample shows)
SHARDS_FAILED = {
    "no-sample-names": (tar_bytes([("README", b"x"), ("LICENSE", b"y")]), "shard {tmp}/s.tar holds no samples"),
    "all-garbage-images": (tar_bytes([m for i in range(3) for m in ((f"{i}.png", b"garbage"), (f"{i}.txt", b"c"))]),
                           "shard {tmp}/s.tar: none of its 3 sample(s) has an image that can be decoded"),
    "all-empty-images": (tar_bytes([m for i in range(2) for m in ((f"{i}.jpg", b""), (f"{i}.txt", b"c"))]),
                         "shard {tmp}/s.tar: none of its 2 sample(s) has an image that can be decoded"),
    "all-half-images": (tar_bytes([m for i in range(2) for m in ((f"{i}.png", _PNG[:40]), (f"{i}.txt", b"c"))]),
                        "shard {tmp}/s.tar: none of its 2 sample(s)"),
    "latin1-caption": (tar_bytes([("a.png", _PNG), ("a.txt", "café".encode("latin-1"))]),
                       "shard {tmp}/s.tar, sample 'a', .txt: not UTF-8 text (byte 0xe9"),
    "utf16-caption": (tar_bytes([("a.png", _PNG), ("a.txt", "a cat".encode("utf-16"))]),
                      "shard {tmp}/s.tar, sample 'a', .txt: not UTF-8 text (byte 0xff"),
}


def _failed_run(tmp: Path) -> None:
    run = json.loads((tmp / "run" / "run.json").read_text())
    assert run["status"] == "failed" and "shard" in run["error"] and "Traceback" not in run["error"], run


def _folder_with(caption: bytes, manifest: bytes | None = None) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        _images(tmp / "data")
        (tmp / "data" / "0.txt").write_bytes(caption)
        if manifest is not None:
            (tmp / "data" / "m.jsonl").write_bytes(manifest)

    return setup


def _grey_folder(mode: str) -> Callable[[Path], None]:
    """A folder of images in `mode` whose content is a mid grey (never pure white once converted)."""
    import numpy as np

    wide = {"I;16": (np.full((16, 16), 30000, np.uint16), "png"), "I": (np.full((16, 16), 30000, np.int32), "tiff"),
            "F": (np.full((16, 16), 0.4, np.float32), "tiff")}

    def setup(tmp: Path) -> None:
        (tmp / "data").mkdir(parents=True)
        for i in range(2):
            if mode in wide:
                image, suffix = Image.fromarray(wide[mode][0]), wide[mode][1]
            else:
                image, suffix = Image.new("RGB", (16, 16), (90, 90, 90)).convert(mode), "jpg" if mode == "CMYK" else "png"
            image.save(tmp / "data" / f"{i}.{suffix}")
            (tmp / "data" / f"{i}.txt").write_text(f"grey {i}")

    return setup


def _grey_not_white(tmp: Path) -> None:
    from numdev.data import FolderDataModule

    _finished(tmp)
    module = FolderDataModule(root=str(tmp / "data"), resolution=16, batch_size=1)
    module.setup()
    image = module.dataset[0]["image"]
    assert float(image.max()) < 0.9, float(image.max())  # a mid grey, not every pixel 1.0


CATALOGUE += [
    *(Case(f"train-shard-{name}", "numdev-train", SHARD, message, setup=_shard(data)) for name, (data, message) in SHARDS_REFUSED.items()),
    *(Case(f"train-shard-{name}", "numdev-train", SHARD, message, setup=_shard(data), refused_before_start=False, after=_failed_run)
      for name, (data, message) in SHARDS_FAILED.items()),
    *(Case(f"train-folder-caption-{enc}", "numdev-train", [*TRAIN, "data=folder", "data.root={tmp}/data"],
           f"{{tmp}}/data/0.txt: not UTF-8 text (byte {byte}", setup=_folder_with(text.encode(enc)))
      for enc, text, byte in (("latin-1", "café", "0xe9"), ("utf-16", "a cat", "0xff"), ("cp1252", "a “cat”", "0x93"),
                              ("shift_jis", "猫", "0x94"))),
    *(Case(f"train-folder-manifest-{enc}", "numdev-train", [*TRAIN, "data=folder", "data.root={tmp}/data", "data.manifest=m.jsonl"],
           f"manifest {{tmp}}/data/m.jsonl: not UTF-8 text (byte {byte}",
           setup=_folder_with(b"ok", json.dumps({"image": "0.png", "caption": text}, ensure_ascii=False).encode(enc) + b"\n"))
      for enc, text, byte in (("latin-1", "café", "0xe9"), ("utf-16", "a cat", "0xff"))),
    *(Case(f"train-folder-mode-{mode.replace(';', '')}", "numdev-train", [*TRAIN, "data=folder", "data.root={tmp}/data"], "",
           setup=_grey_folder(mode), style="quiet", code=0, refused_before_start=False, after=_grey_not_white)
      for mode in ("I;16", "I", "F", "LA", "P", "CMYK", "RGBA", "L")),
]


# 2. integrity of what is resumed from: a checkpoint changed after it was written; a snapshot rewritten
def _flip_checkpoint(where: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        import struct
        import zipfile

        _trained_run(tmp)
        path = tmp / "run" / "checkpoints" / "last.ckpt"
        raw = bytearray(path.read_bytes())
        with zipfile.ZipFile(path) as archive:
            spans = []
            for info in archive.infolist():
                if "/data/" in info.filename and info.file_size >= 8:
                    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
                    spans.append((info.header_offset + 30 + name_len + extra_len, info.file_size))
        start, size = sorted(spans, key=lambda s: -s[1])[0]
        offset, bit = {"low-bit": (start + size // 2, 0), "exponent": (start + 4 * (size // 8) + 3, 6),
                       "sign": (start + 3, 7), "first-byte": (start, 3), "last-byte": (start + size - 1, 5)}[where]
        raw[offset] ^= 1 << bit
        path.write_bytes(bytes(raw))

    return setup


def _rewrite_snapshot(dtype: str | None = None, shape: list[int] | None = None) -> Callable[[Path], None]:
    """Snapshot b/step 2 rewritten in another dtype (or shape), its index sha256 updated to match."""

    def setup(tmp: Path) -> None:
        import safetensors.torch

        _snapshots(tmp, "a")
        _snapshots(tmp, "b")
        path = tmp / "b" / "weights" / "step_00000002.safetensors"
        tensor = torch.full((3, 2), 2.0)
        tensor = tensor.to(getattr(torch, dtype)) if dtype else tensor.reshape(shape)
        data = safetensors.torch.save({"w": tensor}, metadata={"step": "2"})
        path.write_bytes(data)
        index_file = tmp / "b" / "weights" / "index.json"
        index = json.loads(index_file.read_text())
        for entry in index["snapshots"]:
            if entry["step"] == 2:
                entry["sha256"] = hashlib.sha256(data).hexdigest()
        index_file.write_text(json.dumps(index))

    return setup


CKPT_KEPT = ("run/checkpoints/last.ckpt", "run/weights/index.json", "run/run.json")
CATALOGUE += [
    *(Case(f"train-checkpoint-flip-{where}-{mode}", "numdev-train", [*TRAIN, "trainer.max_steps=4", f"resume={mode}"],
           "{tmp}/run/checkpoints/last.ckpt: its sha256 does not match last.ckpt.sha256", setup=_flip_checkpoint(where),
           intact=CKPT_KEPT, refused_before_start=False)
      for where in ("low-bit", "exponent", "sign") for mode in ("true", "auto")),
    Case("train-checkpoint-checksum-garbage", "numdev-train", RESUME, "{tmp}/run/checkpoints/last.ckpt.sha256: not a checksum record",
         setup=lambda tmp: _trained_run(tmp) or (tmp / "run/checkpoints/last.ckpt.sha256").write_bytes(b"\x00\xff garbage"),
         intact=CKPT_KEPT, refused_before_start=False),
    *(Case(f"train-checkpoint-checksum-deleted-{mode}", "numdev-train", [*TRAIN, "trainer.max_steps=4", f"resume={mode}"],
           "{tmp}/run/checkpoints/last.ckpt: its checksum file last.ckpt.sha256 is missing",
           setup=lambda tmp: _trained_run(tmp) or (tmp / "run/checkpoints/last.ckpt.sha256").unlink(),
           intact=CKPT_KEPT, refused_before_start=False)
      for mode in ("true", "auto")),
    *(Case(f"compare-snapshot-as-{dtype}", "numdev-compare", ["{tmp}/a", "{tmp}/b"],
           f"step_00000002.safetensors: tensor 'w' is {dtype}, not float32", setup=_rewrite_snapshot(dtype))
      for dtype in ("int32", "float16", "bfloat16", "float64", "int8", "int64", "uint8")),
    Case("compare-snapshot-reshaped", "numdev-compare", ["{tmp}/a", "{tmp}/b"], "its tensors do not match the param_shapes",
         setup=_rewrite_snapshot(shape=[2, 3])),
]


# 3. readers of the analysis tools: every record checked before anything is written
def _record(**fields) -> str:
    record = {"kind": "vs_golden", "method": "flash", "seed": 0, "metrics": {"max_abs": 1.0e-3}, "overrides": [], **fields}
    return json.dumps(record) + "\n"


def _sweep_of(jobs: dict[str, str], grid: list[str] | None = None) -> Callable[[Path], None]:
    """A sweep directory: job -> results.jsonl text; `grid`: multirun.yaml's task overrides; the previous
    table.csv and fig3.png that a failing command must leave alone."""

    def setup(tmp: Path) -> None:
        sweep = tmp / "sweep"
        for job, text in jobs.items():
            (sweep / job).mkdir(parents=True, exist_ok=True)
            (sweep / job / "results.jsonl").write_text(text)
        sweep.mkdir(parents=True, exist_ok=True)
        if grid is not None:
            (sweep / "multirun.yaml").write_text(json.dumps({"hydra": {"overrides": {"task": grid}}}))
        (sweep / "table.csv").write_text("the,previous\n")
        Image.new("RGB", (4, 4)).save(sweep / "fig3.png")

    return setup


OTHER_MACHINE = {"machine": {"cpu": "another CPU", "torch_threads": 1}, "versions": {"torch": "2.0"}, "git": {"commit": "abc"}}
BAD_SWEEPS = {
    "blank-line": ({"0": _record() + "\n" + _record(seed=1)}, None, "{tmp}/sweep/0/results.jsonl, line 2: blank line"),
    "blanked-record": ({"0": _record() + "   \n"}, None, "line 2: blank line where a record should be"),
    "duplicate": ({"0": _record() + _record(seconds=2.0)}, None, "line 2: the same measurement as line 1"),
    "copied-job": ({"0": _record(), "1": _record()}, None, "job 1 holds the same measurement as job 0"),
    "mixed-overrides": ({"0": _record(overrides=["shape.seq_q=2048"]) + _record(seed=1, overrides=["shape.seq_q=1024"])}, None,
                        "line 2: overrides ['shape.seq_q=1024'] differs from line 1's"),
    "mixed-experiment": ({"0": _record(experiment="fig3") + _record(seed=1, experiment="fig4")}, None, "line 2: experiment 'fig4' differs"),
    "mixed-machine": ({"0": _record() + _record(seed=1, provenance=OTHER_MACHINE)}, None, "line 2: measured on another machine or commit"),
    "forged-provenance": ({"0": _record(provenance={"machine": {"cpu": 3}})}, None,
                          "line 1: field 'provenance.machine.cpu' is an integer, not a string"),
    "provenance-list": ({"0": _record(provenance=[1])}, None, "line 1: field 'provenance' holds a list, not a mapping"),
    "nan-metric": ({"0": _record(metrics={"max_abs": float("nan")})}, None, "line 1: field 'metrics.max_abs' is nan, not a finite number"),
    "inf-metric": ({"0": _record(metrics={"max_abs": float("inf")})}, None, "field 'metrics.max_abs' is inf"),
    "string-metric": ({"0": _record(metrics={"max_abs": "0.001"})}, None, "field 'metrics.max_abs' is '0.001', not a finite number"),
    "metrics-list": ({"0": _record(metrics=[1, 2])}, None, "line 1: field 'metrics' is a list, not a mapping"),
    "no-metrics": ({"0": json.dumps({"kind": "pair", "method": "a-b", "seed": 0}) + "\n"}, None, "field 'metrics' is missing"),
    "no-kind": ({"0": json.dumps({"method": "flash", "seed": 0}) + "\n"}, None, "line 1: field 'kind' is missing"),
    "seed-string": ({"0": _record(seed="0")}, None, "line 1: field 'seed' is a string ('0'), not an integer"),
    "missing-job": ({"0": _record(), "2": _record(seed=2)}, ["seeds=0,1,2"], "job(s) 1 of the sweep's 3 have no results.jsonl"),
    "missing-last-jobs": ({"0": _record()}, ["numerics.precision=bf16,fp16", "seeds=0,1"], "job(s) 1, 2, 3 of the sweep's 4"),
    "extra-job": ({"0": _record(), "1": _record(seed=1), "7": _record(seed=7)}, ["seeds=0,1"], "job 7 is not one of the sweep's 2 jobs"),
    "binary-garbage": ({"0": "\udcff"}, None, "not UTF-8 text"),
}


def _bad_sweep(jobs, grid):
    def setup(tmp: Path) -> None:
        _sweep_of({j: t for j, t in jobs.items() if t != "\udcff"}, grid)(tmp)
        for job, text in jobs.items():
            if text == "\udcff":
                (tmp / "sweep" / job).mkdir(parents=True, exist_ok=True)
                (tmp / "sweep" / job / "results.jsonl").write_bytes(b"\xff\xfe\x00 garbage\n")

    return setup


CATALOGUE += [
    *(Case(f"{program}-{name}", program, args, message, setup=_bad_sweep(jobs, grid), intact=("sweep/table.csv", "sweep/fig3.png"),
           extra={"absent": ("sweep/fig3.json",)})
      for name, (jobs, grid, message) in BAD_SWEEPS.items()
      for program, args in (("numdev-gather", ["{tmp}/sweep"]), ("numdev-figure", ["fig3", "{tmp}/sweep"]))),
]


def _study_summary(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        study = tmp / "study"
        study.mkdir()
        summary = {"primary_metric": "m", "paper_metric": "m", "pairs": {"reference": {}}, "ratios": {},
                   "verdicts": {"metric": "m", "fig7": {"status": "holds", "rule": "r"}, "fig8": {"status": "holds", "rule": "r"}},
                   "role_order": [], "replicates": [0], "steps": 4, "captions": {}, "under_test": "flash",
                   "under_test_backend": "flash_emulated", "reference_backend": "baseline", "precision": "bf16-mixed",
                   "model": "dit_micro", "roles": {}, "growth_measure": "g"}
        edited = edit(summary)
        data = edited if isinstance(edited, bytes) else json.dumps(summary if edited is None else edited).encode()
        (study / "summary.json").write_bytes(data)
        (tmp / "report").mkdir()
        (tmp / "report" / "index.html").write_text("<html>the previous report</html>")

    return setup


REPORT_STUDY = ["--bench", "--study", "{tmp}/study", "-o", "{tmp}/report"]
BAD_SUMMARIES = {
    "pairs-reference-string": (lambda s: s["pairs"].update(reference="flash"), "field 'pairs.reference' is a string ('flash'), not a mapping"),
    "pairs-list": (lambda s: s.update(pairs=[1]), "field 'pairs' is a list, not a mapping"),
    "verdict-string": (lambda s: s["verdicts"].update(fig7="holds"), "field 'verdicts.fig7' holds a string"),
    "verdict-no-status": (lambda s: s["verdicts"]["fig8"].pop("status") and None, "field 'verdicts.fig8.status' is missing"),
    "verdict-missing": (lambda s: s["verdicts"].pop("fig7") and None, "field 'verdicts.fig7' is missing"),
    "extra-verdict-number": (lambda s: s["verdicts"].update(fig9=9), "field 'verdicts.fig9' holds an integer"),
    "no-backend": (lambda s: s.pop("under_test_backend") and None, "field 'under_test_backend' is missing"),
    "steps-nan": (lambda s: s.update(steps=float("nan")), "field 'steps' is nan"),
    "steps-string": (lambda s: s.update(steps="4"), "field 'steps' is a string ('4'), not an integer"),
    "a-list": (lambda s: [s], "holds a list, not a mapping"),
    "binary": (lambda s: b"\x89PNG\x00\xff", "not valid JSON (not UTF-8)"),
    "truncated": (lambda s: json.dumps(s)[:40].encode(), "not valid JSON"),
    "caption-number": (lambda s: s["captions"].update(fig8=8), "field 'captions.fig8' is an integer, not a string"),
    "inf-deep": (lambda s: s["ratios"].update(x={"m": {"estimate": {"value": float("inf"), "n": 1}}}), "field 'ratios.x.m.estimate.value' is inf, not a finite number"),
    "downstream-mean-string": (lambda s: s.update(downstream={"heldout_loss": {"label": "l", "roles": {"r": {"mean": {"value": "x", "n": 1}}}}}),
                               "field 'downstream.heldout_loss.roles.r.mean.value' is a string"),
}
CATALOGUE += [
    *(Case(f"report-study-summary-{name}", "numdev-report", REPORT_STUDY, f"{{tmp}}/study/summary.json: {message}" if name not in ("binary", "truncated", "a-list") else message,
           setup=_study_summary(edit), intact=("report/index.html",))
      for name, (edit, message) in BAD_SUMMARIES.items()),
]


def _older_and_unfinished(tmp: Path) -> None:
    """outputs/bench/fig3: an older finished sweep, and a newer one that never wrote fig3.json."""
    older = tmp / "outputs" / "bench" / "fig3" / "multirun_old"
    older.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(older / "fig3.png")
    (older / "fig3.json").write_text(json.dumps({"figure": "fig3", "caption": "measured", "verdict": "holds"}))
    newer = tmp / "outputs" / "bench" / "fig3" / "multirun_new"
    (newer / "0").mkdir(parents=True)
    os.utime(older, (1_000_000, 1_000_000))


CATALOGUE += [
    Case("report-falls-back-to-an-older-sweep", "numdev-report", ["--outputs", "{tmp}/outputs", "-o", "{tmp}/report"],
         "fig3: the newest run {tmp}/outputs/bench/fig3/multirun_new has no fig3.json (unfinished or failed): reporting the older",
         setup=_older_and_unfinished, style="warning", code=0),
]


# 5. config and resources: refused before anything is written, naming the key and what to do
def _fifo(name: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        _records(tmp, _record())
        os.mkfifo(tmp / name)

    return setup


CATALOGUE += [
    *(Case(f"train-betas-{name}", "numdev-train", [*TRAIN, f"optim.optimizer.betas={value}"],
           f"optim.optimizer.betas={shown} must be a list of 2 numbers, each in [0, 1)")
      for name, value, shown in (("empty", "[]", "[]"), ("one", "[0.9]", "[0.9]"), ("three", "[0.9,0.9,0.9]", "[0.9, 0.9, 0.9]"),
                                 ("above-one", "[0.9,1.5]", "[0.9, 1.5]"), ("negative", "[-0.1,0.9]", "[-0.1, 0.9]"),
                                 ("string", "abc", "'abc'"), ("strings", "[a,b]", "['a', 'b']"))),
    Case("train-optimizer-unknown-key", "numdev-train", [*TRAIN, "+optim.optimizer.foo=1"],
         "+optim.optimizer.foo=1: optim.optimizer (torch.optim.AdamW) has no setting foo, so nothing would read it"),
    Case("train-misspelled-key", "numdev-train", [*TRAIN, "trainer.max_step=2"],
         "trainer.max_step=2: trainer has no setting max_step: did you mean trainer.max_steps=2"),
    Case("train-misspelled-nested-key-in-sweep", "numdev-train", ["-m", *TRAIN, "optim.optimizer.llr=1e-3,2e-3"],
         "optim.optimizer has no setting llr: did you mean optim.optimizer.lr=1e-3"),
    Case("bench-misspelled-key", "numdev-bench", [*BENCH, "shape.seqq_q=64"], "shape has no setting seqq_q: did you mean shape.seq_q=64"),
    # a key under a node that is not there, and a deletion of a key that is not there: one line each, naming the deepest node
    Case("train-misspelled-node-in-a-path", "numdev-train", [*TRAIN, "attention=output_noise", "attention.iner.precision=fp32"],
         "attention.iner.precision=fp32: attention has no setting iner: did you mean attention.inner.precision=fp32?"),
    Case("train-key-under-a-missing-node", "numdev-train", [*TRAIN, "attention=output_noise", "attention.inner.formats.preset=fa2"],
         "attention.inner.formats.preset=fa2: attention.inner has no setting formats: its settings are _target_, precision"),
    Case("train-delete-a-misspelled-key", "numdev-train", [*TRAIN, "~trainer.max_step"],
         "~trainer.max_step: trainer has no setting max_step, so there is nothing to delete: did you mean ~trainer.max_steps"),
    Case("train-delete-under-a-missing-node", "numdev-train", [*TRAIN, "~attention.inner.precision"],
         "~attention.inner.precision: attention has no setting inner, so there is nothing to delete"),
    Case("train-delete-a-missing-top-level-key", "numdev-train", [*TRAIN, "~seeed"],
         "~seeed: numdev-train has no setting seeed, so there is nothing to delete: did you mean ~seed?"),
    Case("train-delete-with-another-value", "numdev-train", [*TRAIN, "attention=output_noise", "~attention.inner.precision=bf16-true"],
         "~attention.inner.precision=bf16-true: attention.inner.precision is fp32, not bf16-true, so it was not deleted"),
    Case("train-delete-a-null", "numdev-train", [*TRAIN, "attention=flash_emulated", "~attention.formats.input"],
         "~attention.formats.input: attention.formats.input is null (not set), and Hydra deletes no null: to drop it, give it a "
         "value first in the same command (attention.formats.input=0 ~attention.formats.input)"),
    Case("train-misspelled-target", "numdev-train", [*TRAIN, "attention=score_scale", "attention.inner._target_=numdev.attention.SdpFlash"],
         "attention.inner._target_=numdev.attention.SdpFlash cannot be imported: did you mean numdev.attention.SdpaFlash"),
    Case("train-target-of-a-missing-module", "numdev-train", [*TRAIN, "attention._target_=numdev.attentio.Eager"],
         "attention._target_=numdev.attentio.Eager cannot be imported: check its spelling"),
    Case("train-optimizer-replaced-without-target", "numdev-train", [*TRAIN, "~optim.optimizer", "+optim.optimizer.lr=0.1"],
         "optim.optimizer ({{lr}}) names no optimizer class (_target_): set optim.optimizer._target_=torch.optim.AdamW"),
    Case("train-optimizer-null", "numdev-train", [*TRAIN, "optim.optimizer=null"], "optim.optimizer (None) names no optimizer class"),
    Case("train-optimizer-target-deleted", "numdev-train", [*TRAIN, "~optim.optimizer._target_"],
         "names no optimizer class (_target_): set optim.optimizer._target_=torch.optim.AdamW (or another torch.optim class) with "
         "_partial_=true, or drop the override that deleted or replaced it (~optim.optimizer, ~optim.optimizer._target_, "
         "optim.optimizer=...)"),
    Case("train-optimizer-not-partial", "numdev-train", [*TRAIN, "optim.optimizer._partial_=false"],
         "optim.optimizer._partial_=False must be true: numdev-train gives the optimizer the model's parameters itself"),
    Case("train-optimizer-partial-deleted", "numdev-train", [*TRAIN, "~optim.optimizer._partial_"],
         "~optim.optimizer._partial_: numdev-train reads optim.optimizer._partial_, which must be true: numdev-train gives the "
         "optimizer the model's parameters itself; set optim.optimizer._partial_=true instead of deleting it"),
    Case("train-delete-a-checked-key", "numdev-train", [*TRAIN, "~trainer.max_steps"],
         "~trainer.max_steps: numdev-train reads trainer.max_steps, which must be a positive integer: the data stream is "
         "endless: set a value (trainer.max_steps=...) instead of deleting it"),
    Case("train-optimizer-not-an-optimizer", "numdev-train", [*TRAIN, "optim.optimizer._target_=torch.nn.Identity"],
         "optim.optimizer._target_=torch.nn.Identity is not a torch.optim.Optimizer: name an optimizer class"),
    Case("train-optimizer-setting-the-new-one-lacks", "numdev-train", [*TRAIN, "optim.optimizer._target_=torch.optim.SGD"],
         "optim.optimizer (torch.optim.SGD) has no setting betas: delete it (~optim.optimizer.betas)"),
    Case("train-optimizer-eps-negative", "numdev-train", [*TRAIN, "+optim.optimizer.eps=-1"], "optim.optimizer.eps=-1 must be a positive number"),
    *(Case(f"train-seed-{key}-{bits}bits", "numdev-train", [*TRAIN, f"{key}={2**bits + 1}"],
           f"{key}={2**bits + 1} must be a non-negative integer below 2^64")
      for key in ("seed.init", "seed.data", "seed.noise", "callbacks.samples.seed") for bits in (64, 100)),
    Case("bench-seeds-beyond-64-bits", "numdev-bench", [*BENCH, f"seeds=[0,{2**64}]"], f"seeds=[0, {2**64}] must be a list of non-negative integers below 2^64"),
    *(Case(f"{program}-unknown-top-level-{key.replace('+', 'plus').replace('.', '-')}", program, [*args, f"{key}=0.5"],
           f"{key}=0.5: {key.strip('+').split('.')[0]} is not a setting of {program}" + (f", and nothing would read it; did you mean {hint}=0.5?" if hint else ""))
      for program, args, key, hint in (("numdev-train", TRAIN, "+lr", "optim.optimizer.lr"), ("numdev-train", TRAIN, "++lr", "optim.optimizer.lr"),
                                       ("numdev-train", TRAIN, "+batch_size", "data.batch_size"), ("numdev-train", TRAIN, "+foo.bar", None),
                                       ("numdev-train", TRAIN, "+max_steps", "trainer.max_steps"), ("numdev-bench", BENCH, "+scale", "inputs.scale"),
                                       ("numdev-bench", BENCH, "+seq_q", "shape.seq_q"))),
    *(Case(f"train-memory-{name}", "numdev-train", [*TRAIN, override], "training needs at least ~")
      for name, override in (("batch", "data.batch_size=100000000"), ("hidden", "model.hidden=200000"), ("resolution", "data.resolution=100000"),
                             ("depth", "model.depth=10000000"), ("text-width", "model.text.width=400000"))),
    *(Case(f"{program}-output-onto-a-fifo", program, args, "{tmp}/out is a FIFO (named pipe), not a regular file", setup=_fifo("out"))
      for program, args in (("numdev-gather", ["{tmp}/sweep", "-o", "{tmp}/out"]),)),
    Case("gather-output-onto-a-device", "numdev-gather", ["{tmp}/sweep", "-o", "/dev/null"], "/dev/null is a character device, not a regular file",
         setup=lambda tmp: _records(tmp, _record())),
    Case("gather-output-under-a-file", "numdev-gather", ["{tmp}/sweep", "-o", "{tmp}/sweep/0/results.jsonl/table.csv"],
         "{tmp}/sweep/0/results.jsonl is not a directory", setup=lambda tmp: _records(tmp, _record())),
    Case("compare-output-onto-a-fifo", "numdev-compare", ["{tmp}/a", "{tmp}/b", "-o", "{tmp}/out"], "{tmp}/out is not a directory",
         setup=lambda tmp: _compare_pair(tmp) or os.mkfifo(tmp / "out")),
    Case("report-output-onto-a-fifo", "numdev-report", ["--bench", "{tmp}/sweep", "-o", "{tmp}/out"], "{tmp}/out is not a directory",
         setup=lambda tmp: _report_sweep(tmp) or os.mkfifo(tmp / "out")),
    *(Case(f"{program}-output-dir-{kind}", program, [*args], "cannot write the run's outputs under {tmp} (" + reason,
           fault=".numdev-write-probe", extra={"errno": code})
      for program, args in (("numdev-train", TRAIN), ("numdev-bench", BENCH))
      for kind, code, reason in (("full", errno.ENOSPC, "No space left"), ("read-only", errno.EROFS, "Read-only file system"),
                                 ("no-permission", errno.EACCES, "Permission denied"))),
    Case("bench-unknown-accum-format", "numdev-bench", [*BENCH, "numerics.accum=fp12"], "unknown float format 'fp12'"),
]


# 6. common mistakes: the same run twice, a sweep for a run, a setting of another option or app, a misspelt
# added key; a refused command leaves no run or sweep directory (a dated one is removed again, one that
# existed before is kept)
def _same_run(link: bool = False) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        _snapshots(tmp, "a")
        if link:
            (tmp / "link").symlink_to(tmp / "a")

    return setup


def _bit_identical_pair(tmp: Path) -> None:
    _snapshots(tmp, "a")
    shutil.copytree(tmp / "a", tmp / "copy")


def _said_bit_identical(tmp: Path) -> None:
    summary = json.loads((tmp / "a" / "compare_copy" / "compare.json").read_text())
    assert summary["bit_identical"] is True and summary["final"]["step"] == 2
    assert summary["final"]["max_abs"] == summary["final"]["mean_abs"] == summary["final"]["pooled_wasserstein"] == 0.0
    assert summary["provenance"]["machine"]["cpu"]


def _nothing_under(root: str) -> Callable[[Path], None]:
    def after(tmp: Path) -> None:
        made = sorted(str(p.relative_to(tmp)) for p in (tmp / root).rglob("*")) if (tmp / root).exists() else []
        assert made == [], made  # no run or sweep directory, no job run

    return after


def _image_folder_and(kept: str | None = None) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "images").mkdir()
        if kept:
            (tmp / kept).mkdir()

    return setup


def _kept_and_nothing_dated(kept: str | None = None) -> Callable[[Path], None]:
    def after(tmp: Path) -> None:
        assert not list((tmp / "outputs").glob("train/*/*"))  # no dated run directory
        if kept:
            assert (tmp / kept).is_dir()

    return after


REFUSED_BENCH = ["shape.seq_q=16", "shape.dim=16", "tiles.block_r=16", "tiles.block_c=16", "output_root={tmp}/outputs"]
NO_IMAGES = ["experiment=train_smoke", "data=folder", "data.root={tmp}/images", "output_root={tmp}/outputs"]

CATALOGUE += [
    *(Case(f"compare-the-same-run-{name}", "numdev-compare", ["{tmp}/a", other], "are the same run directory",
           setup=_same_run(link=name == "through-a-link"), extra={"absent": ("a/compare_a", "a/compare_link")})
      for name, other in (("twice", "{tmp}/a"), ("with-a-dot", "{tmp}/./a"), ("with-a-slash", "{tmp}/a/"), ("through-a-link", "{tmp}/link"))),
    Case("compare-a-sweep-for-a-run", "numdev-compare", ["{tmp}/sweep", "{tmp}/sweep/flash"],
         "{tmp}/sweep is a sweep holding 2 run(s), not one run: compare two runs ({tmp}/sweep/flash, ",
         setup=lambda tmp: _snapshots(tmp / "sweep", "reference") or _snapshots(tmp / "sweep", "flash")),
    Case("compare-bit-identical-runs", "numdev-compare", ["{tmp}/a", "{tmp}/copy"], "bit-identical at every compared step (2 steps)",
         setup=_bit_identical_pair, style="warning", code=0, after=_said_bit_identical),
    # Hydra would suggest +data.root, which then fails in ShapesDataModule's constructor.
    Case("train-setting-of-another-data-option", "numdev-train", ["data.root=/tmp/images", "output_root={tmp}/outputs"],
         "data.root is a setting of data=folder, not of data=shapes (the data in use): choose it too, e.g. ",
         after=_nothing_under("outputs")),
    Case("bench-group-of-numdev-train", "numdev-bench", ["trainer=gpu", "output_root={tmp}/outputs"],
         "trainer is a config group of numdev-train, not of numdev-bench: run ", after=_nothing_under("outputs")),
    *(Case(f"train-misspelt-added-key-{name}", "numdev-train", ["experiment=train_smoke", added, "output_root={tmp}/outputs"], expect,
           after=_nothing_under("outputs"))
      for name, added, expect in (
          ("optimizer", "+optim.optimizer.epss=1e-8",
           "optim.optimizer (torch.optim.AdamW) has no setting epss, so nothing would read it: did you mean optim.optimizer.eps?"),
          ("trainer", "+trainer.max_stepz=3", "did you mean trainer.max_steps or "))),
    *(Case(f"bench-refused-{name}-no-directory", "numdev-bench", [*args, *REFUSED_BENCH], expect, after=_nothing_under("outputs"))
      for name, args, expect in (
          ("format", ["numerics.precision=fp17"], "unknown float format 'fp17'"),  # found when the formats are built
          ("scale", ["inputs.scale=-1"], "inputs.scale=-1 must be a positive number"),  # the schema
          ("added-key", ["+shape.seqq=256"], "+shape.seqq=256: shape has no setting seqq, so nothing would read it: did you mean shape.seq_q or shape.seq_k?"),
          ("group", ["numeric=fa2"], "numeric=fa2: numdev-bench has no group or setting numeric: did you mean numerics=fa2?"),
          ("added-group", ["+numeric=fa2"], "+numeric=fa2: numeric is not a setting of numdev-bench, and nothing would read it; did you mean numerics=fa2?"),
          ("sweep-job", ["-m", "numerics.precision=bf16,fp17"], "sweep job 1 (numerics.precision=fp17): the precision format: unknown float format 'fp17'"),
          ("experiment-sweep-job", ["-m", "experiment=fig3", "inputs.scale=0"],
           "sweep job 0 (numerics.precision=bf16): inputs.scale=0 must be a positive number"))),
    # Refused inside the run (no images under data.root: found when the data is set up), after Hydra created
    # the run directory: the directory goes again; one that existed before is kept.
    Case("train-refused-run-leaves-no-dated-directory", "numdev-train", NO_IMAGES, "no images", setup=_image_folder_and(),
         after=_kept_and_nothing_dated()),
    Case("train-sweep-lists-a-job-twice", "numdev-train", ["experiment=flash_stability_smoke", "study.replicate=0,0", "hydra.sweep.dir={tmp}/study"],
         "study.replicate=0,0: lists 0 more than once, so the sweep would run the same job twice (in one directory): list each value "
         "of study.replicate once", extra={"absent": ("study",)}),
    Case("train-refused-run-keeps-its-own-directory", "numdev-train", [*NO_IMAGES, "hydra.run.dir={tmp}/mine"], "no images",
         setup=_image_folder_and("mine"), after=_kept_and_nothing_dated("mine")),
]

# 6. the harm study's controls (docs/study.md#ladder, docs/training.md): each bad value names its key
NOISE = [*TRAIN, "attention=output_noise"]
CATALOGUE += [
    Case("train-noise-mode-sideways", "numdev-train", [*NOISE, "attention.mode=sideways"], "attention.mode='sideways': use unbiased"),
    Case("train-noise-delta-zero", "numdev-train", [*NOISE, "attention.delta=0"], "attention.delta=0 must be a number in (0, 10]"),
    Case("train-noise-delta-eleven", "numdev-train", [*NOISE, "attention.delta=11"], "attention.delta=11 must be a number in (0, 10]"),
    *(Case(f"train-score-scale-{name}", "numdev-train", [*TRAIN, "attention=score_scale", f"attention.factor={value}"],
           f"attention.factor={shown} must be a number in (0, 64]")
      for name, value, shown in (("zero", "0", "0"), ("negative", "-2", "-2"), ("above", "65", "65"), ("nan", "nan", "nan"),
                                 ("inf", "inf", "inf"), ("bool", "true", "True"), ("string", "abc", "'abc'"))),
    Case("train-score-scale-forward-only-inner", "numdev-train",
         [*TRAIN, "attention=score_scale", "~attention.inner.precision", "attention.inner._target_=numdev.attention.FlashAttn"],
         "attention backend 'score_scale' cannot run here: no FlashAttention kernel is installed"),
    *(Case(f"train-{wrapper}-inner-null", "numdev-train", [*TRAIN, f"attention={wrapper}", "attention.inner=null"],
           f"attention.inner is null: attention={wrapper} computes attention with an inner backend")
      for wrapper in ("score_scale", "output_noise")),
    *(Case(f"train-{wrapper}-inner-deleted", "numdev-train", [*TRAIN, f"attention={wrapper}", "~attention.inner"],
           f"~attention.inner: attention (numdev.attention.{cls}) needs inner (it has no default)")
      for wrapper, cls in (("score_scale", "ScoreScale"), ("output_noise", "OutputNoise"))),
    # a key under a group with no option chosen; a deletion that another setting reads; two deletions in the wrong order;
    # a null that Hydra cannot delete (its reader wants it null, or a _target_ that does not take it)
    Case("train-key-of-an-unchosen-group", "numdev-train", [*TRAIN, "study.role=x"],
         "study.role=x: no study is chosen (the group study has no default option), so there is no study.role to set"),
    Case("train-add-a-key-of-an-unchosen-group", "numdev-train", [*TRAIN, "+study.role=x"],
         "+study.role=x: no study is chosen (the group study has no default option), so nothing would read study.role"),
    Case("train-delete-a-key-the-run-reads", "numdev-train", [*TRAIN, "~trainer.max_steps"],
         "~trainer.max_steps: numdev-train reads trainer.max_steps, which must be a positive integer"),
    Case("train-add-a-key-with-no-near-name", "numdev-train", [*TRAIN, "+trainer.foo=1"],
         "+trainer.foo=1: trainer (lightning.pytorch.Trainer) has no setting foo, so nothing would read it (numdev-train --cfg"),
    # ++ over a key an experiment writes outside its group (harm_smoke's study.kv_block, no study chosen) passes: the
    # error is the next one, a bad trainer.max_steps
    Case("train-force-add-over-an-experiment-key", "numdev-train",
         ["-m", "experiment=harm_smoke", "hydra.sweep.dir={tmp}/sweep", "++study.kv_block=4", "trainer.max_steps=0"],
         "trainer.max_steps=0 must be a positive integer"),
    Case("train-add-a-key-that-is-there", "numdev-train", [*TRAIN, "+trainer.max_steps=3"],
         "+trainer.max_steps=3: trainer.max_steps is already a setting (the config or an option chosen sets it), and + adds "
         "a new one: write trainer.max_steps=3 to change it"),
    Case("train-sweep-delete-in-one-job-only", "numdev-train",
         ["-m", "experiment=train_smoke", "hydra.sweep.dir={tmp}/sweep", "attention=score_scale,eager", "~attention.inner"],
         "sweep job 1 (attention=eager): ~attention.inner: attention has no setting inner, so there is nothing to delete"),
    Case("train-delete-a-key-another-reads", "numdev-train", [*TRAIN, "sibling.reference=0", "~sibling.reference"],
         "~sibling.reference: callbacks.sibling.reference reads it (${{sibling.reference}}), so deleting it would fail"),
    Case("train-deletions-in-the-wrong-order", "numdev-train", ["experiment=lr_edge", "hydra.run.dir={tmp}/run", "~seed.init", "~seed.data"],
         "~seed.init ~seed.data: seed.data reads seed.init, and Hydra reads a key as it deletes it: delete seed.data first"),
    # one key deleted and set in the same command: Hydra applies overrides in order
    Case("train-delete-then-set", "numdev-train", ["experiment=lr_edge", "hydra.run.dir={tmp}/run", "~seed.init", "seed.init=3"],
         "~seed.init seed.init=3: seed.init is deleted and then set, and Hydra cannot set a deleted key: drop ~seed.init"),
    Case("train-delete-then-set-under", "numdev-train", [*TRAIN, "~optim.optimizer", "optim.optimizer.lr=0.1"],
         "~optim.optimizer optim.optimizer.lr=0.1: optim.optimizer is deleted and then optim.optimizer.lr, under it, is set"),
    Case("train-sweep-then-delete", "numdev-train",
         ["-m", "experiment=lr_edge", "hydra.sweep.dir={tmp}/sweep", "seed.init=0,1", "~seed.init"],
         "seed.init=0,1 ~seed.init: the sweep sets seed.init and ~seed.init then deletes it in every job"),
    Case("train-delete-then-sweep", "numdev-train",
         ["-m", "experiment=lr_edge", "hydra.sweep.dir={tmp}/sweep", "~seed.init", "seed.init=0,1"],
         "~seed.init seed.init=0,1: seed.init is deleted and then set"),
    # deleted and added back is a replacement, even of a key another setting reads: the error is the next one
    *(Case(f"train-delete-then-add-back-{name}", "numdev-train",
           ["experiment=lr_edge", "hydra.run.dir={tmp}/run", "~seed.init", f"{plus}seed.init=3", "trainer.max_steps=0"],
           "trainer.max_steps=0 must be a positive integer") for name, plus in (("add", "+"), ("force-add", "++"))),
    Case("train-delete-then-add-back-in-the-wrong-order", "numdev-train",
         ["experiment=lr_edge", "hydra.run.dir={tmp}/run", "~seed.init", "~seed.data", "+seed.init=3"],
         "~seed.init ~seed.data: seed.data reads seed.init, and Hydra reads a key as it deletes it: delete seed.data first"),
    Case("train-delete-then-set-a-hydra-key", "numdev-train", [*TRAIN, "~hydra.job.chdir", "hydra.job.chdir=false"],
         "~hydra.job.chdir hydra.job.chdir=false: hydra.job.chdir is deleted and then set"),
    *(Case(f"train-null-a-key-of-another-option-{key}", "numdev-train", [*TRAIN, "attention=eager", f"attention.{key}=null"],
           f"attention.{key}=null: attention=eager (the attention in use) has no {key}, so there is nothing to make null: drop it")
      for key in ("inner", "factor")),
    Case("train-sweep-nulls-of-a-key-of-another-option", "numdev-train",
         ["-m", "experiment=train_smoke", "hydra.sweep.dir={tmp}/sweep", "attention=eager", "attention.inner=null,null"],
         "attention.inner=null,null: attention=eager (the attention in use) has no inner, so there is nothing to make null"),
    # the suggested command once kept the null, which attention=score_scale then refused
    Case("train-sweep-null-and-a-value-of-a-key-of-another-option", "numdev-train",
         ["-m", "experiment=train_smoke", "hydra.sweep.dir={tmp}/sweep", "attention=eager", "attention.factor=null,2"],
         "attention=score_scale attention.factor=2 (the job with null is attention=eager as it is, which has no factor: run it on its own)"),
    Case("train-delete-a-null-it-reads", "numdev-train", [*TRAIN, "~sibling.reference"],
         "~sibling.reference: sibling.reference is null (not set) already, and Hydra deletes no null"),
    Case("train-delete-a-null-its-target-refuses", "numdev-train",
         [*TRAIN, "attention=eager", "attention._target_=numdev.attention.SdpaFlash", "~attention.precision", "~attention.scores"],
         "~attention.scores: attention.scores is null (not set), and Hydra deletes no null: to drop it, give it a value first "
         "in the same command (attention.scores=0 ~attention.scores)"),
    Case("train-perturbation-step-negative", "numdev-train", [*TRAIN, "init_perturbation={{kind:relative,eps:1e-4,step:-1}}"],
         "init_perturbation.step=-1 must be a non-negative integer"),
    Case("train-perturbation-step-at-the-end", "numdev-train", [*TRAIN, "init_perturbation={{kind:ulp,step:4}}"],
         "init_perturbation.step=4 is not before trainer.max_steps=4"),
    Case("train-perturbation-ulp-with-eps", "numdev-train", [*TRAIN, "init_perturbation={{kind:ulp,eps:1e-4,step:2}}"],
         "init_perturbation.eps=0.0001: a ulp perturbation has no size"),
    *(Case(f"train-{name}-precision-{precision}", "numdev-train", [*TRAIN, f"optimization={name}", f"precision={precision}"],
           f"optimization={name} rounds the update of bf16 weights: it needs precision=bf16-true")
      for name in ("bf16_kahan", "bf16_sr") for precision in ("fp32", "bf16-mixed")),
    Case("train-bf16-sr-amsgrad", "numdev-train", [*TRAIN, "optimization=bf16_sr", "precision=bf16-true", "+optim.optimizer.amsgrad=true"],
         "optim.optimizer.amsgrad=True: optimization=bf16_sr is written for AdamW's plain single-tensor path"),
    Case("train-bf16-kahan-adam", "numdev-train", [*TRAIN, "optimization=bf16_kahan", "precision=bf16-true", "optim.optimizer._target_=torch.optim.Adam"],
         "optimization=bf16_kahan: optim.optimizer is Adam"),
    Case("train-seed-rounding-negative", "numdev-train", [*TRAIN, "optimization=bf16_sr", "precision=bf16-true", "seed.rounding=-1"],
         "seed.rounding=-1 must be a non-negative integer below 2^64"),
    # the held-out count, checked before the run (experiment=optimizations asks for the DiT's 256; the text holds fewer windows)
    Case("train-heldout-more-windows-than-the-text", "numdev-train", ["model=gpt_tiny", "hydra.run.dir={tmp}/run", "callbacks.heldout.num_images=100000"],
         "callbacks.heldout.num_images=100000: the held-out text has"),
    *(Case(f"train-heldout-count-{name}", "numdev-train", [*TRAIN, f"callbacks.heldout.num_images={value}"],
           f"callbacks.heldout.num_images={shown} must be a positive integer")
      for name, value, shown in (("zero", "0", "0"), ("text", "many", "'many'"))),
]

# -- reliability, round three (issue 32 item 3): each class of the adversarial pass, with variants ------------
def _trained_with(*overrides: str) -> Callable[[Path], None]:
    """A finished 2-step run in {tmp}/run made with `overrides` (e.g. without checkpoints)."""

    def setup(tmp: Path) -> None:
        _finished_run(tmp, *overrides)

    return setup


def _then(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        for step in steps:
            step(tmp)

    return setup


def _extend(path: str, size: int = 100 << 30) -> Callable[[Path], None]:
    """`truncate -s 100G path`: the file extended, sparse (no disk used), as a bad copy or a tool can leave it."""
    return lambda tmp: os.truncate(tmp / path, size)


def _no_checkpoints(tmp: Path) -> None:
    assert not (tmp / "run" / "checkpoints").exists()


NO_CKPT = ["callbacks.checkpoint=null"]
FINISHED_KEPT = ("run/run.json", "run/config.yaml", "run/weights/index.json", "run/weights/step_00000002.safetensors",
                 "run/eval.json", "run/heldout.json", "run/instability.json")
STUDY = ["experiment=flash_stability_early_smoke", "study.replicate=0", "hydra.sweep.dir={tmp}/sweep"]


def _user_option(name: str, text: str) -> Callable[[Path], None]:
    """A user's own optimization option, conf/optimization/<name>.yaml on hydra.searchpath."""

    def setup(tmp: Path) -> None:
        (tmp / "conf" / "optimization").mkdir(parents=True, exist_ok=True)
        (tmp / "conf" / "optimization" / f"{name}.yaml").write_text(text)

    return setup


USER_CONF = [*TRAIN, "hydra.searchpath=[file://{tmp}/conf]"]


def _study_run(role: str, kind: str, replicate: int = 0, where: str | None = None, snapshots: bool = False,
               csv: str | None = None, **config) -> Callable[[Path], None]:
    """One finished run of a hand-made study under {tmp}/study (config.yaml and run.json; snapshots and a
    sibling CSV when asked): what numdev-study reads before it computes anything."""
    import yaml

    def setup(tmp: Path) -> None:
        run = tmp / "study" / (where or f"r{replicate}/{role}")
        run.mkdir(parents=True)
        base = {"name": "s", "model": {"hidden": 32}, "data": {"resolution": 16, "batch_size": 4}, "trainer": {"max_steps": 2},
                "snapshot": {"every_n_steps": 2, "schedule": "every"}, "optim": {"optimizer": {"lr": 2.0e-3}, "warmup_steps": 0},
                "diffusion": {"p_uncond": 0.1}, "seed": {"init": replicate}, "precision": {"name": "fp32"},
                "study": {"role": role, "kind": kind, "replicate": replicate, "label": role}}
        for key, value in config.items():
            node = base
            *path, last = key.split("__")
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
        (run / "config.yaml").write_text(yaml.safe_dump(base))
        (run / "run.json").write_text(json.dumps({"status": "finished", "final_step": 2, "precision": "fp32"}))
        if snapshots:
            _snapshots(run.parent, run.name)
        if csv is not None:
            (run / "sibling").mkdir()
            (run / "sibling" / "reference.csv").write_text(csv)

    return setup


_CSV_HEAD = "step,tensor,numel,max_abs,mean_abs,rel_frobenius,wasserstein,w1_over_std,pooled_wasserstein\n"
_CSV_ROWS = "".join(f"{s},{t},6,0.1,0.1,0.1,0.1,0.1,0.1\n" for s in (0, 2) for t in ("w", "__model__"))


def _csv_study(text: str) -> Callable[[Path], None]:
    return _then(_study_run("reference", "reference", snapshots=True), _study_run("flash", "under_test", snapshots=True, csv=text))


def _all_new(names: tuple[str, ...]) -> Callable[[Path], None]:
    def after(tmp: Path) -> None:
        for name in names:
            assert "previous" not in (tmp / "cmp" / name).read_text(errors="replace"), name

    return after


def _old_compare(tmp: Path) -> None:
    _compare_pair(tmp)  # an earlier comparison's distances.csv ...
    (tmp / "cmp" / "distances.png").write_text("the previous figure")  # ... and its figure and record
    (tmp / "cmp" / "compare.json").write_text('{"the": "previous"}')


def _dir_at(path: str) -> Callable[[Path], None]:
    return lambda tmp: (tmp / path).mkdir(parents=True)


CATALOGUE += [
    # 1. resume that redoes finished work: a finished run is recognised from run.json and its final snapshot
    *(Case(f"train-resume-{mode}-finished-without-checkpoints", "numdev-train", [*TRAIN, "trainer.max_steps=2", *NO_CKPT, f"resume={mode}"],
           "", setup=_trained_with(*NO_CKPT), style="quiet", code=0, refused_before_start=False, intact=FINISHED_KEPT,
           after=_no_checkpoints) for mode in ("auto", "true")),
    Case("train-resume-auto-finished-without-snapshots-or-checkpoints", "numdev-train",
         [*TRAIN, "trainer.max_steps=2", *NO_CKPT, "callbacks.snapshots=null", "resume=auto"], "",
         setup=_trained_with(*NO_CKPT, "callbacks.snapshots=null"), style="quiet", code=0, refused_before_start=False,
         intact=("run/run.json", "run/config.yaml", "run/eval.json")),
    Case("train-rerun-over-a-run-without-snapshots-or-checkpoints", "numdev-train",
         [*TRAIN, "trainer.max_steps=2", *NO_CKPT, "callbacks.snapshots=null"], "already holds a run: add resume=true",
         setup=_trained_with(*NO_CKPT, "callbacks.snapshots=null"), refused_before_start=False, intact=("run/run.json", "run/config.yaml")),
    Case("train-resume-auto-finished-final-snapshot-deleted", "numdev-train", [*TRAIN, "trainer.max_steps=2", *NO_CKPT, "resume=auto"],
         "{tmp}/run/run.json says finished at step 2 but {tmp}/run/weights/step_00000002.safetensors is missing",
         setup=_then(_trained_with(*NO_CKPT), lambda tmp: (tmp / "run/weights/step_00000002.safetensors").unlink()),
         refused_before_start=False, intact=("run/run.json", "run/weights/index.json")),
    # 2. a study that cannot finish is refused before it starts; a reference nothing will make fails at once
    Case("train-study-without-its-reference", "numdev-train", [*STUDY, "study=truth,flash", "hydra.launcher.n_jobs=1"],
         "sweep job #1 (role flash, replicate 0) compares with sibling.reference r0/reference, which no job of the sweep makes "
         "and which does not exist", extra={"absent": ("sweep",)}),
    Case("train-study-reference-listed-after-its-comparer", "numdev-train", [*STUDY, "study=truth,flash,reference", "hydra.launcher.n_jobs=1"],
         "sweep job #1 (role flash, replicate 0) compares with r0/reference, which the sweep runs after it, one job at a time",
         extra={"absent": ("sweep",)}),
    Case("train-study-truthless-reference", "numdev-train", [*STUDY, "study=reference,flash"],
         "sweep job #0 (role reference, replicate 0) compares with sibling.reference r0/truth, which no job of the sweep makes",
         extra={"absent": ("sweep",)}),
    Case("train-sweep-reference-to-no-job", "numdev-train",
         ["-m", "experiment=train_smoke", "seed.init=0,1", "sibling.reference={tmp}/sweep/7", "hydra.sweep.dir={tmp}/sweep"],
         "sweep job #0 (seed.init=0) compares with sibling.reference 7, which no job of the sweep makes", extra={"absent": ("sweep",)}),
    Case("train-sibling-reference-missing-beside-this-run", "numdev-train", [*TRAIN, "sibling.reference={tmp}/nowhere"],
         "sibling.reference={tmp}/nowhere does not exist: give the directory of a numdev-train run", extra={"absent": ("run",)}),
    Case("train-sibling-reference-not-a-run", "numdev-train", [*TRAIN, "sibling.reference={tmp}/empty"],
         "this run compares with sibling.reference={tmp}/empty, which is not a numdev-train run (no run.json, and no process "
         "holds its run lock)", setup=_dir_at("empty"), extra={"absent": ("run",)}),
    Case("train-sweep-reference-is-its-own-sweep-directory", "numdev-train",
         ["-m", "experiment=train_smoke", "seed.init=0,1", "sibling.reference={tmp}/sweep", "hydra.sweep.dir={tmp}/sweep"],
         "sweep job #0 (seed.init=0) compares with sibling.reference={tmp}/sweep, which is not a numdev-train run",
         setup=_dir_at("sweep"), extra={"absent": ("sweep/0",)}),
    # 3. values silently dropped: a list for a group that takes one option
    *(Case(f"{program}-list-for-{group.replace('@', '-at-')}", program, [*args, f"{group}=[{a},{b}]"],
           f"{group}=[{a},{b}]: {group} takes one option, not a list: Hydra would merge {a}, {b} into one",
           extra={"absent": ("run", "bench")})
      for program, args, group, a, b in (
          ("numdev-train", TRAIN, "optimization", "fp8_linear", "fused_adamw"), ("numdev-train", TRAIN, "attention", "sdpa_flash", "eager"),
          ("numdev-train", TRAIN, "precision", "bf16-mixed", "fp16-mixed"), ("numdev-train", TRAIN, "model", "dit_tiny", "dit_small"),
          ("numdev-train", TRAIN, "data", "shapes", "folder"), ("numdev-train", TRAIN, "attention@shadow", "baseline", "eager"),
          ("numdev-train", TRAIN, "study", "flash", "noise"), ("numdev-bench", BENCH, "numerics", "fa2", "paper"),
          ("numdev-bench", BENCH, "inputs", "normal", "uniform"))),
    Case("train-sweep-of-a-list-for-a-group", "numdev-train", ["-m", *TRAIN, "optimization=none,[fp8_linear,fused_adamw]"],
         "optimization takes one option, not a list"),
    # 4. a study's parts checked against each other (numdev.analysis.consistency), sibling CSVs read strictly
    Case("study-role-copied-in-at-another-learning-rate", "numdev-study", ["{tmp}/study"],
         "{tmp}/study/r0/flash: optim.optimizer.lr = 0.003, but {tmp}/study/r0/reference has 0.002",
         setup=_then(_study_run("reference", "reference"), _study_run("flash", "under_test", optim__optimizer__lr=3e-3))),
    Case("study-rung-size-edited", "numdev-study", ["{tmp}/study"],
         "{tmp}/study/r0/eps_1e-6: study.ladder.size = 0.0001 but it ran with init_perturbation.eps = 1e-06",
         setup=_then(_study_run("reference", "reference"), _study_run("eps_1e-6", "ladder", study__ladder={"name": "init", "size": 1e-4},
                                                                       init_perturbation={"kind": "relative", "eps": 1e-6}))),
    Case("study-role-copied-in-at-another-resolution", "numdev-study", ["{tmp}/study"],
         "{tmp}/study/r0/noise: data.resolution = 32, but {tmp}/study/r0/reference has 16",
         setup=_then(_study_run("reference", "reference"), _study_run("noise", "control", data__resolution=32))),
    Case("study-claim-edited-in-one-replicate", "numdev-study", ["{tmp}/study"],
         "{tmp}/study/r1/lr_x10: role lr_x10 states kind, claim, claim_than = ('positive_control', 'no_harm', None), but its "
         "replicate 0 states ('positive_control', 'harms', None)",
         setup=_then(*(_study_run("reference", "reference", replicate=r) for r in (0, 1)),
                     _study_run("lr_x10", "positive_control", study__claim="harms"),
                     _study_run("lr_x10", "positive_control", replicate=1, study__claim="no_harm"))),
    Case("study-harm-study-without-its-reference", "numdev-study", ["{tmp}/study"],
         "is not a finished study: no run of kind 'reference' under r*/<role>/ (run its reference: numdev-train experiment=harm "
         "study=reference hydra.sweep.dir={tmp}/study)",
         setup=_study_run("ulp", "negative_control", study__claim="no_harm", study__analysis="harm")),
    Case("study-role-in-another-replicates-directory", "numdev-study", ["{tmp}/study"],
         "its config says role 'flash', replicate 1, but it sits in r0/flash",
         setup=_then(_study_run("reference", "reference"), _study_run("flash", "under_test", replicate=1, where="r0/flash"))),
    *(Case(f"study-sibling-csv-{name}", "numdev-study", ["{tmp}/study"], f"{{tmp}}/study/r0/flash/sibling/reference.csv, line {message}",
           setup=_csv_study(_CSV_HEAD + text))
      for name, text, message in (
          ("row-twice", _CSV_ROWS + "2,w,6,0.2,0.1,0.1,0.1,0.1,0.1\n", "6: step 2, tensor 'w' again (first on line 4)"),
          ("negative-distance", _CSV_ROWS.replace("2,w,6,0.1,0.1,0.1", "2,w,6,0.1,-0.1,0.1"), "4: column 'mean_abs' is -0.1, negative"),
          ("negative-rel-frobenius", _CSV_ROWS.replace("0,w,6,0.1,0.1,0.1", "0,w,6,0.1,0.1,-inf"), "2: column 'rel_frobenius' is -inf, negative"),
          ("negative-step", _CSV_ROWS.replace("0,__model__", "-1,__model__"), "3: step -1 is negative"),
          ("nan-distance", _CSV_ROWS.replace("2,__model__,6,0.1", "2,__model__,6,nan"), "5: column 'max_abs' is nan"))),
    # 6. documented combinations that crashed at step 0 now train (optimization x precision)
    *(Case(f"train-combination-{opt}-{precision}", "numdev-train", [*TRAIN, "trainer.max_steps=2", f"optimization={opt}", f"precision={precision}"],
           "", style="quiet", code=0, refused_before_start=False, after=_finished)
      for opt, precision in (("fused_adamw", "fp16-mixed"), ("fused_adamw", "bf16-mixed"), ("mxfp8_linear", "bf16-true"),
                             ("mxfp8_linear", "fp64"))),
    # 7. malformed optimization options and compile settings: one line before the run directory exists
    *(Case(f"train-user-optimization-{name}", "numdev-train", [*USER_CONF, "optimization=mine"], message,
           setup=_user_option("mine", text), extra={"absent": ("run",)})
      for name, text, message in (
          ("yaml-syntax", "_target_: numdev.optimizations.Optimization\nname: [unclosed\n",
           "{tmp}/conf/optimization/mine.yaml, line 3, column 1: not valid YAML"),
          ("target-not-importable", "_target_: numdev.optimizations.nope.Nope\nname: mine\n",
           "optimization._target_=numdev.optimizations.nope.Nope: Error loading"),
          ("target-not-an-optimization", "_target_: collections.OrderedDict\nname: mine\n",
           "optimization._target_=collections.OrderedDict builds a OrderedDict, not a subclass of numdev.optimizations.base.Optimization"),
          ("a-list", "- fused_adamw\n- compile\n", "optimization: its option file holds a list, not a mapping with a _target_"),
          ("no-target", "name: mine\n", "optimization: its option file has no _target_"),
          ("a-string", "just text\n", "optimization: its option file has no _target_"),
          ("bad-name", "_target_: numdev.optimizations.Optimization\nname: ''\n", "optimization.name='' must be the optimization's name"))),
    *(Case(f"train-compile-{name}", "numdev-train", [*TRAIN, "optimization=compile", override], message, extra={"absent": ("run",)})
      for name, override, message in (
          ("mode-unknown", "optimization.mode=fastest", "optimization.mode='fastest': use one of default, reduce-overhead, max-autotune"),
          ("submodule-unknown", "optimization.submodules=[nope]", "optimization.submodules: the model has no submodule 'nope'"),
          ("submodules-string", "optimization.submodules=text", "optimization.submodules='text' must be a list"),
          ("submodules-numbers", "optimization.submodules=[1,2]", "optimization.submodules=[1, 2] must be a list"))),
    # 8. damaged files are measured before they are read: sizes against the header or the record, duplicate steps
    Case("compare-snapshot-extended-to-100gb", "numdev-compare", ["{tmp}/a", "{tmp}/b"],
         "{tmp}/b/weights/step_00000002.safetensors: 107374182400 bytes, far more than a snapshot of this model holds",
         setup=_then(lambda tmp: _snapshots(tmp, "a") or _snapshots(tmp, "b"), _extend("b/weights/step_00000002.safetensors"))),
    Case("compare-snapshot-cut", "numdev-compare", ["{tmp}/a", "{tmp}/b"], "step_00000002.safetensors: sha256 does not match",
         setup=_then(lambda tmp: _snapshots(tmp, "a") or _snapshots(tmp, "b"), _extend("b/weights/step_00000002.safetensors", 100))),
    Case("compare-index-step-twice", "numdev-compare", ["{tmp}/a", "{tmp}/b"], "{tmp}/b/weights/index.json: lists step 2 twice",
         setup=_edit_index(lambda index: index["snapshots"].append(dict(index["snapshots"][-1])))),
    Case("compare-index-negative-step", "numdev-compare", ["{tmp}/a", "{tmp}/b"], "{tmp}/b/weights/index.json: lists step -2, a negative step",
         setup=_edit_index(lambda index: index["snapshots"][-1].update(step=-2, file="step_-0000002.safetensors"))),
    *(Case(f"train-checkpoint-extended-to-100gb-{mode}", "numdev-train", [*TRAIN, "trainer.max_steps=4", f"resume={mode}"],
           "{tmp}/run/checkpoints/last.ckpt is not a readable checkpoint (107374182400 bytes, far more than the",
           setup=_then(_trained_run, _extend("run/checkpoints/last.ckpt")), refused_before_start=False,
           intact=("run/run.json", "run/weights/index.json")) for mode in ("true", "auto")),
    Case("compare-index-extended-to-100gb", "numdev-compare", ["{tmp}/a", "{tmp}/b"],
         "{tmp}/b/weights/index.json: 107374182400 bytes, far more than a snapshot index holds",
         setup=_then(lambda tmp: _snapshots(tmp, "a") or _snapshots(tmp, "b"), _extend("b/weights/index.json"))),
    Case("gather-results-extended-to-100gb", "numdev-gather", ["{tmp}/sweep"],
         "{tmp}/sweep/0/results.jsonl: 107374182400 bytes, far more than a JSON-lines file of records holds",
         setup=_then(lambda tmp: _records(tmp, GOOD_RECORD), _extend("sweep/0/results.jsonl"))),
    Case("study-sibling-csv-extended-to-100gb", "numdev-study", ["{tmp}/study"],
         "{tmp}/study/r0/flash/sibling/reference.csv: 107374182400 bytes, far more than a table holds",
         setup=_then(_csv_study(_CSV_HEAD + _CSV_ROWS), _extend("study/r0/flash/sibling/reference.csv"))),
    Case("study-config-extended-to-100gb", "numdev-study", ["{tmp}/study"],
         "{tmp}/study/r0/flash/config.yaml: 107374182400 bytes, far more than a run config holds",
         setup=_then(_study_run("reference", "reference"), _study_run("flash", "under_test"), _extend("study/r0/flash/config.yaml"))),
    Case("train-checkpoint-checksum-extended-to-100gb", "numdev-train", RESUME,
         "{tmp}/run/checkpoints/last.ckpt.sha256: not a checksum record",
         setup=_then(_trained_run, _extend("run/checkpoints/last.ckpt.sha256")), refused_before_start=False, intact=CKPT_KEPT),
    Case("train-resume-run-json-extended-to-100gb", "numdev-train", RESUME, "{tmp}/run/run.json: 107374182400 bytes, far more than a run record holds",
         setup=_then(_trained_run, _extend("run/run.json")), refused_before_start=False, intact=("run/weights/index.json", "run/checkpoints/last.ckpt")),
    # 9. outputs written all or none; an earlier run's outputs replaced together
    Case("compare-output-png-is-a-directory", "numdev-compare", ["{tmp}/a", "{tmp}/b", "-o", "{tmp}/cmp"],
         "{tmp}/cmp/distances.png is a directory, not a regular file",
         setup=_then(_compare_pair, _dir_at("cmp/distances.png")), intact=("cmp/distances.csv",), extra={"absent": ("cmp/compare.json",)}),
    Case("compare-output-json-is-a-directory", "numdev-compare", ["{tmp}/a", "{tmp}/b", "-o", "{tmp}/cmp"],
         "{tmp}/cmp/compare.json is a directory, not a regular file",
         setup=_then(_compare_pair, _dir_at("cmp/compare.json")), intact=("cmp/distances.csv",)),
    Case("compare-disk-full-on-the-last-output", "numdev-compare", ["{tmp}/a", "{tmp}/b", "-o", "{tmp}/cmp"],
         "could not write {tmp}/cmp/compare.json: No space left", setup=_old_compare, fault="compare.json",
         intact=("cmp/distances.csv", "cmp/distances.png", "cmp/compare.json")),
    Case("compare-into-an-earlier-comparisons-directory", "numdev-compare", ["{tmp}/a", "{tmp}/b", "-o", "{tmp}/cmp"], "",
         setup=_old_compare, style="quiet", code=0, after=_all_new(("distances.csv", "distances.png", "compare.json"))),
    Case("figure-output-summary-is-a-directory", "numdev-figure", ["fig3", "{tmp}/sweep"], "{tmp}/sweep/fig3.json is a directory",
         setup=_then(_sweep_of({"0": _record()}), _dir_at("sweep/fig3.json")), intact=("sweep/table.csv", "sweep/fig3.png")),
    Case("figure-disk-full-on-the-summary", "numdev-figure", ["fig3", "{tmp}/sweep"], "could not write {tmp}/sweep/fig3.json: No space left",
         setup=_sweep_of({"0": _record()}), fault="fig3.json", intact=("sweep/table.csv", "sweep/fig3.png")),
    Case("report-page-is-a-directory", "numdev-report", ["--bench", "{tmp}/sweep", "-o", "{tmp}/out"], "{tmp}/out/index.html is a directory",
         setup=_then(_report_sweep, _dir_at("out/index.html")), extra={"absent": ("out/fig3.png",)}),
    Case("report-figure-name-is-a-directory", "numdev-report", ["--bench", "{tmp}/sweep", "-o", "{tmp}/report"],
         "{tmp}/report/fig3.png is a directory", setup=_then(_report_sweep, _dir_at("report/fig3.png")), intact=("report/index.html",)),
    # 10. every argument and method checked before the first computation
    Case("bench-method-that-cannot-run-here", "numdev-bench", [*BENCH, "seeds=[0,1]", "+attention@methods.cudnn=sdpa_cudnn"],
         "methods.cudnn: attention backend 'sdpa_cudnn' cannot run here", extra={"absent": ("bench",)}),
    Case("bench-seed-twice", "numdev-bench", [*BENCH, "seeds=[0,1,0]"], "seeds=[0, 1, 0] lists 0 more than once", extra={"absent": ("bench",)}),
]

# -- the harm study's pre-registered keys (issue 33): refused before any run, naming the key as typed ----------
HARM = ["experiment=harm_smoke", "study.replicate=0", "hydra.sweep.dir={tmp}/study"]


def _finished_reference(tmp: Path) -> None:
    """A study directory holding a finished reference of replicate 0 (a role added to it later compares with it)."""
    (tmp / "study" / "r0" / "reference").mkdir(parents=True)
    (tmp / "study" / "r0" / "reference" / "run.json").write_text(json.dumps({"status": "finished"}))


def _finished_reference_and_rung(tmp: Path) -> None:
    """A study holding finished runs of the reference and of delta_1e-1 (the role biased_1e-1 claims to harm more than)."""
    _finished_reference(tmp)
    (tmp / "study" / "r0" / "delta_1e-1").mkdir(parents=True)
    (tmp / "study" / "r0" / "delta_1e-1" / "run.json").write_text(json.dumps({"status": "finished"}))


def _role_of(override: str) -> str | None:
    return override.split("study=", 1)[1].split()[0] if "study=" in override else None


CATALOGUE += [  # a role is added to a study whose reference has finished (without it, its missing reference is said first)
    *(Case(f"harm-{name}", "numdev-train", [*HARM, *override.split(), *([] if _role_of(override) else ["study=reference"])], message,
           **({"setup": _finished_reference_and_rung, "intact": ("study/r0/reference/run.json",),
               "extra": {"absent": (f"study/r0/{_role_of(override)}",)}} if _role_of(override) else {"extra": {"absent": ("study",)}}))
      for name, override, message in (
          ("margin-negative", "study.harm.margin=-0.1", "study.harm.margin=-0.1 must be a number in (0, 10]"),
          ("margin-zero", "study.harm.margin=0", "study.harm.margin=0 must be a number in (0, 10]"),
          ("margin-string", "study.harm.margin=abc", "study.harm.margin='abc' must be a number"),
          ("margin-huge", "study.harm.margin=1e9", "study.harm.margin=1000000000.0 must be a number"),
          ("accuracy-margin-points", "study.harm.accuracy_margin=5", "study.harm.accuracy_margin=5 must be a number in (0, 1]"),
          ("outcome-unknown", "study.harm.outcome=accuracy", "study.harm.outcome='accuracy' must be one of heldout_loss"),
          ("lr-zero", "study.lr=0", "study.lr=0 must be a positive number"),
          ("lr-string", "study.lr=fast", "study.lr='fast' must be a positive number"),
          ("kv-block-zero", "study.kv_block=0", "study.kv_block=0 must be a positive integer"),
          ("claim-unknown", "study=ulp study.claim=hurts", "study.claim='hurts' must be one of harms, no_harm, more_harm_than or null"),
          ("claim-than-without-its-claim", "study=ulp +study.claim_than=delta_1e-1",
           "+study.claim_than=delta_1e-1: study has no setting claim_than, so nothing would read it: did you mean study.claim?"),
          ("claim-than-null", "study=biased_1e-1 study.claim_than=null", "study.claim=more_harm_than needs study.claim_than"),
          ("claim-than-itself", "study=biased_1e-1 study.claim_than=biased_1e-1", "study.claim_than='biased_1e-1' is the role itself"),
          ("claim-than-empty", "study=biased_1e-1 study.claim_than=''", "study.claim_than='' must be a name or null"),
          ("delta-above-10", "study=delta_1e0 study.attention.delta=11", "attention.delta=11 must be a number in (0, 10]"),
          ("noise-mode-unknown", "study=biased_1e-1 study.attention.mode=skewed", "attention.mode='skewed': use unbiased"),
      )),
    Case("harm-claim-than-no-role-of-the-study", "numdev-train", [*HARM, "study=biased_1e-1", "study.claim_than=delta_1e-11"],
         "role biased_1e-1: study.claim_than='delta_1e-11' is no role of this sweep and has no run in {tmp}/study",
         setup=_finished_reference, intact=("study/r0/reference/run.json",), extra={"absent": ("study/r0/biased_1e-1",)}),
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
        from numdev.bench.figure import main
    elif program == "numdev-report":
        from numdev.report.app import main
    elif program == "numdev-compare":
        from numdev.analysis.compare import main
    elif program == "numdev-study":
        from numdev.analysis.study import main
    else:
        raise AssertionError(f"unknown program {program}")
    return main


def _invoke(program: str, args: list[str], monkeypatch, logging_config: str = "disabled") -> int:
    main = _main(program)
    try:
        if program in ("numdev-train", "numdev-bench"):  # Hydra apps read sys.argv
            # Hydra's logging setup would bind handlers to this test's captured stderr, which is
            # closed after the test: keep logging as it is ("none": not configured, numdev's loggers
            # stay enabled, so caplog sees their lines).
            quiet = [f"hydra/job_logging={logging_config}", f"hydra/hydra_logging={logging_config}"]
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


def _fail_writes_to(pattern: str, monkeypatch, code: int = errno.ENOSPC) -> None:
    """Make numdev.runs.atomic's fsync fail with `code` (ENOSPC: a full disk) for files whose name contains `pattern`."""
    real_fsync = os.fsync

    def fsync(fd):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = pattern  # no /proc: fail every write
        if pattern in Path(target).name:
            raise OSError(code, os.strerror(code))
        return real_fsync(fd)

    monkeypatch.setattr(numdev.runs.atomic.os, "fsync", fsync)


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
        _fail_writes_to(case.fault, monkeypatch, case.extra.get("errno", errno.ENOSPC))
    logged = []  # every logger.warning call (Hydra's logging is off in-process, so none is printed)
    monkeypatch.setattr(logging.Logger, "warning", lambda self, msg, *args, **kwargs: logged.append(str(msg) % args if args else str(msg)))
    capsys.readouterr()

    code = _invoke(case.program, [a.format(tmp=tmp_path) for a in case.args], monkeypatch)
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


# -- the same promise from the real console scripts ------------------------------------------------
# One process per kind of message (ours from each kind of program, Hydra's, a mistake naming the fix as
# the user types it): the exit code and the stderr a user sees, which the in-process catalogue cannot show
# (an interpreter of its own, its logging set up by Hydra); the rest of each kind is in-process above. Commands printed in a message are shown as typed in the directory it runs
# in: {numdev-train} is the console script as numdev prints it from the repository's root.
REAL_COMMANDS = {
    "train-cannot-run-here": ("numdev-train", ["experiment=train_smoke", "attention=flash_attn", "output_root={tmp}/outputs"], None, 2,
                              ("numdev-train: error: attention=flash_attn with precision=fp32 on cpu", "cannot run here",
                               "Backends that can run on cpu with float32: baseline, eager, flash_emulated, output_noise, score_scale, sdpa_flash, sdpa_math")),
    "train-unknown-option": ("numdev-train", ["attention=sdpa_flsh", "output_root={tmp}/outputs"], None, 2, "did you mean attention=sdpa_flash"),
    "bench-group-of-another-app": ("numdev-bench", ["trainer=gpu", "output_root={tmp}/outputs"], REPO, 2,
                                   "numdev-bench: error: trainer is a config group of numdev-train, not of numdev-bench: run {numdev-train} trainer=gpu"),
    "compare-the-same-run": ("numdev-compare", ["{tmp}/a", "{tmp}/a/"], None, 2, "are the same run directory"),
}


@pytest.mark.parametrize("name", list(REAL_COMMANDS))
def test_a_mistake_is_one_line_from_the_real_command(name, tmp_path, monkeypatch):
    from numdev.cli.commands import script

    program, args, cwd, code, expect = REAL_COMMANDS[name]
    _snapshots(tmp_path, "a")
    before = _files(tmp_path)
    result = run_numdev(program, *(a.format(tmp=tmp_path) for a in args), cwd=cwd or tmp_path,
                    env={**os.environ, "HYDRA_FULL_ERROR": "0"})
    monkeypatch.chdir(cwd or tmp_path)  # the command as numdev prints it there
    assert result.returncode == code, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    for part in expect if isinstance(expect, tuple) else (expect,):
        for shown in ("numdev-train", "numdev-bench"):
            part = part.replace("{" + shown + "}", script(shown))
        assert part in result.stderr, result.stderr[-2000:]
    if code == 2:  # ours: exactly one line
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"{program}: error: "), result.stderr
    assert _files(tmp_path) == before  # nothing ran, nothing was written (a refused run's dated directory is gone)
    assert not list(tmp_path.glob("outputs/*/*/*"))


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


# -- what the command-line checks decide (numdev.config.groups, numdev.config.preflight) ---------------
@pytest.mark.parametrize(
    ("app", "args", "expected"),
    [
        ("train", ["+data.root=/tmp/images"], "e.g. {numdev-train} data=folder data.root=/tmp/images"),
        ("train", ["data.shards=/d/shard-0.tar"], "data.shards is a setting of data=webdataset, not of data=shapes"),
        ("train", ["experiment=train_gpu_base", "data.manifest=c.csv"], "data.manifest is a setting of data=folder, not of data=shapes"),
        ("train", ["experiment=fig4"], "experiment=fig4 is a numdev-bench experiment, not a numdev-train one: "
         "run {numdev-bench} experiment=fig4"),
        ("bench", ["experiment=flash_stability"], "experiment=flash_stability is a numdev-train experiment"),
        ("bench", ["-m", "trainer.max_steps=3,4"], "trainer.max_steps is a setting of numdev-train, not of numdev-bench"),
        ("train", ["numerics=fa2"], "numerics is a config group of numdev-bench, not of numdev-train"),
        ("bench", ["-m", "numerics.precision=bf16,fp16", "--help"], "--help with a sweep (a,b,c): Hydra's help cannot read sweeps"),
        ("bench", ["numerics=fastest", "numerics.precision=fp16"], "numerics has no option 'fastest': (its options: "),
    ],
)
def test_overrides_that_belong_elsewhere_are_named(app, args, expected):
    from numdev.cli.commands import script
    from numdev.config.groups import override_mistake

    for name in ("numdev-train", "numdev-bench"):
        expected = expected.replace("{" + name + "}", script(name))
    assert expected in (override_mistake(app, args) or "")


@pytest.mark.parametrize(
    ("app", "args"),
    [
        ("train", ["data=folder", "data.root=/x"]),  # the fix itself
        ("train", ["experiment=train_gpu_base", "data.resolution=64", "trainer.devices=2"]),
        ("train", ["trainer=ddp_cpu", "trainer.strategy=ddp"]),  # a key inherited from the option's defaults
        ("train", ["-m", "data=folder,shapes", "data.root=/x"]),  # a sweep over options: Hydra decides per job
        ("train", ["attention@shadow=baseline", "callbacks.shadow.every_n_steps=5"]),
        ("bench", ["numerics=fa2", "numerics.accum=bf16", "tiles.block_c=32", "shape.seq_q=128"]),
        ("bench", ["-m", "experiment=fig4", "hydra/launcher=parallel"]),
        ("bench", ["-m", "seeds=[0,1,2]", "--help"]),  # a list, not a sweep
        ("train", ["data.nope=1"]),  # a key no option has: Hydra's own error names it
    ],
)
def test_valid_overrides_pass_the_check(app, args):
    from numdev.config.groups import override_mistake

    assert override_mistake(app, args) is None


def test_every_experiment_belongs_to_one_app():
    """--help and the checks above tell the apps' experiments apart by the folder each is in
    (conf/<app>/experiment/): a name in both would be ambiguous."""
    from numdev.config.groups import experiment_app, options

    for name in options("experiment"):
        assert experiment_app(name) in ("bench", "train"), f"experiment {name} is in both conf/bench/experiment and conf/train/experiment"
    assert set(options("experiment", "bench")).isdisjoint(options("experiment", "train"))


def test_every_job_of_an_experiment_sweep_is_checked_before_the_first_runs():
    """experiment=flash_stability_smoke sweeps its roles and replicates by itself (hydra.mode=MULTIRUN in
    the experiment, no -m): a bad value set for all of them is refused naming the first job."""
    from numdev.config import preflight
    from numdev.train.run import check_config

    problem = preflight.problem("train", ["experiment=flash_stability_smoke", "optim.optimizer.lr=-1"], check_config)
    assert problem == ("sweep job 0 (study=truth study.replicate=0): optim.optimizer.lr=-1 must be a positive number; "
                       "no job was run")
    assert preflight.problem("train", ["experiment=flash_stability_smoke"], check_config) is None


def test_added_keys_a_constructor_takes_still_run():
    from hydra import compose, initialize_config_module
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from numdev.config.preflight import _added_key_problem

    parsed = OverridesParser.create().parse_overrides(["experiment=train_smoke", "+optim.optimizer.eps=1e-8", "+trainer.max_time=null"])
    with initialize_config_module(config_module="numdev.conf.train", version_base="1.3"):
        assert _added_key_problem("train", parsed, compose) is None


def test_an_added_key_that_reaches_a_constructor_names_the_option(tmp_path, monkeypatch, capsys):
    """Past the command-line check (e.g. an experiment adds the key): the constructor's TypeError is named."""
    from numdev.config.groups import unexpected_key
    from numdev.train import app

    assert unexpected_key("data", "root") == (
        "data.root is not a setting of the chosen data: it is one of data=folder; "
        "choose that option too (data=folder data.root=...) instead of +data.root"
    )
    assert unexpected_key("data", "nope") == ("data.nope is not a setting of data: remove +data.nope (or the experiment or config "
                                              "file that sets it for another option; see --help for the keys it has)")
    # through numdev-train, with the command-line check bypassed (an experiment could add the key)
    monkeypatch.setattr("numdev.config.groups.override_mistake", lambda app, args: None)
    monkeypatch.setattr("numdev.config.preflight.problem", lambda *args: None)
    monkeypatch.setattr(sys, "argv", ["numdev-train", "+data.root=/x", "experiment=train_smoke", f"output_root={tmp_path}",
                                      "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"])
    with pytest.raises(SystemExit) as exit_:
        try:
            app.main()
        finally:
            GlobalHydra.instance().clear()
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == "numdev-train: error: " + unexpected_key("data", "root")


def test_a_shadow_that_is_the_training_backend_warns(tmp_path):
    """attention@shadow=baseline with attention=baseline: every per-call deviation is 0, said loudly."""
    import warnings
    from types import SimpleNamespace

    from numdev.attention import build_backend
    from numdev.models.attention import Attention
    from numdev.train.callbacks.shadow import ShadowDeviation

    model = torch.nn.Sequential(Attention(32, 4, build_backend("baseline")))
    callback = ShadowDeviation(str(tmp_path), backend=build_backend("baseline"))
    with pytest.warns(UserWarning, match="attention@shadow is the training backend itself"):
        callback.setup(None, SimpleNamespace(model=model), "fit")
    callback.teardown(None, None, "fit")
    other = ShadowDeviation(str(tmp_path), backend=build_backend("sdpa_math"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        other.setup(None, SimpleNamespace(model=model), "fit")  # another backend: no warning
    other.teardown(None, None, "fit")


# -- the readers numdev gives the analysis tools (issue 23, class 3): every kind of damage, every file --
_RUN = {"status": "finished", "final_step": 4, "max_steps": 4, "resumes": [{"from_step": 2}], "seeds": {"init": 0}}
_CONFIG = {"model": {"hidden": 32}, "trainer": {"max_steps": 4}, "seed": {"init": 0},
           "study": {"role": "flash", "replicate": 0, "kind": "under_test", "label": "Flash"}}
_OUTCOME = {"heldout_loss": 0.25, "colour_accuracy": 0.5, "scored": 4, "step": 4}
READERS = {  # file -> (reader, good content, writer)
    "run.json": (lambda p: __import__("numdev.runs.layout").runs.layout.RunDir(p.parent).read_record(), _RUN, json.dumps),
    "config.yaml": (lambda p: __import__("numdev.runs.layout").runs.layout.RunDir(p.parent).read_study_config(), _CONFIG, lambda d: __import__("yaml").safe_dump(d)),
    "heldout.json": (lambda p: __import__("numdev.runs.layout").runs.layout.RunDir(p.parent).read_outcome("heldout_loss"), _OUTCOME, json.dumps),
    "eval.json": (lambda p: __import__("numdev.runs.layout").runs.layout.RunDir(p.parent).read_outcome("colour_accuracy"), _OUTCOME, json.dumps),
}
DAMAGE = {  # name -> (edit of the parsed content or raw bytes, per file: the field named, or None for the whole file)
    "a-list": (lambda d: [d], "holds a list, not a mapping"),
    "a-string": (lambda d: "just text", "holds a string"),
    "a-number": (lambda d: 42, "holds an integer"),
    "binary": (lambda d: b"\x00\xff\xfe garbage \x89", "not UTF-8"),
    "truncated": (lambda d: b"{\"status\": \"fin", "not valid"),
    "empty": (lambda d: b"", None),  # JSON: not valid; YAML: null
}
FIELD_DAMAGE = {  # file -> [(edit, field named)]
    "run.json": [(lambda d: d.update(status=["finished"]), "'status' is a list"), (lambda d: d.update(final_step="4"), "'final_step' is a string"),
                 (lambda d: d.update(resumes={"a": 1}), "'resumes' is a mapping"), (lambda d: d.update(resumes=[{"from_step": "2"}]), "'from_step' is a string"),
                 (lambda d: d.pop("status"), "'status' is missing"), (lambda d: d.update(seeds=[0]), "'seeds' is a list"),
                 (lambda d: d.update(provenance={"machine": {"cpu": 3}}), "'provenance.machine.cpu' is an integer"),
                 (lambda d: d.update(provenance={"git": {"dirty": "no"}}), "'provenance.git.dirty' is a string")],
    "config.yaml": [(lambda d: d.update(study="flash"), "'study' holds a string"), (lambda d: d["study"].update(role=3), "'study.role' is an integer"),
                    (lambda d: d["study"].update(replicate="0"), "'study.replicate' is a string"), (lambda d: d.update(model=[1]), "'model' is a list"),
                    (lambda d: d["study"].pop("role"), "'study.role' is missing"),
                    (lambda d: d["trainer"].update(max_steps=[4]), "'trainer.max_steps' is a list"),
                    (lambda d: d.update(optim={"warmup_steps": "5"}), "'optim.warmup_steps' is a string"),
                    (lambda d: d.update(precision=3), "'precision' is an integer")],
    "heldout.json": [(lambda d: d.update(heldout_loss="0.25"), "'heldout_loss' is a string"), (lambda d: d.update(heldout_loss=float("nan")), "'heldout_loss' is nan"),
                     (lambda d: d.update(heldout_loss=float("inf")), "'heldout_loss' is inf"), (lambda d: d.update(heldout_loss=[0.25]), "'heldout_loss' is a list"),
                     (lambda d: d.update(heldout_loss=True), "'heldout_loss' is a boolean")],
    "eval.json": [(lambda d: d.update(colour_accuracy="high"), "'colour_accuracy' is a string"), (lambda d: d.update(colour_accuracy=float("-inf")), "'colour_accuracy' is -inf"),
                  (lambda d: d.update(scored=4.5), "'scored' is a number, not an integer")],
}


def _damaged(tmp_path, name, edit):
    reader, good, write = READERS[name]
    content = json.loads(json.dumps(good))
    edited = edit(content)
    path = tmp_path / name
    if isinstance(edited, bytes):
        path.write_bytes(edited)
    else:
        path.write_text(write(content if edited is None else edited))
    return reader, path


@pytest.mark.parametrize("name", list(READERS))
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_reader_refuses_a_damaged_file_naming_it(name, damage, tmp_path):
    edit, message = DAMAGE[damage]
    reader, path = _damaged(tmp_path, name, edit)
    with pytest.raises(ValueError) as raised:
        reader(path)
    text = str(raised.value)
    assert text.startswith(f"{path}: ") and "\n" not in text, text
    assert message is None or message in text, text


@pytest.mark.parametrize(("name", "index"), [(n, i) for n, edits in FIELD_DAMAGE.items() for i in range(len(edits))])
def test_a_reader_names_the_damaged_field(name, index, tmp_path):
    edit, message = FIELD_DAMAGE[name][index]
    reader, path = _damaged(tmp_path, name, lambda d: edit(d) and None)  # the file, edited in place
    with pytest.raises(ValueError) as raised:
        reader(path)
    assert str(raised.value).startswith(f"{path}: ") and f"field {message}" in str(raised.value), raised.value


@pytest.mark.parametrize("name", list(READERS))
def test_a_reader_accepts_the_good_file(name, tmp_path):
    reader, path = _damaged(tmp_path, name, lambda d: None)
    assert reader(path) is not None


@pytest.mark.parametrize(("text", "message"), [
    ("step,tensor,numel,max_abs,mean_abs,rel_frobenius,wasserstein,w1_over_std,pooled_wasserstein\n0,w,6,nan,0,0,0,0,0\n",
     "line 2: column 'max_abs' is nan"),
    ("step,tensor,numel,max_abs,mean_abs,rel_frobenius,wasserstein,w1_over_std,pooled_wasserstein\n0,w,6,0,inf,0,0,0,0\n",
     "line 2: column 'mean_abs' is inf"),
    ("step,tensor,numel,max_abs,mean_abs,rel_frobenius,wasserstein,w1_over_std,pooled_wasserstein\n0,w,six,0,0,0,0,0,0\n",
     "not a table with the columns"),
    ("step,tensor\n0,w\n", "not a table with the columns"),
])
def test_a_sibling_csv_with_nan_or_garbage_names_the_file(text, message, tmp_path):
    from numdev.weights.metrics import read_distances_csv

    path = tmp_path / "sibling.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as raised:
        read_distances_csv(path)
    assert str(path) in str(raised.value)


def test_inf_where_numdev_writes_it_is_kept(tmp_path):
    """rel_frobenius and w1_over_std divide by a norm or a std that can be 0: inf and NaN are values there."""
    from numdev.weights.metrics import read_distances_csv

    path = tmp_path / "sibling.csv"
    path.write_text("step,tensor,numel,max_abs,mean_abs,rel_frobenius,wasserstein,w1_over_std,pooled_wasserstein\n0,w,6,0.1,0.1,inf,0.1,nan,0.1\n")
    assert read_distances_csv(path)[0]["rel_frobenius"] == float("inf")


# -- a bench stopped and rerun writes no record twice (issue 23, class 5) ----------------------------------
def test_a_bench_rerun_in_its_directory_writes_no_record_twice(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="numdev.bench.app")  # numdev's lines (Hydra's logging left unconfigured)
    args = [a.format(tmp=tmp_path) for a in [*BENCH, "seeds=[0,1]"]]
    assert _invoke("numdev-bench", args, monkeypatch, "none") == 0
    results = tmp_path / "bench" / "results.jsonl"
    first = results.read_text().splitlines()
    # an interrupted run: only its first record made it
    results.write_text(first[0] + "\n")
    assert _invoke("numdev-bench", args, monkeypatch, "none") == 0
    lines = results.read_text().splitlines()
    assert len(lines) == len(first) and lines[0] == first[0]
    assert "1 record(s) were already in" in caplog.text
    from numdev.bench.gather import gather

    assert len(gather(tmp_path / "bench")) == len(first)  # and gather counts each once


def test_a_figure_that_fails_after_drawing_writes_nothing(tmp_path, monkeypatch, capsys):
    """The figure is drawn into a staging directory: a failure after the PNG was drawn (here: NaN in
    a verdict) leaves table.csv, the figure and its summary as they were, and no staging directory."""
    import numdev.figures.fig3

    _sweep_of({"0": _record()})(tmp_path)
    before = {name: _digest(tmp_path / "sweep" / name) for name in ("table.csv", "fig3.png")}
    real = numdev.figures.fig3.summarise

    def drawn_then_failed(rows, out_dir):
        real(rows, out_dir)
        assert (Path(out_dir) / "fig3.png").is_file()  # it drew
        raise ValueError("a verdict on NaN")

    monkeypatch.setattr(numdev.figures.fig3, "summarise", drawn_then_failed)
    assert _invoke("numdev-figure", ["fig3", str(tmp_path / "sweep")], monkeypatch) == 2
    assert "a verdict on NaN" in capsys.readouterr().err
    assert {name: _digest(tmp_path / "sweep" / name) for name in ("table.csv", "fig3.png")} == before
    assert not (tmp_path / "sweep" / "fig3.json").exists()
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["0", "fig3.png", "table.csv"]


def test_a_figure_of_jobs_measured_on_different_machines_says_so(tmp_path, monkeypatch, capsys):
    """Jobs measured on two machines: the summary claims no single machine; it lists each job's."""
    from numdev.runs.provenance import provenance

    here = json.loads(json.dumps(provenance(seeds=[0])))
    here["machine"]["cpu"] = "CPU A"
    there = {**here, "machine": {**here["machine"], "cpu": "CPU B"}}
    _sweep_of({"0": _record(provenance=here), "1": _record(seed=1, provenance=there)})(tmp_path)
    assert _invoke("numdev-figure", ["fig3", str(tmp_path / "sweep")], monkeypatch) == 0
    summary = json.loads((tmp_path / "sweep" / "fig3.json").read_text())
    assert summary["provenance"] is None and set(summary["provenance_by_job"]) == {"0", "1"}
    assert "measured on 2 different machines or commits" in summary["caption"]
    _sweep_of({"0": _record(provenance=here), "1": _record(seed=1, provenance=here)})(tmp_path / "same")
    assert _invoke("numdev-figure", ["fig3", str(tmp_path / "same" / "sweep")], monkeypatch) == 0
    summary = json.loads((tmp_path / "same" / "sweep" / "fig3.json").read_text())
    assert summary["provenance"]["machine"]["cpu"] == "CPU A"  # the records' machine, not the one drawing the figure


def test_an_interrupted_bench_is_refused_by_gather_until_a_rerun_completes_it(tmp_path, monkeypatch, capsys):
    """SIGTERM in the middle of a bench (raised from its 2nd record, as the signal handler does):
    one line, exit 143, the records so far kept; gather refuses the job; a rerun completes it."""
    import signal as signals

    import numdev.bench.app as app
    import numdev.bench.runner as runner  # numdev-bench imports run_bench from it when a run starts

    args = [a.format(tmp=tmp_path) for a in [*BENCH, "seeds=[0,1]"]]
    real = runner.run_bench

    def stopped(cfg, emit):
        def emit_then_stop(record, count=[0]):  # noqa: B006 (a counter)
            emit(record)
            count[0] += 1
            if count[0] == 2:
                raise app._Interrupted(signals.SIGTERM)

        return real(cfg, emit=emit_then_stop)

    monkeypatch.setattr(runner, "run_bench", stopped)
    assert _invoke("numdev-bench", args, monkeypatch) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("numdev-bench: error: interrupted by SIGTERM: the 2 record(s) computed so far"), err
    from numdev.bench.gather import gather

    with pytest.raises(ValueError, match="the job was interrupted by SIGTERM after 2 record"):
        gather(tmp_path / "bench")
    monkeypatch.setattr(runner, "run_bench", real)
    assert _invoke("numdev-bench", args, monkeypatch) == 0
    assert len(gather(tmp_path / "bench")) == 6  # completed, each measurement once
