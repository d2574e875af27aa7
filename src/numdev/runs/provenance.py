"""Where a number came from: the machine, the software and the code that produced it.

Results differ between CPUs (bf16 kernels differ between AMD EPYC and Intel Xeon with AMX), so
every summary.json, every bench record set and the report carry this block, and the report says
which machine it describes.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path

import numdev


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else platform's best guess."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_flags_of_interest() -> list[str]:
    """The instruction-set extensions that change low-precision CPU kernels' numbers."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return sorted(f for f in flags if f.startswith(("amx", "avx512_bf16", "avx512_fp16", "avx512f", "avx2")))
    return []


@lru_cache(maxsize=1)
def git_state() -> dict:
    """The numdev checkout's commit and whether its tree had uncommitted changes (None outside git)."""
    root = Path(numdev.__file__).resolve().parents[2]

    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip())
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


def torch_cuda_library() -> Path:
    """The installed torch's CUDA library (its kernels' machine code: scripts/kernel_sass.py reads it)."""
    import torch

    return Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"


def file_sha256(path: str | os.PathLike) -> str:
    """A file's SHA-256, read in blocks (never the whole file in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


@lru_cache(maxsize=1)  # one nvidia-smi and one hash per process: result files rewrite their provenance often
def gpu_details() -> tuple[dict, dict]:
    """On a CUDA machine, (machine fields, version fields): the GPU's compute capability and
    driver, cuDNN's and Triton's versions, and the SHA-256 of torch's CUDA library (whose kernels
    scripts/kernel_sass.py read on a machine without a GPU). Empty on a machine without one."""
    import torch

    if not torch.cuda.is_available():
        return {}, {}
    major, minor = torch.cuda.get_device_capability(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = None
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    try:
        library = file_sha256(torch_cuda_library())
    except OSError:
        library = None
    return ({"gpu_capability": f"{major}.{minor}", "gpu_driver": driver},
            {"cudnn": torch.backends.cudnn.version(), "triton": triton, "torch_cuda_sha256": library})


def provenance(seeds=None, threads: int | None = None) -> dict:
    """The block every result file carries: machine, threads, versions, git commit, seeds, date
    (and, on a CUDA machine, the GPU's driver and capability, cuDNN's and Triton's versions)."""
    import torch

    accelerator = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    gpu_machine, gpu_versions = gpu_details()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu_model(),
            "cpu_flags": cpu_flags_of_interest(),
            "logical_cpus": os.cpu_count(),
            "torch_threads": threads if threads is not None else torch.get_num_threads(),
            # the ISA torch's CPU kernels dispatch to: their results (torch.randn's too) can differ between DEFAULT and AVX2
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "gpu": accelerator,
            "platform": platform.platform(),
            **gpu_machine,
        },
        "versions": {
            "numdev": numdev.__version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            **gpu_versions,
        },
        "git": git_state(),
        "seeds": list(seeds) if seeds is not None else None,
    }


def machine_line(block: dict, commit: bool = True) -> str:
    """One line for a report header or a table caption: 'Intel Xeon …, 2 threads, torch 2.14.1, abc1234 (dirty)'.
    commit=False: the machine, the versions and the day only (for README's user text)."""
    machine, versions, git = block["machine"], block["versions"], block["git"]
    driver = f" (driver {machine['gpu_driver']})" if machine.get("gpu_driver") else ""
    gpu = f", GPU {machine['gpu']}{driver}" if machine.get("gpu") else ""
    where = f"{machine['cpu']}, {machine['torch_threads']} thread(s) of {machine['logical_cpus']}{gpu}; torch {versions['torch']}"
    if not commit:
        return f"{where}; {str(block['date'])[:10]}"
    state = (git.get("commit") or "no git")[:10] + (" (uncommitted changes)" if git.get("dirty") else "")
    return f"{where}, numdev {versions['numdev']} @ {state}; {block['date']}"


UNKNOWN_CPU = "an unknown CPU"


def cpu_kind(block: dict) -> str:
    """The CPU with what decides its bf16 kernels' rounding: 'Intel(R) Xeon(R) Processor (AMX)', 'AMD EPYC (AVX-512-BF16)',
    'AMD EPYC (AVX2 only)' (numdev's three CPU kinds differ in these; cpu_flags_of_interest records them). A block without
    them (forged, or older) gives 'an unknown CPU ...', never an error."""
    machine = block.get("machine") if isinstance(block, dict) else None
    if not isinstance(machine, dict) or not isinstance(machine.get("cpu"), str):
        return f"{UNKNOWN_CPU} (no provenance.machine.cpu)"
    if not isinstance(machine.get("cpu_flags"), list):
        return f"{machine['cpu']} (its instruction sets not recorded)"
    flags = {f for f in machine["cpu_flags"] if isinstance(f, str)}
    isa = ("AMX" if "amx_bf16" in flags else "AVX-512-BF16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags
           else "AVX2 only" if "avx2" in flags else "no AVX2")
    return f"{machine['cpu']} ({isa})"


UNKNOWN = "unknown (written before numdev recorded provenance)"


def machine_line_or_unknown(block: dict | None, commit: bool = True) -> str:
    if not isinstance(block, dict):
        return UNKNOWN
    try:
        return machine_line(block, commit)
    except (KeyError, TypeError, AttributeError):
        return UNKNOWN


def origin(block: dict | None) -> tuple | None:
    """What makes two results comparable: the machine (CPU, logical CPUs, GPU) and the code (versions,
    commit). The torch thread count is a setting of each run (threads=), not a different origin."""
    if not isinstance(block, dict):
        return None
    machine, versions, git = block.get("machine") or {}, block.get("versions") or {}, block.get("git") or {}
    return (
        machine.get("cpu"), machine.get("logical_cpus"), machine.get("gpu"),
        versions.get("torch"), versions.get("numdev"), git.get("commit"), git.get("dirty"),
    )


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else None (no check)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
