"""The flash emulator's per-block elementwise work as fused C kernels (kernels/flash_emulator.c).

Why: the emulator rounds after every operation, so each key/value block is a dozen passes over
the score block in ATen (or a few slow, partly unfused ones through torch.compile, whose exp and
row sum differ from ATen's). The C kernels do a block's elementwise work in two passes, with exp
taken from a table that ATen's own exp filled (`exp_table`), and leave the order-sensitive work to
ATen: the matmuls, the row sum, and exp of float32 arguments (the rescale factors, one per row).

The same library holds the fused model of PyTorch's CPU flash kernel (`cpu_flash_forward`, for
numerics=cpu_sdpa; numdev.attention.cpu_kernel), which calls the kernel's BLAS GEMM itself.

They apply where every stage's format is a native conversion from float32 and the score format
has 16 bits, so its 65,536 values can be tabulated (`supports`). The library is built once per
machine with the system C compiler into ~/.cache/numdev/native (or $NUMDEV_CACHE/native); no
compiler or a failed build warns once and the emulator runs its ATen path, which gives the same
bits. numdev.attention.flash_emulated also checks each format set once against that path
before using the kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.resources
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

from numdev.numerics.formats import FloatFormat, round_to
from numdev.numerics.stages import StageFormats

CODES = {"fp32": 0, "bf16": 1, "fp16": 2}  # the C enum of stage formats
_FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-fopenmp",
          "-shared", "-fPIC"]  # -ffp-contract=off: a fused multiply-add would change bits; -fopenmp: the
# cpu_sdpa model's parallel region (cpu_flash_forward) runs in the OpenMP runtime torch has loaded (libgomp.so.1)
_SIGNATURES = {
    "fa2_probs": ["p", "i", "i", "i", "i", "f", "c", "c", "c", "c", "i", "i", "p", "p", "p", "p", "p", "p"],
    "fa1_probs": ["p", "i", "i", "i", "i", "f", "c", "c", "c", "i", "i", "p", "p", "p", "p", "p"],
    "fa2_merge": ["i", "i", "i", "c", "c", "c", "c", "i", "i", "i", "p", "p", "p", "p", "p", "p", "p"],
    "fa1_merge": ["i", "i", "i", "c", "c", "c", "c", "i", "i", "i", "p", "p", "p", "p", "p", "p", "p"],
    "libm_expf": ["p", "p", "i"],
    "fexp_u20_array": ["p", "p", "i"],
    "cpu_flash_forward": ["p", "p", "p", "p", "i", "i", "i", "i", "f", "c", "i", "i", "i", "c", "p", "p", "p", "i", "c"],
    "blas_in_region": ["p", "c", "c", "c", "c", "c", "p", "c", "p", "c", "f", "p", "c", "c"],
}
_CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "c": ctypes.c_int, "f": ctypes.c_float}
_RETURNS = {"cpu_flash_forward": ctypes.c_int}  # 0: the packed K/V buffers could not be allocated
_failure: list[str] = []  # why the library is unavailable, once known


def supports(formats: StageFormats) -> bool:
    """Whether the kernels compute these formats (float32 working precision, 16-bit scores)."""
    return (
        formats.nearest_only
        and formats.working_dtype == torch.float32
        and formats.score.name in ("bf16", "fp16")
        and all(fmt.name in CODES for fmt in (formats.stats, formats.prob, formats.rescale, formats.accum))
    )


def code(fmt: FloatFormat) -> int:
    return CODES[fmt.name]


@functools.cache
def exp_table(held: FloatFormat, to: FloatFormat) -> torch.Tensor:
    """round_to(exp(x), to) for every x of the 16-bit format `held`, indexed by x's bit pattern.

    Made with ATen's exp on float32, which is what the ATen path computes for each such x.
    """
    patterns = torch.arange(2**16, dtype=torch.int32).to(torch.int16)  # 0x8000.. wrap to negatives
    values = patterns.view(held.torch_dtype).to(torch.float32)
    return round_to(torch.exp(values), to).contiguous()


def library() -> ctypes.CDLL | None:
    """The built kernels, or None (with one warning saying why) where they cannot be built."""
    if _failure:
        return None
    try:
        return _library()
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        _failure.append(str(error).splitlines()[0] if str(error) else type(error).__name__)
        warnings.warn(f"numdev's C kernels for the flash emulator are unavailable ({_failure[0]}); "
                      "running its ATen path, which gives the same bits, more slowly", stacklevel=2)
        return None


@functools.cache
def _library() -> ctypes.CDLL:
    compiler, source, built = _where_built()
    for attempt in (1, 2):
        if not built.exists():
            _build(compiler, source, built)
        try:
            lib = ctypes.CDLL(str(built))
            for name, kinds in _SIGNATURES.items():
                function = getattr(lib, name)
                function.argtypes = [_CTYPES[kind] for kind in kinds]
                function.restype = _RETURNS.get(name)
            return lib
        except (OSError, AttributeError) as error:
            if attempt == 2:
                raise OSError(f"{built} does not load as numdev's kernels: {error}") from error
            built.unlink(missing_ok=True)  # damaged, truncated or foreign: build it again, once
    raise AssertionError("unreachable")


def _where_built() -> tuple[str, bytes, Path]:
    """The compiler, the kernels' source, and the library's path: one file per source, flags,
    compiler version and CPU, so an edit or another machine never loads a stale build."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise RuntimeError("no C compiler (cc or gcc) on PATH; set CC to use one")
    source = importlib.resources.files("numdev.kernels").joinpath("flash_emulator.c").read_bytes()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256(b"\0".join([source, " ".join(_FLAGS).encode(), compiler.encode(), version.encode(),
                                     platform.machine().encode(), _cpu_flags().encode()])).hexdigest()[:24]
    cache = Path(os.environ.get("NUMDEV_CACHE") or Path.home() / ".cache" / "numdev") / "native"
    return compiler, source, cache / f"flash_emulator-{key}.so"


def _build(compiler: str, source: bytes, built: Path) -> None:
    built.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=built.parent) as scratch:
        source_copy, partial = Path(scratch) / "flash_emulator.c", Path(scratch) / built.name
        source_copy.write_bytes(source)
        result = subprocess.run([compiler, *_FLAGS, str(source_copy), "-o", str(partial), "-lm"],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} could not build flash_emulator.c: {result.stderr.strip()[:300]}")
        os.replace(partial, built)  # atomic: a concurrent run sees the whole library or none


def _cpu_flags() -> str:
    """The CPU's feature flags: a library built with -march=native runs only where they match."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def pointer(t: torch.Tensor | None) -> int | None:
    if t is None:
        return None
    if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError(f"C kernels take contiguous float32 CPU tensors, got {t.dtype} {tuple(t.shape)}")
    return t.data_ptr()
