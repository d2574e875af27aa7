"""scripts/kernel_sass.py: torch's FA2 forward kernels' machine code (in its CUDA wheel, read with Triton's cuobjdump)
against numdev's FA2 CUDA model. No GPU: the SASS is disassembled, not run. The installed torch here is the project's
(2.14); the committed result reads the GPU image's 2.11 (docs/gpu.md)."""

from __future__ import annotations

import json
import math

import pytest
from helpers import load_script

from numdev.attention import cuda_kernel
from numdev.runs.provenance import file_sha256, torch_cuda_library

SNIPPET = """
        Function : _ZN13pytorch_flash16flash_fwd_kernelIfake
        /*0000*/                   FMUL R16, R10, UR6 ;                  /* 0x0000000000000000 */
        /*0010*/                   FADD R2, -R16, R5 ;                   /* 0x0000000000000000 */
        /*0020*/                   FSETP.GEU.AND P6, PT, R2, -126, PT ;  /* 0x0000000000000000 */
        /*0030*/              @!P6 FMUL R2, R2, 0.5 ;                    /* 0x0000000000000000 */
        /*0040*/                   MUFU.EX2 R244, R2 ;                   /* 0x0000000000000000 */
        /*0050*/              @!P6 FMUL R244, R244, R244 ;               /* 0x0000000000000000 */
        /*0060*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ; /* 0x0000000000000000 */
        /*0070*/                   MUFU.RCP R9, R0 ;                     /* 0x0000000000000000 */
        /*0080*/                   FFMA R2, R0, R9, -1 ;                 /* 0x0000000000000000 */
        /*0090*/                   MUFU.LG2 R0, R0 ;                     /* 0x0000000000000000 */
        /*00a0*/                   FMUL R2, R0, 0.69314718246459960938 ; /* 0x0000000000000000 */
"""


@pytest.fixture(scope="module")
def script():
    return load_script("kernel_sass")


@pytest.fixture(scope="module")
def machine_code(script):
    """One forward, one split-KV and one combine kernel (bf16, d = 128) of the installed torch's sm_90 machine code."""
    import shutil

    triton = pytest.importorskip("triton")
    lib = torch_cuda_library()
    if not lib.is_file() or not shutil.which("c++filt"):
        pytest.skip(f"{lib}: a CPU-only torch has no CUDA machine code" if not lib.is_file() else "no c++filt (binutils)")
    bodies = {}
    kernels = script.kernel_bodies(lib, triton.knobs.nvidia.cuobjdump.path, 90, [128], ["bf16"])
    for found, _, body in kernels:
        bodies.setdefault(found["kind"], body)
        if len(bodies) == 3:
            kernels.close()  # the scratch folder goes with it
            break
    return bodies


def test_the_model_describes_torchs_fa2_machine_code(script, machine_code):
    assert set(machine_code) == {"forward", "splitkv", "combine"}
    for kind, body in machine_code.items():
        seen = script.census(body)
        assert all(v is True for v in script.judge(kind, seen).values()), (kind, script.judge(kind, seen))
    forward = script.census(machine_code["forward"])
    assert forward["ex2_argument_writers"].get("FADD", 0) > 0 and "FFMA" not in forward["ex2_argument_writers"]
    assert forward["ex2_halved"] == forward["counts"]["MUFU.EX2"] and forward["fmul_after_lg2"]


@pytest.mark.parametrize(("constant", "value", "kind", "broken"), [
    ("LN2_F32", math.nextafter(cuda_kernel.LN2_F32, 1.0), "forward", "fast_log"),
    ("LN2_F32", math.nextafter(cuda_kernel.LN2_F32, 1.0), "combine", "logf_libdevice"),
    ("EXPF_T", math.nextafter(cuda_kernel.EXPF_T, 1.0), "combine", "expf_libdevice"),
    ("LOGF_POLY", cuda_kernel.LOGF_POLY[::-1], "combine", "logf_libdevice"),
])
def test_a_model_constant_the_binary_does_not_hold_fails_its_check(script, machine_code, monkeypatch, constant, value,
                                                                   kind, broken):
    monkeypatch.setattr(cuda_kernel, constant, value)
    checks = script.judge(kind, script.census(machine_code[kind]))
    assert checks[broken] is not True and all(v is True for k, v in checks.items() if k != broken)


def test_the_census_reads_the_exponent_s_writer_the_guard_and_the_log(script):
    seen = script.census(SNIPPET)
    assert seen["ex2_argument_writers"] == {"FADD": 1} and seen["ex2_halved"] == 1
    assert seen["fmul_after_lg2"] == [cuda_kernel.LN2_F32] and seen["rcp_with_newton"] == 1
    assert all(v is True for v in script.judge("forward", seen).values())


@pytest.mark.parametrize(("edit", "broken"), [
    (("FADD R2, -R16, R5", "FFMA R2, R10, UR6, -R16"), "exp2_fmul_fadd"),  # flash-attn's fused build
    (("@!P6 FMUL R2, R2, 0.5", "NOP"), "ex2_not_flushed"),  # ex2.approx.ftz: no halving below -126
    (("0.69314718246459960938", "0.69314719"), "fast_log"),
    (("FFMA R2, R0, R9, -1", "NOP"), "reciprocal_rn"),  # rcp.approx: no Newton step
    (("HMMA.16816.F32.BF16", "HGMMA.64x64x16.F32.BF16"), "mma_sync"),
])
def test_each_check_fails_on_machine_code_built_to_fail_it(script, edit, broken):
    checks = script.judge("forward", script.census(SNIPPET.replace(*edit)))
    assert checks[broken] is not True and all(v is True for k, v in checks.items() if k != broken)


def test_the_census_follows_registers_not_distances(script):
    """A scheduler may put other instructions between MUFU.LG2 and its FMUL (sm_100 does): the reader is found by
    register; the subnormal branch's predicated FADD of -24 is passed over; an overwrite before any read is no read."""
    spread = SNIPPET.replace("FMUL R2, R0, 0.69314718246459960938 ;",
                             "IADD3 R7, R7, 0x1, RZ ;\n        /*00b0*/ @!P0 FADD R0, R0, -24 ;\n"
                             "        /*00c0*/ MOV R8, R9 ;\n        /*00d0*/ FMUL R2, R0, 0.69314718246459960938 ;")
    assert script.census(spread)["fmul_after_lg2"] == [cuda_kernel.LN2_F32]
    overwritten = SNIPPET.replace("FMUL R2, R0, 0.69314718246459960938 ;", "MOV R0, RZ ;\n        /*00b0*/ FMUL R2, R0, 0.5 ;")
    assert script.census(overwritten)["fmul_after_lg2"] == []


def test_a_missing_tool_is_one_line(script, monkeypatch, capsys):
    pytest.importorskip("triton")
    if not torch_cuda_library().is_file():
        pytest.skip("a CPU-only torch has no CUDA machine code")
    monkeypatch.setattr(script.shutil, "which", lambda tool: None if tool == "c++filt" else tool)
    with pytest.raises(SystemExit) as exit_:
        script.main([])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "c++filt not found" in err and "binutils" in err, err


def test_constants_are_read_from_immediates_moves_and_half_pairs(script):
    assert script.constants_of("HFMA2.MMA", ["R21", "-RZ", "RZ", "0.96630859375", "-0.0022525787353515625"]) == [cuda_kernel.EXPF_T]
    assert script.constants_of("MOV", ["R21", "0x3e055027"]) == [-cuda_kernel.LOGF_POLY[0]]
    assert script.constants_of("FFMA", ["R7", "R28", "1.4426950216293334961", "-R7"]) == [cuda_kernel.EXPF_LOG2E[0]]
    assert script.constants_of("IADD3", ["R23", "R26", "-0x3f2aaaab", "RZ"]) == []


def test_only_the_variants_the_grid_runs_are_read(script):
    base = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
            "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, {}>(pytorch_flash::Flash_fwd_params)")
    plain = script.describe(base.format("false, true, false, false, true, true, false, false"))
    assert plain == {"kind": "forward", "dim": 128, "tiles": [128, 64], "warps": 4, "dtype": "bf16", "causal": True}
    assert script.describe(base.format("true, true, false, false, true, true, false, false")) is None  # dropout
    assert script.describe(base.format("false, false, false, false, true, true, true, false")) is None  # softcap
    assert script.describe("void at::native::some_other_kernel<float>(int)") is None


@pytest.mark.parametrize(("argv", "says"), [
    (["--write-docs", "--out", "x.json"], "--write-docs reads no library and writes no JSON, so --out would be ignored"),
    (["--write-docs", "--dims", "64", "--arch", "80"], "so --arch, --dims would be ignored: give it alone"),
    (["--arch", "75"], "argument --arch: 75 must be >= 80"),
    (["--torch-lib", "{tmp}/missing.so"], "missing.so: no such file"),
    (["--torch-lib", "{tmp}"], ": a folder, not a file"),
    (["--torch-lib", "{tmp}/text.so"], "found no sm_90 machine code in it"),
    (["--dims", "96"], "argument --dims: invalid choice"),
])
def test_bad_arguments_and_libraries_are_one_line(script, argv, says, tmp_path, capsys):
    pytest.importorskip("triton")
    (tmp_path / "text.so").write_text("not a library\n")
    with pytest.raises(SystemExit) as exit_:
        script.main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize(("content", "says"), [
    ("{", "rerun the command that wrote it"),
    ("{}", "a field the table reads is missing"),
    ('{"summary": [{"kind": "forward"}], "torch": "2", "library_sha256": "ab", "target": "sm_90"}', "a field the table reads"),
])
def test_write_docs_refuses_a_forged_result_in_one_line(script, content, says, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(script, "RESULTS", tmp_path)
    monkeypatch.setattr(script, "REPO", tmp_path)
    (tmp_path / "kernel_sass_x.json").write_text(content)
    assert script.main(["--write-docs"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


@pytest.mark.slow
def test_the_script_reads_the_installed_torch_and_every_check_holds(script, tmp_path, capsys):
    """End to end on the installed torch (bf16, d = 128: a quarter of the kernels; ~30 s)."""
    pytest.importorskip("triton")
    if not torch_cuda_library().is_file():
        pytest.skip("a CPU-only torch has no CUDA machine code")
    out = tmp_path / "k.json"
    assert script.main(["--dims", "128", "--dtypes", "bf16", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {row["kind"] for row in report["summary"]} == {"forward", "splitkv", "combine"}
    assert all(count == row["kernels"] for row in report["summary"] for count in row["holds"].values())
    assert report["library_sha256"] == file_sha256(torch_cuda_library())
    assert "| forward | 128 | bf16 |" in script.doc_table([report])


def test_a_sigterm_stops_the_run_and_takes_its_scratch_and_cuobjdump_with_it(tmp_path):
    """The scratch folder holds hundreds of MB of machine code: a stopped run removes it and leaves no cuobjdump."""
    import os
    import signal
    import subprocess
    import sys

    from helpers import REPO

    pytest.importorskip("triton")
    if not torch_cuda_library().is_file():
        pytest.skip("a CPU-only torch has no CUDA machine code")
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its scratch folder here, to be looked for
    process = subprocess.Popen([sys.executable, str(REPO / "scripts" / "kernel_sass.py"), "--out", str(tmp_path / "k.json")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    first = process.stderr.readline()  # a kernel read: the scratch folder exists and cuobjdump is at work
    assert first.startswith("kernel_sass: "), first
    assert any(p.name.startswith("numdev_kernel_sass_") for p in tmp_path.iterdir())
    process.send_signal(signal.SIGTERM)
    rest = process.stderr.read()
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    assert rest.strip().splitlines()[-1] == "kernel_sass: stopped by SIGTERM: nothing written"
    assert not any(p.name.startswith("numdev_kernel_sass_") for p in tmp_path.iterdir()) and not (tmp_path / "k.json").exists()
    left = subprocess.run(["pgrep", "-f", f"cuobjdump.*{tmp_path}"], capture_output=True, text=True).stdout
    assert not left, left
