"""scripts/gpu_call.py, issue 37's one prepared GPU call, rehearsed here with --device cpu: a step past
its limit is stopped with its whole process group and the rest of the call is skipped and said to be,
a SIGTERM to the call stops the running step and writes the record, and bad arguments are one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from helpers import REPO, load_script


def _processes_naming(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_text().replace("\0", " ")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if text in cmdline and stat[stat.rindex(")") + 2] != "Z":
            found.append(cmdline[:200])
    return found


def _left(text: str, timeout_s: float = 20) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := _processes_naming(text)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _work(call: subprocess.Popen, timeout_s: float = 60) -> Path:
    """The call's scratch folder (its logs and sweep), once it has one."""
    deadline = time.monotonic() + timeout_s
    while not (found := list(Path(tempfile.gettempdir()).glob(f"numdev_gpu_call_{call.pid}_*"))):
        assert time.monotonic() < deadline and call.poll() is None, "the call made no scratch folder"
        time.sleep(0.1)
    return found[0]


def _started(log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not (log.is_file() and log.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.1)  # numdev-train has started and printed


def _packed(out: Path, name: str) -> str:
    with tarfile.open(out / "gpu_call_files.tar.gz") as archive:
        return archive.extractfile(name).read().decode()


def _call(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / "scripts" / "gpu_call.py"), "--device", "cpu", *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_step_past_its_limit_is_stopped_with_its_group_and_the_call_goes_on(tmp_path):
    # the sweep's numdev-train takes several seconds (its imports alone): a 4 s limit cannot let it finish
    call = _call("--out", str(tmp_path), "--only", "lr_edge", "lr_edge_summary", "--limit", "lr_edge=4")
    _, err = call.communicate(timeout=120)
    record = json.loads((tmp_path / "gpu_call.json").read_text())
    edge, summary = record["steps"]
    assert call.returncode == 1 and record["complete"] is True and record["rehearsal"] is True, err
    assert edge["timed_out"] is True and edge["ok"] is False and edge["rc"] != 0 and edge["limit_s"] == 4
    assert 4 <= edge["seconds"] < 4 + 10 + 5  # the limit, then at most SIGTERM's grace and SIGKILL's wait
    # the summary ran on what the sweep left (no job finished): its own one-line refusal, recorded
    assert summary["rc"] == 2 and summary["ok"] is False and summary["outputs"] == []
    said = _packed(tmp_path, "logs/lr_edge_summary.log")
    assert said.startswith(f"lr_edge.py: error: {tempfile.gettempdir()}/numdev_gpu_call_{call.pid}_") and said.count("\n") == 1, said
    assert record["steps"][0]["log"] == "gpu_call_files.tar.gz:logs/lr_edge.log"
    work = f"numdev_gpu_call_{call.pid}_"
    assert _left(work) == [] and not list(Path(tempfile.gettempdir()).glob(f"{work}*"))  # no process, no folder left


def test_a_step_that_the_call_has_no_time_for_is_skipped_and_the_call_fails(tmp_path):
    assert load_script("gpu_call").main(["--device", "cpu", "--out", str(tmp_path), "--budget", "3", "--only", "lr_edge"]) == 1
    record = json.loads((tmp_path / "gpu_call.json").read_text())
    assert record["complete"] is True and "under this step's minimum of 40 s" in record["steps"][0]["skipped"]


def test_sigterm_to_the_call_stops_the_running_step_and_writes_the_record(tmp_path):
    call = _call("--out", str(tmp_path), "--only", "lr_edge", "lr_edge_summary")
    work = _work(call)
    _started(work / "logs" / "lr_edge.log")
    call.send_signal(signal.SIGTERM)
    _, err = call.communicate(timeout=60)
    record = json.loads((tmp_path / "gpu_call.json").read_text())
    assert call.returncode == 1 and "stopped" in record and record["complete"] is False, err
    assert [s["name"] for s in record["steps"]] == ["lr_edge"] and "stopped" in record["steps"][0]
    assert _packed(tmp_path, "logs/lr_edge.log")  # the stopped step's log came back in the archive
    assert _left(work.name) == [] and not work.exists()


def test_a_call_killed_outright_leaves_no_step_running(tmp_path):
    call = _call("--out", str(tmp_path), "--only", "lr_edge")
    work = _work(call)
    _started(work / "logs" / "lr_edge.log")
    assert _processes_naming(work.name)  # the sweep runs in its own session, in the call's scratch folder
    call.kill()
    call.communicate(timeout=30)
    assert _left(work.name, timeout_s=40) == []  # it got SIGTERM as its parent died
    # a killed call cannot tidy /tmp: the next call removes the scratch folders of calls no longer running
    assert work.exists()
    assert load_script("gpu_call").main(["--device", "cpu", "--out", str(tmp_path / "next"), "--budget", "3",
                                         "--only", "lr_edge"]) == 1  # skipped: no time
    assert not work.exists()


def test_a_second_call_into_the_same_folder_is_refused(tmp_path, capsys):
    (tmp_path / "gpu_call.json").write_text("{}")  # an earlier call's record, or one being written now
    with pytest.raises(SystemExit) as exit_:
        load_script("gpu_call").main(["--device", "cpu", "--out", str(tmp_path), "--only", "lr_edge"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "is not empty" in err
    assert (tmp_path / "gpu_call.json").read_text() == "{}"


@pytest.mark.parametrize("args, says", [
    (["--only", "kernels", "--device", "cpu"], "--only kernels: no such step (steps: correctness, kernels_bf16"),
    (["--budget", "0", "--device", "cpu"], "argument --budget: 0 must be >= 1"),
    (["--workers", "x", "--device", "cpu"], "argument --workers: 'x' is not an integer"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["--limit", "lr_edge=0", "--device", "cpu"], "--limit lr_edge=0: give STEP=SECONDS"),
    (["--limit", "nope=5", "--device", "cpu"], "--limit nope=5: give STEP=SECONDS"),
    (["--write-docs", "gpu", "--device", "cpu"], "argument --write-docs: invalid choice: 'gpu'"),
    (["--write-docs", "image", "--device", "cpu", "--only", "triton"], "--write-docs records a whole rehearsal"),
])
def test_bad_arguments_are_one_line_before_anything_runs(args, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        load_script("gpu_call").main(["--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "out").exists()


def test_an_out_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exit_:
        load_script("gpu_call").main(["--device", "cpu", "--out", str(tmp_path / "file"), "--only", "lr_edge"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "--out" in err and str(tmp_path / "file") in err


def test_cuda_without_a_gpu_says_to_rehearse_on_the_cpu(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    with pytest.raises(SystemExit) as exit_:
        load_script("gpu_call").main(["--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "no CUDA GPU" in err and "--device cpu" in err


@pytest.mark.slow
def test_the_whole_call_rehearses_on_the_cpu(tmp_path):
    """Every step of the GPU call, at rehearsal sizes: each exits as it should and writes its outputs."""
    call = _call("--out", str(tmp_path), "--budget", "900")
    _, err = call.communicate(timeout=1200)
    record = json.loads((tmp_path / "gpu_call.json").read_text())
    assert call.returncode == 0 and record["complete"] is True, err
    for step in record["steps"]:
        assert step["ok"] and not step["timed_out"], step
        assert all((tmp_path / name).is_file() for name in step["outputs"]), step
    # what --out holds is what the device machine sends back: 8 files at most, the rest packed
    assert load_script("gpu_call").returned(tmp_path)[1] == [] and "returned_over_limits" not in record
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(e["name"] for e in record["returned"]) == sorted(
        ["gpu_call.json", "gpu_call_files.tar.gz", "gpu_kernels_bf16.json", "gpu_kernels_fp16.json", "mufu_probe.json",
         "bench_triton.json", "bench_triton_causal.json", "lr_edge.json"])
    with tarfile.open(tmp_path / "gpu_call_files.tar.gz") as archive:
        members = set(archive.getnames())
    assert {f"logs/{step['name']}.log" for step in record["steps"]} | {"pytest_gpu.xml", "lr_edge.png"} <= members
    assert all(name in members for step in record["steps"] for name in step["packed"])
    assert any(name.startswith("lr_edge_runs/") and name.endswith("/run.json") for name in members)
    assert not any(name.startswith("lr_edge_sweep") for name in members)  # checkpoints stay behind
    kernels = json.loads((tmp_path / "gpu_kernels_bf16.json").read_text())
    assert kernels["complete"] is True and kernels["summary"]
    edge = json.loads((tmp_path / "lr_edge.json").read_text())
    assert {c["backend"] for c in edge["cells"]} == {"eager", "sdpa_flash"} and not edge["not_run"]


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_plan_fits_what_the_device_machine_sends_back(device, tmp_path):
    gpu_call = load_script("gpu_call")
    plan = gpu_call.steps(device, tmp_path / "out", tmp_path / "work", 15)
    top = ["gpu_call.json", gpu_call.ARCHIVE] + [name for step in plan for name in step.outputs]
    assert len(top) == len(set(top)) <= gpu_call.RETURN_FILES
    assert all(gpu_call.RETURN_NAME.fullmatch(name) for name in top)
    for step in plan:  # nothing else is written under --out: each path a command names there is an output
        named = {arg.split("=")[-1] for arg in step.command if str(tmp_path / "out") in arg}
        assert named == {str(tmp_path / "out" / name) for name in step.outputs}, step.name


def test_what_the_device_machine_would_not_send_back_is_named(tmp_path):
    returned = load_script("gpu_call").returned
    for i in range(8):
        (tmp_path / f"r{i}.json").write_text("{}")
    assert returned(tmp_path)[1] == []
    (tmp_path / "ninth.json").write_text("{}")
    assert returned(tmp_path)[1] == ["9 files, over the 8 the device machine sends back"]
    for path in tmp_path.iterdir():
        path.unlink()
    with open(tmp_path / "big.bin", "wb") as sparse:  # 17 MiB, sparse: no disk used
        sparse.truncate(17 << 20)
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep.json").write_text("{}")
    (tmp_path / "a b.json").write_text("{}")
    found, broken = returned(tmp_path)
    assert {e["name"]: e["bytes"] for e in found}["big.bin"] == 17 << 20
    assert sorted(broken) == ["a b.json: too deep or a name other than letters, digits, '.', '_' and '-'",
                      "a/b/c/deep.json: too deep or a name other than letters, digits, '.', '_' and '-'",
                      "big.bin: 17.0 MiB, over 16 MiB"]
    for i in range(4):
        with open(tmp_path / f"big{i}.bin", "wb") as sparse:
            sparse.truncate(16 << 20)
    assert returned(tmp_path)[1][-1] == "81.0 MiB in all, over 64 MiB"


def test_an_archive_that_cannot_be_written_is_one_line_and_the_record_goes_on(tmp_path, monkeypatch, capsys):
    from numdev.runs.atomic import WriteError

    gpu_call = load_script("gpu_call")

    def full(work, into):
        raise WriteError(into, OSError(28, "No space left on device"))

    monkeypatch.setattr(gpu_call, "pack", full)
    assert gpu_call.main(["--device", "cpu", "--out", str(tmp_path), "--budget", "3", "--only", "lr_edge"]) == 1  # skipped
    record = json.loads((tmp_path / "gpu_call.json").read_text())
    assert record["complete"] is True and "No space left on device" in record["archive_error"]
    assert [s["name"] for s in record["steps"]] == ["lr_edge"]
    err = capsys.readouterr().err
    assert "gpu_call: error: could not write" in err and "Traceback" not in err


def test_the_record_says_whether_the_gpu_runs_the_machine_code_read_here(tmp_path, monkeypatch):
    """On a GPU the provenance carries the SHA-256 of torch's CUDA library: the record names the committed
    kernel_sass results that read that very library (none when another torch runs); nothing without a GPU."""
    gpu_call = load_script("gpu_call")
    committed = json.loads((gpu_call.REPO / "docs" / "results" / "kernel_sass_torch211_sm90.json").read_text())
    assert gpu_call.machine_code_read_here({"versions": {"torch": "2.14.1"}}) is None
    assert gpu_call.machine_code_read_here({"versions": {"torch_cuda_sha256": committed["library_sha256"]}}) == [
        "kernel_sass_torch211_sm90.json"]
    assert gpu_call.machine_code_read_here({"versions": {"torch_cuda_sha256": "0" * 64}}) == []
