"""Reliability, round three (issue 32 item 3): the faults a catalogue Case cannot express.

- a sweep's process killed outright leaves no worker behind (a real process tree, a real SIGKILL);
- scripts check every argument and output path before their first computation (real processes);
- readers measure a file before they read it whole (held-out predictions; an older checkpoint record);
- a comparing run whose reference nothing is going to make does not wait for it.

The bad inputs that a Case can express are in test_bad_input_catalogue.py (its "round three" block).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO
from helpers import compose_train

from numdev.cli.commands import argv


def _session(sid: int) -> list[str]:
    """Live (not zombie) processes of session `sid`: their command lines."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            if os.getsid(int(entry.name)) == sid and stat[stat.rindex(")") + 2] != "Z":
                found.append((entry / "cmdline").read_text().replace("\0", " ")[:160])
        except (OSError, ValueError):
            continue
    return found


def _kill_session(sid: int) -> None:
    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_sweep_killed_outright_leaves_no_worker_behind(tmp_path):
    """SIGKILL to a parallel sweep's own process: its two workers (mid-training) and loky's resource
    trackers are gone within seconds (PR_SET_PDEATHSIG and the workers' parent watchdog), not training on."""
    pytest.importorskip("joblib")
    sweep = tmp_path / "sweep"
    command = [*argv("numdev-train"), "-m", "hydra/launcher=parallel", "experiment=train_smoke", "trainer.max_steps=100000",
               "seed.init=0,1", "threads=1", "logger=[]", "callbacks.checkpoint=null", f"hydra.sweep.dir={sweep}"]
    process = subprocess.Popen(command, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not all((sweep / job / "weights" / "index.json").exists() for job in ("0", "1")):
            assert process.poll() is None, process.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the two jobs did not start training"
            time.sleep(0.2)
        assert len(_session(process.pid)) >= 3  # the sweep, its two workers (and loky's trackers)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 10
        while _session(process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session(process.pid) == []
    finally:
        _kill_session(process.pid)
    for job in ("0", "1"):  # their runs: "running", lock free, so resume=auto (and the next sweep end) take them up
        assert json.loads((sweep / job / "run.json").read_text())["status"] == "running"


SCRIPT_MISTAKES = [
    ("gpu_kernels.py", ["--device", "cpu", "--seeds", str(2**64)], "argument --seeds: 18446744073709551616 must be a non-negative integer below 2^64"),
    ("gpu_kernels.py", ["--device", "cpu", "--seeds", "0", "1", "0"], "--seeds lists 0 more than once: each seed is one independent replicate"),
    ("gpu_kernels.py", ["--device", "cpu", "--out", "{tmp}"], "--out {tmp}: {tmp} is a directory, not a regular file"),
    ("gpu_kernels.py", ["--device", "cpu", "--out", "{tmp}/file/out.json"], "{tmp}/file is not a directory"),
    ("gpu_kernels.py", ["--device", "cpu", "--seeds", "-1"], "-1 must be a non-negative integer below 2^64"),
    ("validate_cpu_kernel.py", ["--seeds", "2", "2"], "--seeds lists 2 more than once"),
    ("why_high_precision_ratio.py", ["--seeds", "1", "1"], "--seeds lists 1 more than once"),
    ("bench_emulator.py", ["--seed", str(2**64)], "must be a non-negative integer below 2^64"),
    ("bench_wasserstein.py", ["--out", "{tmp}"], "is a directory, not a regular file"),
    ("bench_train_step.py", ["--out", "{tmp}/file/x.json"], "{tmp}/file is not a directory"),
    ("tie_fix_bias.py", ["--docs-only", "--write-docs"], "--write-docs: not allowed with argument --docs-only"),
    ("qiu_yao_search.py", ["--write-docs", "--docs-only"], "--docs-only: not allowed with argument --write-docs"),
]


@pytest.mark.parametrize(("script", "args", "message"), SCRIPT_MISTAKES, ids=[f"{s}-{i}" for i, (s, _, _) in enumerate(SCRIPT_MISTAKES)])
def test_a_script_refuses_bad_arguments_before_it_computes(script, args, message, tmp_path, monkeypatch, capsys):
    """Each script's own main() with the command line as given (in this process: the scripts' imports are
    this test process's already, so the check is what is timed, not torch's import)."""
    from helpers import load_script

    (tmp_path / "file").write_text("a regular file")
    args = [a.format(tmp=tmp_path) for a in args]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO / "scripts"))  # as when the script runs: its folder first on sys.path
    monkeypatch.setattr(sys, "argv", [str(REPO / "scripts" / script), *args])
    with pytest.raises(SystemExit) as exit_:
        load_script(script.removesuffix(".py")).main()
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_.value.code == 2, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), err[-3000:]
    assert message.format(tmp=tmp_path) in lines[0]
    assert out == ""  # nothing computed, nothing printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written


def test_heldout_predictions_extended_are_refused_before_they_are_read(tmp_path):
    from numdev.runs.atomic import write_json
    from numdev.runs.layout import HELDOUT, RunDir, write_heldout_predictions

    entry = write_heldout_predictions(tmp_path, np.zeros((2, 3, 4, 4), np.float32), step=2, images=2, seed=0)
    write_json(tmp_path / HELDOUT, {"step": 2, "heldout_loss": 0.5, "images": 2, "seed": 0, "predictions": entry})
    assert RunDir(tmp_path).read_heldout_predictions()[0].shape == (2, 3, 4, 4)
    os.truncate(tmp_path / entry["file"], 100 << 30)  # sparse: a bad copy, a tool gone wrong
    with pytest.raises(ValueError, match=r"107374182400 bytes, not the \d+ heldout.json records"):
        RunDir(tmp_path).read_heldout_predictions()


def test_a_checkpoint_whose_record_predates_sizes_still_loads(tmp_path):
    """Checksum records written before the sizes were kept ({"sha256", "previous"} only) still verify."""
    from numdev.runs.layout import CHECKPOINT, checkpoint_digest_path
    from numdev.train.checkpoint_io import load_checkpoint
    from numdev.train.run import train

    threads = torch.get_num_threads()
    try:
        train(compose_train("trainer.max_steps=2", run_dir=tmp_path / "run"))
    finally:
        torch.set_num_threads(threads)
    path = tmp_path / "run" / CHECKPOINT
    digest = checkpoint_digest_path(path)
    record = json.loads(digest.read_text())
    assert record["bytes"] == path.stat().st_size
    digest.write_text(json.dumps({"sha256": record["sha256"], "previous": record["previous"]}))
    assert load_checkpoint(path)["global_step"] == 2


def test_a_reference_nothing_will_make_is_not_waited_for(tmp_path, monkeypatch):
    """A reference that does not exist, outside any sweep of this run: refused at setup, not after
    sibling.timeout_s; an existing directory that holds no run and whose lock no process holds: refused
    once the start-up grace has passed, not after sibling.timeout_s."""
    from numdev.train.callbacks import sibling
    from numdev.train.run import train

    cfg = compose_train(f"sibling.reference={tmp_path / 'nowhere'}", run_dir=tmp_path / "run")
    start = time.monotonic()
    with pytest.raises(sibling.SiblingError, match=r"nowhere does not exist, and no job of this run's sweep makes it"):
        train(cfg)
    assert time.monotonic() - start < 120
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(sibling, "STARTUP_GRACE_S", 0.3)
    callback = sibling.SiblingDistance(str(tmp_path / "me"), str(tmp_path / "empty"), timeout_s=3600, poll_s=0.05)
    start = time.monotonic()
    with pytest.raises(sibling.SiblingError, match=r"empty is not a numdev-train run: it has no run.json"):
        callback.wait_for(0)
    assert time.monotonic() - start < 30
