"""scripts/triton_compile.py: numdev's Triton kernels compiled for a GPU on this machine, which has none
(Triton compiles for a named target; its wheel carries ptxas). A few variants, not the script's 320:
each compile takes a second or two."""

from __future__ import annotations

import json
import os
import signal

import pytest
from helpers import load_script

triton = pytest.importorskip("triton")


@pytest.fixture(scope="module")
def script():
    return load_script("triton_compile")


@pytest.fixture(scope="module")
def kernel():
    from numdev.kernels import flash_attention

    return flash_attention


def _variant(script, kernel, name: str, dtype: str, dim: int, **switches) -> dict:
    for variant in script.variants(kernel, [dim], [dtype]):
        if variant["kernel"] == name and all(variant["constexprs"][k] == v for k, v in switches.items()):
            return variant
    raise AssertionError(f"no {name} {dtype} d={dim} {switches}")


def test_the_forward_and_backward_build_for_hopper_with_its_tensor_core_instructions(script, kernel):
    from triton.backends.compiler import GPUTarget

    ptxas = triton.knobs.nvidia.ptxas.path
    hopper, ampere = GPUTarget("cuda", 90, 32), GPUTarget("cuda", 80, 32)
    forward = _variant(script, kernel, "_fwd_kernel", "bf16", 64, CAUSAL=True, USE_EXP2=True, FA1=False,
                       STATS_LOW=True, ACC_LOW=False)
    dq = _variant(script, kernel, "_bwd_dq_kernel", "fp16", 128, CAUSAL=False, USE_EXP2=True)
    for variant in (forward, dq):
        on_hopper = script.compile_one(kernel, variant, hopper, ptxas)
        assert "error" not in on_hopper, on_hopper
        assert on_hopper["ptx_target"] == "sm_90a" and on_hopper["wgmma"] > 0 and on_hopper["mma_sync"] == 0
        assert 0 < on_hopper["registers"] <= 255 and on_hopper["spill_store_bytes"] >= 0 and on_hopper["spill_load_bytes"] >= 0
        assert 0 < on_hopper["shared_bytes"] <= 227 * 1024  # an H100's shared memory per block
    # the counts tell the instruction sets apart: for an A100 the same kernel uses mma.sync, no wgmma
    on_ampere = script.compile_one(kernel, forward, ampere, ptxas)
    assert on_ampere["ptx_target"] == "sm_80" and on_ampere["wgmma"] == 0 and on_ampere["mma_sync"] > 0
    assert forward["options"] == kernel.launch_options(64, *kernel.default_blocks(64), kernel.Knobs())
    assert script.compile_one(kernel, forward, hopper, ptxas)["spill_store_bytes"] == 0  # the forward keeps its registers


def test_every_knob_combination_is_a_variant(script, kernel):
    found = script.variants(kernel, [64, 128], ["bf16"])
    forward = [v for v in found if v["kernel"] == "_fwd_kernel"]
    assert len(forward) == 2 * 2 ** 5 and len(found) == 2 * (2 ** 5 + 2 * 2 ** 2)
    assert {v["constexprs"]["BLOCK_N"] for v in forward if v["head_dim"] == 128} == {kernel.default_blocks(128)[1]}
    assert {tuple(v["constexprs"][k] for k in script.FORWARD_SWITCHES) for v in forward} == {
        tuple(bool(i >> b & 1) for b in range(5)) for i in range(32)}


def test_a_variant_that_does_not_compile_is_recorded_and_the_run_exits_1(script, kernel, tmp_path, monkeypatch, capsys):
    good = _variant(script, kernel, "_bwd_dkdv_kernel", "bf16", 16, CAUSAL=True, USE_EXP2=False)
    broken = {**good, "constexprs": {**good["constexprs"], "BLOCK_N": 48}}  # tl.arange needs a power of two
    monkeypatch.setattr(script, "variants", lambda kernel, dims, dtypes: [good, broken])
    out = tmp_path / "compile.json"
    assert script.main(["--out", str(out)]) == 1
    captured = capsys.readouterr()
    report = json.loads(out.read_text())
    assert json.loads(captured.out) == report and report["complete"] is True
    assert report["summary"]["compiled"] == 1 and report["summary"]["failed"] == 1
    assert "error" not in report["records"][0]
    assert report["records"][1]["error"].startswith("arange's range must be a power of 2 (at ")
    last = captured.err.splitlines()[-1]
    assert last.startswith("triton_compile: error: did not compile: _bwd_dkdv_kernel bf16 d=16") and "power of 2" in last


@pytest.mark.parametrize("argv, message", [
    (["--dims", "48"], "--dims 48: the kernel takes head dims 16, 32, 64, 128"),
    (["--dims", "64", "256"], "--dims 256: the kernel takes head dims"),
    (["--dims", "64", "32", "64"], "--dims 64 given twice: give each head dim once"),
])
def test_head_dims_the_kernel_does_not_take_are_refused_in_one_line(script, argv, message, capsys):
    assert script.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize("content, says", [
    (None, "no docs/results/triton_compile_*.json to write the table from"),
    ("{\"complete\": false}", "triton_compile_sm90.json: it is not complete"),
    ("{\"complete\": true, \"records\": [{\"kernel\": \"_fwd_kernel\"}]}", "triton_compile_sm90.json: a field the table reads is missing ('provenance')"),
    ("{\"complete\": tr", "triton_compile_sm90.json: Expecting value"),
])
def test_write_docs_refuses_a_missing_partial_or_forged_report_in_one_line(script, content, says, tmp_path, monkeypatch, capsys):
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    doc = tmp_path / "docs" / "gpu.md"
    doc.write_text("<!-- numdev:begin triton-compile -->\nold\n<!-- numdev:end triton-compile -->\n")
    if content is not None:
        (results / "triton_compile_sm90.json").write_text(content)
    monkeypatch.setattr(script, "REPO", tmp_path)
    monkeypatch.setattr(script, "RESULTS", results)
    monkeypatch.setattr(script, "DOC", doc)
    assert script.main(["--write-docs"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert "\nold\n" in doc.read_text()


def test_a_signal_during_a_compile_stops_the_run_and_is_not_recorded_as_its_error(script, kernel, tmp_path, monkeypatch, capsys):
    """SIGTERM arrives while Triton compiles (where the time goes): the run stops with 143 and one line,
    the variants finished so far kept (complete: false), no compile cache left in /tmp, and the signal is
    not taken for the variant's compile error (it was, when Stopped was an Exception)."""
    import tempfile

    from numdev.cli.stop_signals import Stopped

    compile_ = triton.compile
    calls = []

    def compile_then_signal(*args, **kwargs):
        calls.append(os.environ["TRITON_CACHE_DIR"])
        if len(calls) == 2:
            raise Stopped(signal.SIGTERM)
        return compile_(*args, **kwargs)

    monkeypatch.setattr(triton, "compile", compile_then_signal)
    out = tmp_path / "compile.json"
    assert script.main(["--dims", "16", "--dtypes", "fp16", "--out", str(out)]) == 128 + signal.SIGTERM
    report = json.loads(out.read_text())
    assert report["complete"] is False and len(report["records"]) == 1 and "error" not in report["records"][0]
    assert capsys.readouterr().err.splitlines()[-1] == f"triton_compile: stopped by SIGTERM; 1 of 40 variants in {out} (complete: false)"
    assert calls[0].startswith(tempfile.gettempdir()) and not os.path.exists(calls[0])


@pytest.mark.parametrize("doc_text, says", [
    (None, "cannot read it to write block 'triton-compile' (No such file or directory)"),
    ("no markers\n", "needs exactly one '<!-- numdev:begin triton-compile -->' followed by one"),
])
def test_write_docs_into_a_doc_that_is_gone_or_lost_its_block_is_one_line(script, doc_text, says, tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    results.mkdir()
    for file in sorted(script.RESULTS.glob("triton_compile_*.json")):
        (results / file.name).write_bytes(file.read_bytes())
    doc = tmp_path / "gpu.md"
    if doc_text is not None:
        doc.write_text(doc_text)
    monkeypatch.setattr(script, "REPO", tmp_path)
    monkeypatch.setattr(script, "RESULTS", results)
    monkeypatch.setattr(script, "DOC", doc)
    assert script.main(["--write-docs"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"triton_compile: error: {doc}: ") and says in err, err


@pytest.mark.parametrize("extra", [["--arch", "90"], ["--dims", "64"], ["--dtypes", "bf16"], ["--out", "x.json"]])
def test_write_docs_with_a_compile_flag_is_refused_in_one_line(script, extra, capsys):
    with pytest.raises(SystemExit) as exit_:
        script.main(["--write-docs", *extra])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--write-docs compiles nothing, so {extra[0]} would be ignored" in err
