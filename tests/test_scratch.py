"""numdev.runs.scratch: a scratch folder left by a process killed outright (a real SIGKILL) is removed
by the next process of its kind; a live owner's folder, a folder without a pid and a link are not; a
folder whose pid now belongs to a process started at another time (the pid reused) is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from numdev.runs.scratch import remove_stale, scratch

KILLED = """
import os, signal, sys
from numdev.runs.scratch import scratch
with scratch("numdev_test_", sys.argv[1]) as folder:
    open(os.path.join(folder, "cache.bin"), "wb").write(b"x" * 4096)
    print(folder, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_folder_a_sigkill_left_is_removed_by_the_next_run_and_nothing_else_is(tmp_path):
    done = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    left = done.stdout.strip()
    assert os.path.isfile(os.path.join(left, "cache.bin"))  # what TemporaryDirectory would leave for good
    alive = tmp_path / f"numdev_test_{os.getpid()}_other"  # another run of the same kind, still running (this process)
    alive.mkdir()
    no_pid = tmp_path / "numdev_test_notapid"
    no_pid.mkdir()
    link = tmp_path / "numdev_test_999999999_link"
    link.symlink_to(no_pid)
    started = open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[19]  # this process's start time
    me = tmp_path / f"numdev_test_{os.getpid()}_s{started}_other"  # named as scratch names them: alive
    me.mkdir()
    reused = tmp_path / f"numdev_test_{os.getpid()}_s{int(started) - 1}_old"  # this pid, another process: gone
    reused.mkdir()
    with scratch("numdev_test_", tmp_path) as mine:
        assert not os.path.exists(left) and not reused.exists()
        assert os.path.basename(mine).startswith(f"numdev_test_{os.getpid()}_s{started}_") and os.path.isdir(mine)
        assert alive.is_dir() and me.is_dir() and no_pid.is_dir() and link.is_symlink()
    assert not os.path.exists(mine)
    assert remove_stale(tmp_path, "numdev_test_") == []


def test_the_folder_goes_when_the_block_fails(tmp_path):
    with pytest.raises(RuntimeError), scratch("numdev_test_", tmp_path) as folder:
        (open(os.path.join(folder, "f"), "w")).write("x")
        raise RuntimeError("a failure inside")
    assert not os.path.exists(folder) and list(tmp_path.iterdir()) == []
