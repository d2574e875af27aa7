"""Stage formats: which float format every stage of an attention computation is rounded to.

For a query block Q_i and key/value blocks (K_j, V_j):

  input    Q, K, V
  score    S = Q_i K_j^T * scale
  stats    the running row max m and row sum l (the baseline: the softmax's exp values and row sum)
  prob     P = exp(S - m), the operand of P.V
  rescale  alpha = exp(m_old - m_new) (flash only)
  accum    the output accumulator O after each key/value block (the baseline: the P.V product)
  output   the final O

Every stage is computed in a working precision (float32 when every format fits in it, else
float64) and then rounded, once, to its format, by the format's rounding (numdev.numerics.formats:
numerics.prob=bf16:sr rounds P stochastically with 16 random bits, bf16:sr8 with 8, bf16:rtz toward
zero). The stochastic stages draw from one torch.Generator per StageFormats, seeded by `seed`
(numerics.seed), in the order the computation rounds: a rerun with the same seed gives the same bits. So a matmul is modelled as an accumulation in the
working precision rounded to the stage's format, as tensor cores accumulate in FP32.

Presets name the common combinations for a run precision p:
  paper     every stage in p: the paper's Baseline and emulation. Alone it does not give the
            paper's ~10x at BF16: the reconciliation's grid (numdev-bench experiment=reconcile,
            docs/microbenchmark.md) supports all-positive inputs (U[0, 1)), many key/value blocks
            and bf16 statistics or a bf16 accumulator (either alone; FA1 is not needed)
  fa2       FP32 score/stats/rescale/accum, input/prob/output in p: FlashAttention-2 and
            PyTorch's own kernels
  cpu_sdpa  PyTorch's CPU flash kernel: the fa2 formats and, for bf16/fp16, the kernel's own
            arithmetic (exp=fexp_u20, row_sum=lanes, matmul=blas; numdev.attention.cpu_kernel);
            its tiles come from the tile rule (tiles.rule=cpu_sdpa, numdev.attention.tiles), not
            from this label
  fa2_cuda  FlashAttention-2's CUDA forward (SDPA's FLASH_ATTENTION on SM80/SM90): the fa2 formats and,
            for bf16/fp16, the kernel's arithmetic (exp=exp2, row_sum=quad, matmul=aten;
            numdev.attention.cuda_kernel); its tiles and split-KV count come from the caller
            (cuda_kernel.schedule), not from this label. Not yet compared with a GPU
  eager     what eager PyTorch computes for softmax(q @ k^T * scale) @ v on bf16/fp16 tensors on
            CPU: S rounded to p (the matmul, then the scaled product), the softmax's internals
            (S - max, exp, row sum) in FP32 with P rounded once to p, P.V accumulated in FP32 and
            rounded to p. The real Baseline (Baseline backend; tests/test_eager_baseline.py holds
            it to PyTorch's own bits); `paper` is the paper's.

Beside the formats, three arithmetic choices (each a preset's default unless set):
  exp      aten: P and the rescale factor by ATen's exp; fexp_u20: as PyTorch's CPU flash kernel,
           ATen's fast fexp_u20 on its vector lanes and libm's expf elsewhere (FA2, fp32 scores);
           exp2 / exp2_ffma: as FA2's CUDA kernels, P = exp2(S c - m c) with c = scale log2(e),
           S c rounded before the subtraction (torch's build) or fused with it (flash-attn's FFMA)
  row_sum  aten: ATen's row sum of P; lanes: the CPU kernel's lane accumulators and lane butterfly;
           quad: the CUDA kernel's four per-thread sums over all blocks, then a butterfly
  matmul   aten: float32 matmuls of the rounded inputs; blas: the mixed-precision GEMM the kernel
           calls (cblas_gemm_bf16bf16f32 / cblas_gemm_f16f16f32 from libtorch_cpu), 16-bit inputs;
           mma16: tensor cores as each 16-term sum, exact, added to the float32 accumulator with one
           rounding; mma16_rz: the accumulator and 16 products aligned with 25 bits kept, cut toward
           zero, the sum cut toward zero (two hypotheses for the GPU to test)
exp2/exp2_ffma, quad, mma16 and mma16_rz belong to the CUDA model (numdev.attention.cuda_kernel): they are taken
together (exp2 or exp2_ffma with quad) and with its formats only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from numdev.numerics.formats import FloatFormat, parse_format, round_to, seeded, stream_seed

STAGES = ("input", "score", "stats", "prob", "rescale", "accum", "output")
PRESETS = ("paper", "fa2", "cpu_sdpa", "fa2_cuda", "eager")
INPUT_SCALINGS = ("none", "tensor", "block")
# The arithmetic choices of the FA2 CUDA model (numdev.attention.cuda_kernel), and of all models.
CUDA_ARITHMETIC = {"exp": ("exp2", "exp2_ffma"), "row_sum": ("quad",), "matmul": ("aten", "mma16", "mma16_rz")}
ARITHMETIC = {"exp": ("aten", "fexp_u20", "exp2", "exp2_ffma"), "row_sum": ("aten", "lanes", "quad"),
              "matmul": ("aten", "blas", "mma16", "mma16_rz")}
_HIGH_PRECISION_STAGES = ("score", "stats", "rescale", "accum")
# The stages each preset keeps in FP32 (never below the run precision: an fp64 run keeps fp64).
_FP32_STAGES = {"paper": (), "fa2": _HIGH_PRECISION_STAGES, "cpu_sdpa": _HIGH_PRECISION_STAGES,
                "fa2_cuda": _HIGH_PRECISION_STAGES, "eager": ("stats", "rescale")}


@dataclass(frozen=True)
class StageFormats:
    input: FloatFormat
    score: FloatFormat
    stats: FloatFormat
    prob: FloatFormat
    rescale: FloatFormat
    accum: FloatFormat
    output: FloatFormat
    preset: str = "custom"
    precision: str = "custom"
    # "tensor": inputs are divided by a per-tensor scale amax / max_finite before rounding, as
    # FP8 kernels do, so the format's range is used fully; the scale is multiplied back after.
    # "block": one such scale per block of `input_block` consecutive rows (tokens) x the head dim, per
    # batch and head (FlashAttention-3's block quantisation: one scale per B_r x d tile of Q, B_c x d of K, V).
    input_scaling: str = "none"
    input_block: int = 128
    # FlashAttention-3's incoherent processing: Q and K multiplied by one random orthogonal matrix
    # M = diag(random signs) H / sqrt(d) (H: the Sylvester Hadamard matrix) before they are rounded;
    # (QM)(KM)^T = QK^T, and an outlier feature is spread over all d coordinates. Signs from `seed`.
    incoherent: bool = False
    exp: str = "aten"
    row_sum: str = "aten"
    matmul: str = "aten"
    seed: int = 0  # of the random integers of every stochastic stage

    def __post_init__(self):
        for stage, fmt in seeded({s: getattr(self, s) for s in STAGES}, self.seed, "numerics.seed").items():
            object.__setattr__(self, stage, fmt)
        if self.input_scaling not in INPUT_SCALINGS:
            raise ValueError(
                f"unknown input_scaling {self.input_scaling!r}: use one of {', '.join(INPUT_SCALINGS)}"
            )
        if isinstance(self.input_block, bool) or not isinstance(self.input_block, int) or self.input_block < 1:
            raise ValueError(f"numerics.input_block={self.input_block!r} must be a positive integer (FA3's tiles: 128)")
        if not isinstance(self.incoherent, bool):
            raise ValueError(f"numerics.incoherent={self.incoherent!r} must be true or false")
        for key, choices in ARITHMETIC.items():
            if getattr(self, key) not in choices:
                raise ValueError(f"numerics.{key}={getattr(self, key)!r} is not one of {', '.join(choices)}")
        if self.matmul == "blas" and self.input.name not in ("bf16", "fp16"):
            raise ValueError(f"numerics.matmul=blas takes bf16 or fp16 inputs, not {self.input.name}: "
                             "set numerics.matmul=aten")
        self._check_cuda_model()

    @property
    def cuda_model(self) -> bool:
        """The arithmetic of FA2's CUDA forward (numdev.attention.cuda_kernel) rather than ATen's or the CPU kernel's."""
        return self.exp in CUDA_ARITHMETIC["exp"]

    def _check_cuda_model(self) -> None:
        """exp2/exp2_ffma, quad and mma16/mma16_rz come together, with the formats the CUDA model computes."""
        chosen = [f"numerics.{key}={getattr(self, key)}" for key in ("exp", "row_sum", "matmul")
                  if getattr(self, key) in CUDA_ARITHMETIC[key] and getattr(self, key) != "aten"]
        if not chosen:
            return
        if not self.cuda_model or self.row_sum != "quad" or self.matmul not in CUDA_ARITHMETIC["matmul"]:
            raise ValueError(f"numerics.exp={self.exp}, numerics.row_sum={self.row_sum}, numerics.matmul={self.matmul} mix "
                             f"the FA2 CUDA model's arithmetic ({', '.join(chosen)}) with another's: set numerics.exp=exp2 "
                             "(or exp2_ffma), numerics.row_sum=quad and numerics.matmul=aten (or mma16, mma16_rz) together "
                             "(numerics.preset=fa2_cuda)")
        half = self.input.name
        fits = (half in ("bf16", "fp16") and self.prob.name == self.output.name == half and self.nearest_only
                and all(getattr(self, s).name == "fp32" for s in _HIGH_PRECISION_STAGES)
                and self.input_scaling == "none" and not self.incoherent)
        if not fits:
            raise ValueError(f"the FA2 CUDA model ({', '.join(chosen)}) computes bf16 or fp16 inputs, P and output with "
                             "fp32 scores, statistics, rescale and accumulator, rounding to nearest, no input scaling: "
                             "use numerics.preset=fa2_cuda with precision bf16 or fp16 and no stage overrides")

    def reseed(self, stream: int) -> None:
        """Restart the stochastic stages' random integers at stream `stream` of this seed (the bench: each
        input seed's measurement its own stream, whatever ran before it)."""
        source = next((getattr(self, s).rounding.source for s in STAGES if getattr(self, s).rounding.source is not None), None)
        if source is not None:
            source.manual_seed(stream_seed(self.seed, stream))

    @property
    def nearest_only(self) -> bool:
        """Every stage rounds to nearest even (the fused kernels and compiled steps do nothing else)."""
        return all(getattr(self, s).nearest for s in STAGES)

    @property
    def working_dtype(self) -> torch.dtype:
        """float32 when every stage's format fits in it, else float64."""
        if all(getattr(self, s).fits_in(torch.float32) for s in STAGES):
            return torch.float32
        return torch.float64

    def describe(self) -> dict:
        """A flat, JSON-ready description for result records."""
        out = {s: getattr(self, s).spec for s in STAGES}
        out.update(preset=self.preset, precision=self.precision, input_scaling=self.input_scaling,
                   exp=self.exp, row_sum=self.row_sum, matmul=self.matmul)
        if self.input_scaling == "block":
            out["input_block"] = self.input_block
        if self.incoherent:
            out["incoherent"] = True
        if not self.nearest_only:
            out["seed"] = self.seed
        return out


def stage_formats(
    preset: str = "paper",
    precision: str = "bf16",
    input_scaling: str = "none",
    input_block: int = 128,
    incoherent: bool = False,
    exp: str | None = None,
    row_sum: str | None = None,
    matmul: str | None = None,
    seed: int = 0,
    **overrides,
) -> StageFormats:
    """Formats from a preset and a run precision; any stage given in `overrides` (not None) wins.

    This is the Hydra target of the `numerics` config group.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown numerics preset {preset!r}: use one of {', '.join(PRESETS)}")
    unknown = set(overrides) - set(STAGES)
    if unknown:
        raise ValueError(
            f"unknown stage(s) {', '.join(sorted(unknown))}: the stages are {', '.join(STAGES)}"
        )
    run = _parsed("precision", precision)
    chosen = {s: run for s in STAGES}
    # Real kernels never hold the accumulator in less than FP32, nor in more than FP64.
    if not (run.exponent_bits > 8 or run.mantissa_bits > 23):
        chosen.update({s: parse_format("fp32") for s in _FP32_STAGES[preset]})
    for stage, spec in overrides.items():
        if spec is not None:
            chosen[stage] = _parsed(stage, spec)
    # The cpu_sdpa and fa2_cuda presets model their kernel's arithmetic where it is modelled: 16-bit inputs.
    half = run.name in ("bf16", "fp16")
    arithmetic = dict.fromkeys(ARITHMETIC, "aten")
    if half and preset == "cpu_sdpa":
        arithmetic = {"exp": "fexp_u20", "row_sum": "lanes", "matmul": "blas"}
    elif half and preset == "fa2_cuda":
        arithmetic = {"exp": "exp2", "row_sum": "quad", "matmul": "aten"}
    given = {"exp": exp, "row_sum": row_sum, "matmul": matmul}
    arithmetic.update({key: value for key, value in given.items() if value is not None})
    is_custom = any(overrides.get(s) is not None for s in STAGES)
    return StageFormats(
        **chosen,
        preset=f"{preset}+custom" if is_custom else preset,
        precision=run.spec,
        input_scaling=input_scaling,
        input_block=input_block,
        incoherent=incoherent,
        **arithmetic,
        seed=seed,
    )


def _parsed(key: str, spec) -> FloatFormat:
    """parse_format, its error naming the setting (numerics.<key> in the bench, attention.formats.<key> in training)."""
    try:
        return parse_format(spec)
    except ValueError as error:
        raise ValueError(f"the {key} format: {error}") from None


def round_input(x: torch.Tensor, formats: StageFormats) -> torch.Tensor:
    """Round an attention input to the input format (with per-tensor or per-block scaling if configured)."""
    if formats.input_scaling == "none":
        return round_to(x, formats.input)
    magnitude = x.detach().abs()
    if formats.input_scaling == "tensor":
        amax = magnitude.amax()
    else:  # per (batch, head) block of input_block rows x the head dim; the last block may be shorter
        n, block = x.shape[-2], formats.input_block
        padded = torch.nn.functional.pad(magnitude, (0, 0, 0, -n % block))
        amax = padded.unflatten(-2, (-1, block)).amax(dim=(-2, -1), keepdim=True)
        amax = amax.repeat_interleave(block, dim=-3).flatten(-3, -2)[..., :n, :]
    scale = torch.where(amax > 0, amax / formats.input.max_finite, torch.ones_like(amax))
    return round_to(x / scale, formats.input) * scale


def incoherence(dim: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """FlashAttention-3's random orthogonal matrix M = diag(s) H / sqrt(dim): H the Sylvester Hadamard
    matrix, s random signs drawn from `seed` (dim must be a power of two)."""
    if dim < 1 or dim & (dim - 1):
        raise ValueError(f"numerics.incoherent=true needs a power-of-two head dim (a Hadamard matrix), got {dim}")
    hadamard = torch.ones(1, 1, dtype=torch.float64)
    while hadamard.shape[0] < dim:
        hadamard = torch.cat([torch.cat([hadamard, hadamard], 1), torch.cat([hadamard, -hadamard], 1)], 0)
    signs = torch.randint(0, 2, (dim,), generator=torch.Generator().manual_seed(seed), dtype=torch.int64) * 2 - 1
    return (signs[:, None].double() * hadamard / dim ** 0.5).to(dtype)


def prepared_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, formats: StageFormats):
    """Q, K, V as every emulated attention takes them: incoherent processing of Q and K if configured
    (in float64 for float64 inputs, else float32), then working_input's rounding."""
    if formats.incoherent:
        wide = torch.float64 if q.dtype == torch.float64 else torch.float32
        m = incoherence(q.shape[-1], formats.seed, wide).to(q.device)
        q, k = q.to(wide) @ m, k.to(wide) @ m
    return tuple(working_input(t, formats) for t in (q, k, v))



def working_input(x: torch.Tensor, formats: StageFormats) -> torch.Tensor:
    """x rounded to the input format, then held in the working precision.

    Rounding happens in x's own precision first, so float64 inputs are rounded once, not twice.
    """
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()  # bf16/fp16/fp8 values are exact in float32
    return round_input(x, formats).to(formats.working_dtype)
