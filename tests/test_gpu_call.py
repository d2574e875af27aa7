"""scripts/gpu_call.py, issue 37's one prepared GPU call, rehearsed here with --device cpu: a step past
its limit is stopped with its whole process group and the rest of the call is skipped and said to be,
a SIGTERM to the call stops the running step and writes the record, and bad arguments are one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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
    said = (tmp_path / "logs" / "lr_edge_summary.log").read_text()
    assert said.startswith("lr_edge.py: error: /tmp/numdev_lr_edge_") and said.count("\n") == 1, said
    sweep = f"numdev_lr_edge_{call.pid}"
    assert _left(sweep) == [] and not (Path("/tmp") / sweep).exists()  # no process, no folder left behind


def test_a_step_that_the_call_has_no_time_for_is_skipped_and_the_call_fails(tmp_path):
    assert load_script("gpu_call").main(["--device", "cpu", "--out", str(tmp_path), "--budget", "3", "--only", "lr_edge"]) == 1
    record = json.loads((tmp_path / "gpu_call.json").read_text())
    assert record["complete"] is True and "under this step's minimum of 40 s" in record["steps"][0]["skipped"]


def test_sigterm_to_the_call_stops_the_running_step_and_writes_the_record(tmp_path):
    call = _call("--out", str(tmp_path), "--only", "lr_edge", "lr_edge_summary")
    log = tmp_path / "logs" / "lr_edge.log"
    deadline = time.monotonic() + 60
    while not (log.is_file() and log.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.1)  # numdev-train has started and printed
    call.send_signal(signal.SIGTERM)
    _, err = call.communicate(timeout=60)
    record = json.loads((tmp_path / "gpu_call.json").read_text())
    assert call.returncode == 1 and "stopped" in record and record["complete"] is False, err
    assert [s["name"] for s in record["steps"]] == ["lr_edge"] and "stopped" in record["steps"][0]
    assert _left(f"numdev_lr_edge_{call.pid}") == []


def test_a_call_killed_outright_leaves_no_step_running(tmp_path):
    call = _call("--out", str(tmp_path), "--only", "lr_edge")
    log = tmp_path / "logs" / "lr_edge.log"
    deadline = time.monotonic() + 60
    while not (log.is_file() and log.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_naming(f"numdev_lr_edge_{call.pid}")  # the sweep runs in its own session
    call.kill()
    call.communicate(timeout=30)
    assert _left(f"numdev_lr_edge_{call.pid}", timeout_s=40) == []  # it got SIGTERM as its parent died
    # a killed call cannot tidy /tmp: the next call removes the sweeps of calls no longer running (here, or a
    # call another test starts meanwhile), never a live one's
    gpu_call = load_script("gpu_call")
    gpu_call.remove_stale_sweeps()
    assert not (Path("/tmp") / f"numdev_lr_edge_{call.pid}").exists()
    root = tmp_path / "sweeps"
    stale, live = root / f"numdev_lr_edge_{call.pid}", root / f"numdev_lr_edge_{os.getpid()}"
    for folder in (stale, live):
        (folder / "0").mkdir(parents=True)
    assert gpu_call.remove_stale_sweeps(root) == [str(stale)] and not stale.exists() and live.is_dir()


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
    kernels = json.loads((tmp_path / "gpu_kernels_bf16.json").read_text())
    assert kernels["complete"] is True and kernels["summary"]
    edge = json.loads((tmp_path / "lr_edge.json").read_text())
    assert {c["backend"] for c in edge["cells"]} == {"eager", "sdpa_flash"} and not edge["not_run"]
