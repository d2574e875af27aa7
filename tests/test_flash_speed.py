"""The flash emulator's fast paths (query chunking, skipped repeat roundings, torch.compile, the C
kernels) give bit for bit the outputs of the implementation they replaced (tests/flash_reference.py,
frozen)."""

import platform
import shutil
import warnings

import pytest
import torch
from flash_reference import reference_forward

from numdev.attention import FlashEmulated, compiled, flash_emulated, golden_attention, native
from numdev.attention.flash_emulated import _row_chunks
from numdev.numerics.stages import PRESETS, stage_formats

PRECISIONS = ("bf16", "fp16", "fp32", "fp64", "fp8_e4m3", "fp8_e5m2")
COMPILED_PRECISIONS = ("bf16", "fp16", "fp32")  # the others always run eagerly (compiled.supports)

# (batch, heads, n_q, n_k, dim, causal, tiles, query_chunk): self and cross attention, causal with
# n_q > n_k and n_q < n_k, ragged last tiles, chunk edges that do and do not meet tile edges, a
# scale that is not a power of two (dim 48), and no tiles (each preset's own rule).
CASES = {
    "self-causal": (1, 2, 100, 100, 32, True, (16, 16), None),
    "cross-chunked": (2, 1, 70, 333, 16, False, (32, 64), 24),
    "causal-tall-ragged": (1, 2, 200, 130, 48, True, (64, 13), 70),
    "causal-wide": (1, 1, 130, 257, 64, True, (16, 64), 50),
    "preset-tiles": (1, 2, 200, 200, 48, False, (None, None), 64),
}


def _inputs(batch, heads, n_q, n_k, dim, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((batch, heads, n_q, dim), (batch, heads, n_k, dim), (batch, heads, n_k, dim))
    return tuple(torch.randn(*s, generator=g, dtype=torch.float64).to(dtype) for s in shapes)


def assert_same_bits(got: torch.Tensor, expected: torch.Tensor):
    """Equal bit patterns, NaN anywhere counted equal to NaN (payloads aside)."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(got), nan), "NaN in different places"
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}[got.dtype]
    differ = (got.view(ints) != expected.view(ints)) & ~nan
    assert not differ.any(), f"{int(differ.sum())} of {got.numel()} outputs differ, max |d| {(got - expected)[differ].abs().max()}"


# The frozen reference knows ATen's arithmetic only: the cpu_sdpa preset is held to it with that
# arithmetic; its model of PyTorch's kernel (exp=fexp_u20, row_sum=lanes, matmul=blas) is held to
# the kernel itself and to its fused C path in tests/test_attention.py.
ATEN_ARITHMETIC = {"exp": "aten", "row_sum": "aten", "matmul": "aten"}


def _check(preset, precision, variant, case, compile, native_kernels=False, formats=None, inputs=None):
    batch, heads, n_q, n_k, dim, causal, (block_r, block_c), query_chunk = CASES[case]
    dtype = torch.float64 if precision == "fp64" else torch.float32
    q, k, v = inputs if inputs is not None else _inputs(batch, heads, n_q, n_k, dim, dtype)
    emulator = FlashEmulated(
        formats or stage_formats(preset, precision, **ATEN_ARITHMETIC), block_r=block_r, block_c=block_c, variant=variant,
        compile=compile, query_chunk=query_chunk, native=native_kernels,
    )
    scale = dim**-0.5
    with torch.no_grad():
        got = emulator(q, k, v, scale=scale, causal=causal)
        expected = torch.cat([reference_forward(emulator, q, k, v, scale, causal, rows) for rows in _chunks(emulator, q, k, v)],
                             dim=2)
    assert_same_bits(got, expected)
    return emulator


def _chunks(emulator, q, k, v) -> list[slice]:
    """The query chunks the emulator computes separately: its matmuls have these rows."""
    n_q = q.shape[2]
    return _row_chunks(n_q, emulator._chunk_rows(emulator.tiles(n_q, k.shape[2], q.shape[-1]), v.shape[-1]))


DEFAULT_CASES = ("self-causal", "cross-chunked", "causal-tall-ragged")  # the rest: slow


@pytest.mark.parametrize(
    "case", [c if c in DEFAULT_CASES else pytest.param(c, marks=pytest.mark.slow) for c in CASES]
)
@pytest.mark.parametrize("variant", ["fa2", "fa1"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("preset", PRESETS)
def test_eager_path_matches_frozen_reference(preset, precision, variant, case):
    assert _check(preset, precision, variant, case, compile=False).last_path == "eager"


@pytest.mark.parametrize("variant", ["fa2", "fa1"])
@pytest.mark.parametrize("preset, precision", [("paper", "bf16"), ("fa2", "fp32")])
def test_compiled_path_matches_frozen_reference(preset, precision, variant):
    """fa2/fp32 keeps every exp unrounded in the output: it caught inductor's own exp (Sleef),
    which differs from ATen's in the last bit; compiled steps therefore call ATen's exp."""
    _check(preset, precision, variant, "causal-tall-ragged", compile=True)
    assert not compiled._broken, f"compile fell back to eager, nothing was tested: {compiled._broken}"
    assert torch._inductor.config.emulate_precision_casts is False  # set per function, not globally


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("variant", ["fa2", "fa1"])
@pytest.mark.parametrize("precision", COMPILED_PRECISIONS)
@pytest.mark.parametrize("preset", PRESETS)
def test_compiled_path_matches_frozen_reference_everywhere(preset, precision, variant, case):
    _check(preset, precision, variant, case, compile=True)
    assert not compiled._broken, f"compile fell back to eager, nothing was tested: {compiled._broken}"


def test_compile_is_skipped_where_it_is_not_proven():
    assert compiled.supports(stage_formats("paper", "bf16"))
    assert compiled.supports(stage_formats("fa2", "fp16"))
    for precision in ("fp64", "fp8_e4m3", "fp8_e5m2", "tf32", "e5m7"):
        assert not compiled.supports(stage_formats("paper", precision))


def test_failed_compile_falls_back_to_the_same_bits(monkeypatch):
    def broken_compile(fn, **options):
        def run(*args, **kwargs):
            raise RuntimeError("no C++ compiler\nsecond line")
        return run

    monkeypatch.setattr(compiled, "_broken", [])
    monkeypatch.setattr(torch, "compile", broken_compile)
    compiled._compiled.cache_clear()
    try:
        with pytest.warns(UserWarning, match="running eagerly: RuntimeError: no C\\+\\+ compiler$"):
            _check("paper", "bf16", "fa2", "self-causal", compile=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned once, then quiet
            _check("paper", "bf16", "fa1", "self-causal", compile=True)
    finally:
        compiled._compiled.cache_clear()


@pytest.mark.parametrize("variant", ["fa2", "fa1"])
def test_chunked_and_compiled_emulator_keeps_exact_gradients_in_fp64(variant):
    """Under autograd the eager steps run (compile is for no-grad sweeps), chunked or not."""
    q, k, v = (t.requires_grad_() for t in _inputs(1, 2, 90, 70, 16, torch.float64))
    upstream = torch.randn(1, 2, 90, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((golden_attention(q, k, v, causal=True) * upstream).sum(), (q, k, v))
    emulator = FlashEmulated(stage_formats("paper", "fp64"), block_c=16, variant=variant, compile=True,
                             query_chunk=20)
    out = emulator(q, k, v, causal=True)
    for expected, got in zip(grads, torch.autograd.grad((out * upstream).sum(), (q, k, v))):
        assert (expected - got).abs().max() < 1e-10


def test_compiled_emulator_runs_under_autograd_in_bf16():
    q, k, v = (t.requires_grad_() for t in _inputs(1, 2, 64, 64, 16))
    emulator = FlashEmulated(stage_formats("paper", "bf16"), block_c=16, compile=True, query_chunk=16)
    out = emulator(q, k, v, causal=True)
    with torch.no_grad():
        expected = [reference_forward(emulator, q, k, v, 0.25, True, rows) for rows in _chunks(emulator, q, k, v)]
        assert_same_bits(out.detach(), torch.cat(expected, dim=2))
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("case", ["cross-chunked", "causal-tall-ragged"])
def test_query_chunks_change_fp64_outputs_only_by_a_blas_reordering(case):
    """Rows are independent, so chunking the query rows changes nothing but the shape of the two
    matmuls, and a BLAS may order a dot product's sum by shape (MKL's fp64 GEMM on an AMD EPYC does,
    by one ulp). The bound: two orders of a length-n sum differ by at most 2 gamma_n sum |terms|
    (gamma_n = n u / (1 - n u)); a score error ds moves each P by a relative ds and the output, a
    weighted mean of V, by at most 2 ds max|V|; P.V adds 2 gamma_Bc max|V|; a few roundings more."""
    batch, heads, n_q, n_k, dim, causal, (block_r, block_c), query_chunk = CASES[case]
    q, k, v = _inputs(batch, heads, n_q, n_k, dim, torch.float64)
    scale = dim**-0.5
    outputs = [FlashEmulated(stage_formats("paper", "fp64"), block_r=block_r, block_c=block_c, query_chunk=chunk)(
        q, k, v, scale=scale, causal=causal) for chunk in (query_chunk, n_q)]
    u = torch.finfo(torch.float64).eps / 2

    def gamma(n):
        return n * u / (1 - n * u)

    score_error = 2 * gamma(dim) * scale * (q.abs() @ k.abs().transpose(-1, -2)).max()
    bound = (2 * score_error + 2 * gamma(block_c) + 8 * u) * v.abs().max()
    assert (outputs[0] - outputs[1]).abs().max() <= bound


def test_row_chunks_are_near_equal_and_cover_every_row():
    for n_q, rows in ((100, 16), (2049, 2048), (4096, 2048), (5, 16), (1, 16)):
        chunks = _row_chunks(n_q, rows)
        sizes = [c.stop - c.start for c in chunks]
        assert [i for c in chunks for i in range(c.start, c.stop)] == list(range(n_q))
        assert max(sizes) <= rows and max(sizes) - min(sizes) <= 1
    assert [c.stop - c.start for c in _row_chunks(2049, 2048)] == [1025, 1024]  # never a 1-row sliver


NATIVE_FORMATS = {  # every format set the C kernels take: 16-bit scores, native conversions
    "paper-bf16": stage_formats("paper", "bf16"),
    "paper-fp16": stage_formats("paper", "fp16"),
    **{f"paper-bf16-{stage}-fp32": stage_formats("paper", "bf16", **{stage: "fp32"})
       for stage in ("stats", "rescale", "prob", "accum")},
    "bf16-scores-fp16-rest": stage_formats("paper", "fp16", score="bf16"),
}


@pytest.mark.parametrize(
    "case", [c if c in DEFAULT_CASES else pytest.param(c, marks=pytest.mark.slow) for c in CASES]
)
@pytest.mark.parametrize("variant", ["fa2", "fa1"])
@pytest.mark.parametrize("formats", list(NATIVE_FORMATS))
def test_native_kernels_match_frozen_reference(formats, variant, case):
    emulator = _check(None, "bf16", variant, case, compile=False, native_kernels=True, formats=NATIVE_FORMATS[formats])
    assert emulator.last_path == "native", "the C kernels did not run: nothing was tested"


@pytest.mark.parametrize("variant", ["fa2", "fa1"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_native_kernels_match_frozen_reference_on_extreme_values(precision, variant):
    """Scores in the thousands (exp underflows through subnormals to 0), an overflow to inf, a NaN
    and an inf input, a whole row of -inf keys: the special values the C roundings must keep."""
    emulator = _check(None, precision, variant, "self-causal", compile=False, native_kernels=True,
                      formats=stage_formats("paper", precision), inputs=_extreme_inputs())
    assert emulator.last_path == "native"


def _extreme_inputs():
    q, k, v = _inputs(1, 2, 100, 100, 32)
    q, k = q * 12, k * 12
    q[0, 0, 7, 3] = float("nan")
    k[0, 1, 40, 0] = float("inf")
    k[0, 1, 41] = -1e30
    v[0, 0, 9, 2] = float("inf")
    return q, k, v


def test_native_kernels_are_taken_only_where_they_apply():
    assert native.supports(stage_formats("paper", "bf16"))
    assert not native.supports(stage_formats("fa2", "bf16"))  # float32 scores: no 16-bit table
    for precision in ("fp32", "fp64", "fp8_e4m3", "tf32"):
        assert not native.supports(stage_formats("paper", precision))
    q, k, v = (t.requires_grad_() for t in _inputs(1, 1, 32, 32, 16))
    emulator = FlashEmulated(stage_formats("paper", "bf16"), block_c=16)
    emulator(q, k, v)
    assert emulator.last_path == "eager"  # autograd needs the ATen path
    with torch.no_grad():
        emulator(q, k, v)
        assert emulator.last_path == "native"
        emulator(q, k, v, scale=-0.5)  # max does not commute with a negative scale
        assert emulator.last_path == "eager"


def test_exp_table_is_atens_exp_indexed_by_bit_pattern():
    from numdev.numerics.formats import parse_format, round_to

    for held in ("bf16", "fp16"):
        fmt = parse_format(held)
        values = torch.tensor([0.0, -0.0, -1.5, -7.0, -90.0, -104.0, float("-inf"), 3.0], dtype=fmt.torch_dtype)
        table = native.exp_table(fmt, parse_format("bf16"))
        got = table[values.view(torch.int16).to(torch.int64) & 0xFFFF]
        assert_same_bits(got, round_to(torch.exp(values.float()), "bf16"))


def _fresh_native(monkeypatch, tmp_path, **env):
    monkeypatch.setenv("NUMDEV_CACHE", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(native, "_failure", [])
    native._library.cache_clear()
    flash_emulated._native_checked.cache_clear()


def test_no_c_compiler_warns_once_and_gives_the_same_bits(monkeypatch, tmp_path):
    _fresh_native(monkeypatch, tmp_path, CC=str(tmp_path / "no-such-cc"))
    try:
        with pytest.warns(UserWarning, match="C kernels for the flash emulator are unavailable"):
            emulator = _check("paper", "bf16", "fa2", "self-causal", compile=False, native_kernels=True)
        assert emulator.last_path == "eager"
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned once, then quiet
            _check("paper", "bf16", "fa1", "self-causal", compile=False, native_kernels=True)
    finally:
        monkeypatch.undo()
        native._library.cache_clear()
        flash_emulated._native_checked.cache_clear()


def test_a_damaged_cached_library_is_built_again(monkeypatch, tmp_path):
    _fresh_native(monkeypatch, tmp_path)
    try:
        _, _, built = native._where_built()
        assert built.parent == tmp_path / "native"
        built.parent.mkdir(parents=True)
        built.write_bytes(b"\x7fELF truncated")  # a damaged file where the library belongs
        emulator = _check("paper", "bf16", "fa2", "cross-chunked", compile=False, native_kernels=True)
        assert emulator.last_path == "native" and built.stat().st_size > 1000
    finally:
        monkeypatch.undo()
        native._library.cache_clear()
        flash_emulated._native_checked.cache_clear()


@pytest.mark.parametrize("knob", ["native", "compile"])
@pytest.mark.parametrize("bad", ["flase", "false", 1, None])
def test_a_switch_that_is_not_a_bool_is_a_one_line_error(knob, bad):
    with pytest.raises(ValueError, match=f"attention.{knob}=") as info:
        FlashEmulated(**{knob: bad})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("bad", [0, 8, 2.5, True, "64"])
def test_bad_query_chunk_is_a_one_line_error(bad):
    with pytest.raises((ValueError, TypeError), match="query_chunk") as info:
        FlashEmulated(query_chunk=bad)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="-mno-avx512f is an x86 flag")
@pytest.mark.parametrize("turned_off", ["-mno-avx512f", "-mno-avx2"])
@pytest.mark.parametrize("variant", ["fa2", "fa1"])
def test_native_kernels_without_avx512_match_frozen_reference(monkeypatch, tmp_path, variant, turned_off):
    """The kernels' AVX2 branches (what an AVX2-only CPU runs) and their portable C branches (any
    other CPU), built here by a compiler wrapper that turns AVX-512 or AVX2 off, give the same
    bits, special values included."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    wrapper = tmp_path / "cc-without"
    wrapper.write_text(f'#!/bin/sh\nexec {compiler} "$@" {turned_off}\n')
    wrapper.chmod(0o755)
    _fresh_native(monkeypatch, tmp_path, CC=str(wrapper))
    try:
        for name in ("paper-bf16", "paper-fp16", "paper-bf16-prob-fp32"):
            for case in ("self-causal", "cross-chunked", "causal-tall-ragged"):
                emulator = _check(None, "bf16", variant, case, compile=False, native_kernels=True,
                                  formats=NATIVE_FORMATS[name])
                assert emulator.last_path == "native"
        for precision in ("bf16", "fp16"):
            emulator = _check(None, precision, variant, "self-causal", compile=False, native_kernels=True,
                              formats=stage_formats("paper", precision), inputs=_extreme_inputs())
            assert emulator.last_path == "native"
    finally:
        monkeypatch.undo()
        native._library.cache_clear()
        flash_emulated._native_checked.cache_clear()
