"""The one prepared GPU call of issue 37: each measurement in order of importance, each under its own time limit.

    python3 scripts/gpu_call.py --out $OUT --commit <sha>             # on the lent GPU (docs/gpu.md: the call)
    python3 scripts/gpu_call.py --device cpu --out /tmp/rehearsal     # here: the same steps, reduced, on the CPU

Steps, in this order (docs/gpu.md says why): `correctness` (pytest -m gpu: the Triton kernel, every
FlashAttention kernel installed, training with each backend), `kernels_bf16` and `kernels_fp16`
(scripts/gpu_kernels.py: the emulator against SDPA flash and cuDNN bit for bit, the Fig. 4 ratio with
real kernels), `mufu` (scripts/mufu_probe.py: MUFU.EX2 and MUFU.LG2 alone, bit for bit), `mma`
(scripts/mma_probe.py: one tensor-core instruction against the model's hypotheses of its sums), `triton` and `triton_causal` (scripts/bench_triton.py: TFLOP/s beside SDPA flash and
cuDNN), `lr_edge` (a learning-rate sweep, eager against Flash: experiment=lr_edge) and
`lr_edge_summary` (scripts/lr_edge.py). Each step runs as its own process group under a limit of
min(its budget, what is left of --budget); a step past its limit gets SIGTERM, then SIGKILL 10 s
later; a step that would start with less than its minimum left is skipped. A SIGTERM or SIGINT to this
script stops the running step's whole group and writes the record.

What --out holds is what the device machine sends back, whose limits (../.library/device/README.md)
are at most 8 files of at most 16 MiB, 64 MiB in all: the call's record, <out>/gpu_call.json (command,
limit, seconds, exit status, whether it timed out, its log and its outputs per step; provenance), each
step's result JSON, written there as the step runs (gpu_kernels.py rewrites its own after every cell),
and <out>/gpu_call_files.tar.gz: every step's log (logs/<step>.log), pytest's report, the kernels'
sampled outputs (gpu_kernels_<dtype>.safetensors, for gpu_kernels.py --from-samples here), the MUFU
probe's per-input distances (mufu_probe.npz), the tensor-core probe's summary and outputs (mma_probe.json,
mma_probe.npz), the sweep's
figure and its runs' small records (lr_edge_runs/<job>/), which the steps write in a scratch folder
(/tmp/numdev_gpu_call_<pid>_*, printed at the start; the learning-rate sweep itself runs there too).
The record and the archive are rewritten atomically after every step, so a call stopped at the
machine's limit still returns what it finished. The call checks what --out holds against those
limits at its end (the record's `returned`): a file more, or one too large, is one line and exit 1.
Exit status: 0 when every step ran and exited 0 (in a --device cpu rehearsal pytest's 5, "no GPU
test selected", counts as 0), else 1 (a step failed, timed out or was skipped); 2 for a bad argument.

--device cpu rehearses the same code paths at sizes that take seconds here: pytest selects no GPU test
(the files must still import), gpu_kernels.py runs on PyTorch's CPU flash kernel, bench_triton.py runs
numdev's Triton kernel in Triton's interpreter, and the sweep trains a small model for a few steps.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import functools
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from numdev.cli.commands import argv
from numdev.cli.errors import one_line
from numdev.cli.script_args import ScriptParser, at_least, run_script
from numdev.cli.workers import die_with_parent
from numdev.runs.atomic import write_bytes, write_text
from numdev.runs.provenance import provenance
from numdev.runs.scratch import scratch

REPO = Path(__file__).resolve().parents[1]
REHEARSAL = REPO / "docs" / "results" / "gpu_call_rehearsal_cpu.json"  # --write-docs copies a rehearsal's record here
DOC, BLOCK = REPO / "docs" / "gpu.md", "gpu-call-rehearsal"
# --write-docs image: a rehearsal under the GPU image's versions (.venv-gpu-image, scripts/gpu_image_venv.sh)
IMAGE_REHEARSAL, IMAGE_BLOCK = REPO / "docs" / "results" / "gpu_call_rehearsal_cpu_image.json", "gpu-call-image-rehearsal"
GPU_TESTS = ["tests/test_triton_kernel.py", "tests/test_flash_attn_backend.py", "tests/test_cli.py"]
LR_GRID = "3e-2,1e-1,1e-2,3e-1,3e-3,1,1e-3"  # from the middle out: a sweep cut short keeps the likely edge
GRACE_S = 10  # SIGTERM, then SIGKILL this much later
ARCHIVE = "gpu_call_files.tar.gz"  # under --out: the logs, pytest's report, the figure, the sweep's run records
SWEEP = "lr_edge_sweep"  # in the scratch folder, not packed: checkpoints and predictions are tens of MB
# What the device machine sends back from $OUT (../.library/device/README.md, "files back from $OUT")
RETURN_FILES, RETURN_FILE_BYTES, RETURN_BYTES = 8, 16 << 20, 64 << 20
RETURN_NAME = re.compile(r"[A-Za-z0-9._-]+")


@dataclass
class Step:
    name: str
    what: str  # what it measures (docs/gpu.md's table)
    budget_s: int  # its limit when that much of the call is left
    command: list[str]
    min_s: int = 20  # skipped when less than this is left
    outputs: list[str] = field(default_factory=list)  # written under --out, sent back as they are
    packed: list[str] = field(default_factory=list)  # written in the scratch folder, sent back in ARCHIVE
    ok_codes: tuple[int, ...] = (0,)
    collect: Path | None = None  # a sweep in the scratch folder: its jobs' small records are copied to <name>_runs/ beside it


RECORDS = ("run.json", "config.yaml", "heldout.json", "instability.json", "app.log", "continuations.json")


def collect_records(sweep: Path, into: Path) -> list[str]:
    """Copy each job's small records (kB; not its checkpoint, snapshots or predictions, tens of MB) from
    `sweep` to `into`/<job>/: what comes back from the GPU machine beside the summary."""
    copied = []
    for job in sorted(p for p in sweep.iterdir() if p.is_dir()) if sweep.is_dir() else []:
        for name in RECORDS:
            if (job / name).is_file():
                (into / job.name).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(job / name, into / job.name / name)
                copied.append(f"{into.name}/{job.name}/{name}")
    return copied


def pack(work: Path, into: Path) -> list[str]:
    """Write every file under `work` but the sweep itself into the gzipped tar `into`, atomically (a
    call stopped mid-write keeps the last whole archive); the members, relative to `work`."""
    members = sorted(str(path.relative_to(work)) for path in work.rglob("*")
                     if path.is_file() and not path.is_symlink() and path.relative_to(work).parts[0] != SWEEP)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name in members:
            archive.add(work / name, arcname=name, recursive=False)
    write_bytes(into, buffer.getvalue())
    return members


def keep_archive(work: Path, out: Path, manifest: dict) -> bool:
    """Pack `work` into <out>/ARCHIVE; False, with one line and the record's `archive_error`, where it cannot
    be written (a full disk): the record and the steps' own results are still written and the call goes on."""
    try:
        pack(work, out / ARCHIVE)
    except OSError as error:  # WriteError: the last whole archive, if any, is left as it was
        manifest["archive_error"] = one_line(error)
        print(f"gpu_call: error: {one_line(error)}", file=sys.stderr, flush=True)
        return False
    manifest.pop("archive_error", None)
    return True


def returned(folder: Path) -> tuple[list[dict], list[str]]:
    """What the device machine would send back from `folder`: ({name, bytes} per file) and one line per
    limit it breaks (too many files, a file too large or too deep, a name it refuses, too much in all)."""
    files = sorted(path for path in folder.rglob("*") if not path.is_dir())
    found = [{"name": str(path.relative_to(folder)), "bytes": path.lstat().st_size} for path in files]
    broken = []
    if len(found) > RETURN_FILES:
        broken.append(f"{len(found)} files, over the {RETURN_FILES} the device machine sends back")
    for entry in found:
        parts = Path(entry["name"]).parts
        if entry["bytes"] > RETURN_FILE_BYTES:
            broken.append(f"{entry['name']}: {entry['bytes'] / 2**20:.1f} MiB, over {RETURN_FILE_BYTES >> 20} MiB")
        if len(parts) > 3 or not all(RETURN_NAME.fullmatch(part) for part in parts):
            broken.append(f"{entry['name']}: too deep or a name other than letters, digits, '.', '_' and '-'")
    total = sum(entry["bytes"] for entry in found)
    if total > RETURN_BYTES:
        broken.append(f"{total / 2**20:.1f} MiB in all, over {RETURN_BYTES >> 20} MiB")
    return found, broken


def machine_code_read_here(block: dict) -> list[str] | None:
    """The committed scripts/kernel_sass.py results (docs/results/kernel_sass_*.json) that read the very torch CUDA
    library this call runs (the same SHA-256): the FA2 machine code the model was checked against is the code the
    GPU runs. None without a GPU (no library hash in the provenance)."""
    ran = block.get("versions", {}).get("torch_cuda_sha256")
    if not ran:
        return None
    found = []
    for path in sorted((REPO / "docs" / "results").glob("kernel_sass_*.json")):
        try:
            if json.loads(path.read_text(encoding="utf-8")).get("library_sha256") == ran:
                found.append(path.name)
        except (OSError, ValueError, AttributeError):  # a damaged result reads as not matching; the call goes on
            continue
    return found


def steps(device: str, out: Path, work: Path, workers: int) -> list[Step]:
    """The call's steps: results under `out`, everything else in the scratch folder `work`."""
    py = sys.executable
    script = lambda name: str(REPO / "scripts" / name)  # noqa: E731
    sweep = work / SWEEP
    if device == "cuda":
        # the lent H200 has 128 GiB (KINDS.md) but its memory starts small and grows as it is used: the
        # workers' cap is sized from the machine, not from MemAvailable at the start
        kernel_grid: list[str] = ["--workers", str(workers), "--memory-gib", "120"]
        triton_grid = ["--seq", "1024", "4096", "16384"]
        edge = ["trainer=gpu", f"optim.optimizer.lr={LR_GRID}"]
        pytest_extra = ["-n", "8"]
        probe_grid: list[str] = []
        mma_grid: list[str] = []
    else:  # the rehearsal: the same commands at sizes of seconds
        kernel_grid = ["--device", "cpu", "--n", "256", "1024", "--dims", "64", "--seeds", "0", "1",
                       "--heads", "2", "--compare-heads", "2", "--workers", str(workers)]
        triton_grid = ["--device", "cpu"]
        # the GPU sweep's data and context (1024 tokens, its held-out windows: the config is checked as it will run),
        # a narrow model for a few steps
        edge = ["optim.optimizer.lr=1e-2,10", "model.hidden=64", "trainer.max_steps=12", "data.batch_size=4", "threads=1"]
        pytest_extra = []
        probe_grid = ["--device", "cpu", "--size", "16", "--random-size", "14"]
        mma_grid = ["--device", "cpu", "--cases", "256"]
    return [
        Step("correctness", "pytest -m gpu: the Triton kernel, each FlashAttention kernel installed (forward, dQ/dK/dV), "
             "training with each backend", 150,
             [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *pytest_extra,
              f"--junitxml={work / 'pytest_gpu.xml'}", *GPU_TESTS],
             packed=["pytest_gpu.xml"], ok_codes=(0,) if device == "cuda" else (0, 5)),
        Step("kernels_bf16", "gpu_kernels.py, bf16: SDPA flash and cuDNN (and any FlashAttention installed) against the "
             "emulator bit for bit; Fig. 4 ratio with real kernels", 110,
             [py, script("gpu_kernels.py"), "--dtypes", "bf16", *kernel_grid, "--out", str(out / "gpu_kernels_bf16.json"),
              "--samples", str(work / "gpu_kernels_bf16.safetensors")],
             outputs=["gpu_kernels_bf16.json"], packed=["gpu_kernels_bf16.safetensors"]),
        Step("kernels_fp16", "the same in fp16", 90,
             [py, script("gpu_kernels.py"), "--dtypes", "fp16", *kernel_grid, "--out", str(out / "gpu_kernels_fp16.json"),
              "--samples", str(work / "gpu_kernels_fp16.safetensors")],
             outputs=["gpu_kernels_fp16.json"], packed=["gpu_kernels_fp16.safetensors"]),
        Step("mufu", "mufu_probe.py: MUFU.EX2 and MUFU.LG2 alone, bit for bit against correctly rounded float32, on "
             "FlashAttention's inputs (the FA2 model's last unknown functions)", 30,
             [py, script("mufu_probe.py"), *probe_grid, "--out", str(out / "mufu_probe.json"),
              "--out-arrays", str(work / "mufu_probe.npz")],
             min_s=10, outputs=["mufu_probe.json"], packed=["mufu_probe.npz"]),
        Step("mma", "mma_probe.py: one tensor-core instruction (HMMA.16816, FA2's; HGMMA, wgmma's) against the FA2 model's "
             "hypotheses of its sums, bit for bit", 30,
             [py, script("mma_probe.py"), *mma_grid, "--out", str(work / "mma_probe.json"),
              "--out-arrays", str(work / "mma_probe.npz")],
             min_s=10, packed=["mma_probe.json", "mma_probe.npz"]),
        Step("triton", "bench_triton.py: numdev's Triton kernel, TFLOP/s forward and forward+backward beside SDPA flash "
             "and cuDNN, perturbed formats", 80,
             [py, script("bench_triton.py"), *triton_grid, "--out", str(out / "bench_triton.json")],
             outputs=["bench_triton.json"]),
        Step("lr_edge", "numdev-train -m experiment=lr_edge: learning rates x {eager, sdpa_flash}, bf16", 150,
             [*argv("numdev-train"), "-m", "experiment=lr_edge", *edge, "attention=eager,sdpa_flash",
              "trainer.enable_progress_bar=false", f"hydra.sweep.dir={sweep}"], min_s=40, collect=sweep),
        Step("lr_edge_summary", "lr_edge.py: held-out loss against learning rate, the edge and the LR sensitivity per "
             "backend", 30,
             [py, script("lr_edge.py"), str(sweep), "--out", str(out / "lr_edge.json"), "--figure", str(work / "lr_edge.png")],
             min_s=5, outputs=["lr_edge.json"], packed=["lr_edge.png"]),
        Step("triton_causal", "bench_triton.py --causal", 60,
             [py, script("bench_triton.py"), *triton_grid, "--causal", "--out", str(out / "bench_triton_causal.json")],
             outputs=["bench_triton_causal.json"]),
    ]


def table(record: dict, image: bool = False) -> str:
    """docs/gpu.md's block: the call's steps, their limits on the GPU and what the rehearsal here did
    (image: the rehearsal under the GPU image's versions)."""
    from numdev.runs.provenance import machine_line

    plan = {step.name: step for step in steps("cuda", Path("$OUT"), Path("work"), 15)}
    where = "under `.venv-gpu-image` (scripts/gpu_image_venv.sh) " if image else ""
    lines = [f"Rehearsed {where}with `python scripts/gpu_call.py --device cpu --out <folder> --budget {record['budget_s']}` on "
             f"{machine_line(record['provenance'])}: {record['seconds']:.0f} s in all, exit "
             f"{'0' if all(s.get('ok') for s in record['steps']) and record['complete'] else '1'} "
             f"(the record: docs/results/{(IMAGE_REHEARSAL if image else REHEARSAL).name}). "
             "On the GPU each step's limit is its budget or what is left of 480 s.",
             "", "| step | what it measures | budget on the GPU (s) | rehearsal here: s, exit, outputs |", "| --- | --- | --- | --- |"]
    for entry in record["steps"]:
        if "skipped" in entry:
            done = f"skipped: {entry['skipped']}"
        else:
            files = entry.get("outputs", []) + [name for name in entry.get("packed", []) if "/" not in name]
            runs = len({name.split("/")[1] for name in entry.get("packed", []) if name.startswith(f"{entry['name']}_runs/")})
            done = (f"{entry['seconds']:.1f} s, exit {entry['rc']}" + (" (timed out)" if entry.get("timed_out") else "")
                    + (f", {', '.join(files)}" if files else "") + (f", the records of {runs} runs" if runs else ""))
        lines.append(f"| `{entry['name']}` | {plan[entry['name']].what} | {plan[entry['name']].budget_s} | {done} |")
    return "\n".join(lines)


class Stopped(Exception):
    """SIGTERM or SIGINT reached this script."""


def run_step(step: Step, limit: float, log: Path) -> dict:
    started = time.perf_counter()
    with open(log, "wb") as sink:
        child = subprocess.Popen(step.command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=functools.partial(die_with_parent, signal.SIGTERM))  # it dies with the call
        timed_out = stopped = False
        try:
            child.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
        except Stopped:
            stopped = True
        finally:
            if child.poll() is None:
                _end_group(child)
    record = {"rc": child.returncode, "seconds": round(time.perf_counter() - started, 1), "timed_out": timed_out}
    if stopped:
        record["stopped"] = "the call was stopped (SIGTERM or SIGINT) while this step ran"
    return record


def _end_group(child: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 5)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_plan(plan: list[Step], manifest: dict, deadline: float, out: Path, work: Path, record_path: Path) -> bool:
    """Run each step of `plan` in turn, rewriting the record and the archive after each; True when one
    failed, timed out, was skipped or the call was stopped."""
    def stop(signum, frame):
        raise Stopped

    failed = False
    handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for step in plan:
            entry = {"name": step.name, "command": " ".join(step.command), "budget_s": step.budget_s,
                     "log": f"{ARCHIVE}:logs/{step.name}.log"}
            left = deadline - time.monotonic()
            if left < step.min_s:
                entry["skipped"] = f"{left:.0f} s of the call left, under this step's minimum of {step.min_s} s"
                manifest["steps"].append(entry)
                failed = True  # asked for and not done
                continue
            entry["limit_s"] = round(min(step.budget_s, left), 1)
            print(f"gpu_call: {step.name} (limit {entry['limit_s']:.0f} s)", file=sys.stderr, flush=True)
            try:
                entry.update(run_step(step, entry["limit_s"], work / "logs" / f"{step.name}.log"))
            finally:
                entry["outputs"] = [name for name in step.outputs if (out / name).is_file()]
                entry["packed"] = [name for name in step.packed if (work / name).is_file()]
                if step.collect is not None:
                    entry["packed"] += collect_records(step.collect, work / f"{step.name}_runs")
                entry["ok"] = entry.get("rc") in step.ok_codes and not entry.get("timed_out")
                failed |= not entry["ok"]
                manifest["steps"].append(entry)
                failed |= not keep_archive(work, out, manifest)
                write_text(record_path, json.dumps(manifest, indent=1) + "\n")
            print(f"gpu_call: {step.name}: exit {entry['rc']}, {entry['seconds']} s"
                  + (" (timed out)" if entry["timed_out"] else ""), file=sys.stderr, flush=True)
            if "stopped" in entry:
                raise Stopped
        manifest["complete"] = True
    except Stopped:
        manifest["stopped"] = "SIGTERM or SIGINT: the call ended early"
        failed = True
    finally:
        manifest["seconds"] = round(manifest["budget_s"] - (deadline - time.monotonic()), 1)
        failed |= not keep_archive(work, out, manifest)
        write_text(record_path, json.dumps(manifest, indent=1) + "\n")
        for sig, handler in handlers.items():  # a signal from here on ends the call as it would any script
            signal.signal(sig, handler)
    return failed


def main(argv_=None) -> int:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", dest="folder", type=Path, required=True, help="a new or empty folder: gpu_call.json, the results and gpu_call_files.tar.gz")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--budget", type=at_least(1), default=480, help="seconds for the whole call (default 8 minutes)")
    parser.add_argument("--only", nargs="+", default=None, help="these steps only, in the call's order")
    parser.add_argument("--workers", type=at_least(1), default=None,
                        help="gpu_kernels.py's comparison processes (default: CPUs - 1 on cuda, 2 on cpu)")
    parser.add_argument("--limit", nargs="+", default=[], metavar="STEP=SECONDS",
                        help="a step's own limit instead of its budget (e.g. lr_edge=240 in a second call)")
    parser.add_argument("--write-docs", nargs="?", const="project", choices=["project", "image"], default=None,
                        help=f"after a complete --device cpu rehearsal: copy its record to {REHEARSAL.relative_to(REPO)} "
                             f"and rewrite {DOC.relative_to(REPO)}'s table; `image` for a rehearsal under .venv-gpu-image "
                             f"({IMAGE_REHEARSAL.relative_to(REPO)}, its own table)")
    parser.add_argument("--commit", default=None, help="the git commit the tree was copied from (the GPU machine has no .git)")
    args = parser.parse_args(argv_)
    deadline = time.monotonic() + args.budget
    workers = args.workers or (max(1, (os.cpu_count() or 2) - 1) if args.device == "cuda" else 2)
    names = [s.name for s in steps(args.device, args.folder, Path("work"), workers)]
    unknown = [n for n in args.only or [] if n not in names]
    if unknown:
        parser.error(f"--only {' '.join(unknown)}: no such step (steps: {', '.join(names)})")
    limits = {}
    for item in args.limit:
        name, _, seconds = item.partition("=")
        if name not in names or not seconds.isdigit() or int(seconds) < 1:
            parser.error(f"--limit {item}: give STEP=SECONDS, a step of {', '.join(names)} and a whole number of seconds >= 1")
        limits[name] = int(seconds)
    if args.write_docs and (args.device != "cpu" or args.only or args.limit):
        parser.error("--write-docs records a whole rehearsal: --device cpu, without --only or --limit")
    if args.write_docs:  # before the rehearsal's minutes: the doc can take its table
        from numdev.report.docblocks import check_blocks

        try:
            check_blocks((DOC, IMAGE_BLOCK if args.write_docs == "image" else BLOCK))
        except ValueError as error:
            parser.error(f"--write-docs: {error}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda but torch sees no CUDA GPU here; rehearse with --device cpu")
    record_path = args.folder / "gpu_call.json"
    if args.folder.is_dir() and any(args.folder.iterdir()):
        parser.error(f"--out {args.folder} is not empty: give a new or empty folder (a result left there by an "
                     "earlier call would be taken for this one's)")
    try:
        args.folder.mkdir(parents=True, exist_ok=True)
        os.close(os.open(record_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # a second call into it now is refused
    except FileExistsError as error:
        taken = error.filename == str(record_path)
        parser.error(f"--out {args.folder}: " + ("another gpu_call is writing there" if taken else
                                                 f"{error.filename} is a file, not a folder"))
    except OSError as error:
        parser.error(f"--out {args.folder}: {error.strerror or error}")

    manifest = {"what": "issue 37's prepared GPU call: each step's limit, time, exit status and outputs",
                "device": args.device, "rehearsal": args.device == "cpu", "budget_s": args.budget,
                "commit": args.commit, "workers": workers, "complete": False, "steps": [],
                "provenance": provenance(threads=None)}
    manifest["machine_code_read_here"] = machine_code_read_here(manifest["provenance"])
    write_text(record_path, json.dumps(manifest, indent=1) + "\n")
    with scratch("numdev_gpu_call_") as work:  # a killed call's is removed by the next call
        work = Path(work)
        (work / "logs").mkdir()
        print(f"gpu_call: logs and the sweep in {work}, packed into {args.folder / ARCHIVE} after every step",
              file=sys.stderr, flush=True)
        plan = [step for step in steps(args.device, args.folder.resolve(), work, workers) if step.name in (args.only or names)]
        for step in plan:
            if step.name in limits:
                step.budget_s, step.min_s = limits[step.name], min(step.min_s, limits[step.name])
        failed = run_plan(plan, manifest, deadline, args.folder, work, record_path)
    manifest["returned"], broken = returned(args.folder)
    if broken:
        manifest["returned_over_limits"] = broken
        print(f"gpu_call: error: --out {args.folder} holds more than the device machine sends back: {'; '.join(broken)}",
              file=sys.stderr)
        failed = True
    write_text(record_path, json.dumps(manifest, indent=1) + "\n")
    if args.write_docs and manifest["complete"]:
        from numdev.report.docblocks import replace_block

        image = args.write_docs == "image"
        try:
            write_text(IMAGE_REHEARSAL if image else REHEARSAL, json.dumps(manifest, indent=1) + "\n")
            replace_block(DOC, IMAGE_BLOCK if image else BLOCK, table(manifest, image))
        except (OSError, ValueError) as error:  # WriteError is an OSError; a doc without its markers a ValueError
            print(f"gpu_call: error: --write-docs: {one_line(error)}; the rehearsal's own record is {record_path}",
                  file=sys.stderr)
            return 1
    return 1 if failed else 0


if __name__ == "__main__":
    run_script(main)
