"""Helpers shared by the tests, in one place: compose and train the numdev-train config in-process (the
seconds-long smoke settings); run a numdev command the way a user does; read a run's snapshots; wait
for a process to reach a state (polled, with a generous timeout: never a sleep standing in for a
state); SIGKILL it there; find what a session of processes left behind."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from numdev.cli import workers

REPO = Path(__file__).resolve().parents[1]


# -- in-process ---------------------------------------------------------------------------------------
def compose_train(*overrides: str, run_dir=None, smoke: bool = True):
    """The numdev-train config as the command line would compose it (no Hydra run dir involved)."""
    from hydra import compose, initialize_config_module

    base = ["experiment=train_smoke"] if smoke else []
    if run_dir is not None:
        base.append(f"run_dir={run_dir}")
    with initialize_config_module(config_module="numdev.conf.train", version_base="1.3"):
        return compose(config_name="train", overrides=[*base, *overrides])


def flat_config(*overrides: str, smoke: bool = True) -> dict:
    """The composed numdev-train config, resolved, as {dotted.key: value} (run_dir a placeholder)."""
    from omegaconf import OmegaConf

    out = {}

    def walk(node, prefix=""):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(OmegaConf.to_container(compose_train(*overrides, "run_dir=/tmp/x", smoke=smoke), resolve=True))
    return out


def train_run(*overrides: str, run_dir, smoke: bool = True) -> dict:
    """train(compose_train(...)): a whole smoke run in this process; its run record. (A run with
    threads=N sets torch's threads for the process: conftest puts them back after each test.)"""
    from numdev.train.run import train

    return train(compose_train(*overrides, run_dir=run_dir, smoke=smoke))


def load_script(name: str):
    """scripts/<name>.py as a module (the scripts are not a package), to call its functions in-process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import does: dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# -- files for the data modules -------------------------------------------------------------------------
def png_bytes(colour, size=(20, 12)) -> bytes:
    """An RGB PNG of one colour."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    """A tar archive (a WebDataset shard) of (name, bytes) members, in memory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# -- real command lines -------------------------------------------------------------------------------
def die_with_parent() -> None:
    """preexec_fn: the command gets SIGTERM when the test process that started it dies, however it dies
    (a killed test run leaves no numdev command running; numdev.cli.workers.die_with_parent)."""
    workers.die_with_parent(signal.SIGTERM)


def run_cli(module: str, *args: str, cwd: Path, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a numdev console command the way a user does (python -m keeps it on this venv)."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    result = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
        preexec_fn=die_with_parent,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{module} {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def run_numdev(program: str, *args: str, cwd: Path, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """The console script `program` (numdev-train, ...) beside this interpreter, else python -m: run to
    its end, its output captured."""
    from numdev.cli.commands import argv

    return subprocess.run([*argv(program), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
                          preexec_fn=die_with_parent)


def start_numdev(program: str, *args: str, cwd: Path, new_session: bool = False, env: dict | None = None) -> subprocess.Popen:
    """The console script `program` started in the background (stderr kept, stdout dropped); in its own
    session with new_session, so that everything it starts can be found (session_processes) and a
    Ctrl-C can reach its whole group."""
    from numdev.cli.commands import argv

    return subprocess.Popen([*argv(program), *args], cwd=cwd, start_new_session=new_session, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def error_lines(stderr: str, program: str = "numdev-train") -> list[str]:
    """The `<program>: error: ...` lines of a command's stderr."""
    return [line for line in stderr.splitlines() if line.startswith(f"{program}: error: ")]


# -- a run's records ----------------------------------------------------------------------------------
def snapshot_hashes(run_dir: Path) -> dict[int, str]:
    """{step: sha256} of the run's snapshot index; {} while it has none (it is never half-written)."""
    try:
        return {e["step"]: e["sha256"] for e in json.loads((Path(run_dir) / "weights" / "index.json").read_text())["snapshots"]}
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return {}


def latest_snapshot(run_dir: Path) -> int:
    """The step of the run's newest snapshot, -1 before the first."""
    return max(snapshot_hashes(run_dir), default=-1)


def run_record(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


def append_records(path: str, writer: int, count: int) -> None:
    """`count` records of > a page each (no accidental atomicity) appended one by one: a writer process
    (spawned: this module imports little, so the writers start fast)."""
    from numdev.runs.atomic import append_jsonl

    for i in range(count):
        append_jsonl(path, [{"writer": writer, "i": i, "pad": "x" * 20_000}])


# -- waiting for a state ------------------------------------------------------------------------------
def wait_until(reached: Callable[[], bool], what: str, process: subprocess.Popen | None = None, timeout_s: float = 300) -> None:
    """Poll reached() until it is true; fail if `process` ends first (with its stderr) or timeout_s
    passes (a bound for a machine that is very slow or loaded, not a measurement)."""
    deadline = time.monotonic() + timeout_s
    while not reached():
        if process is not None and process.poll() is not None:
            stderr = process.stderr.read()[-3000:] if process.stderr else ""
            raise AssertionError(f"the process ended (exit {process.returncode}) before {what}: {stderr}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout_s:g} s")
        time.sleep(0.01)


def kill_when(process: subprocess.Popen, reached: Callable[[], bool], timeout_s: float = 300) -> None:
    """SIGKILL `process` as soon as reached() is true; fail if it ends first or timeout_s passes. The
    process is reaped either way."""
    try:
        wait_until(reached, "it could be killed", process, timeout_s)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL every process of the session `process` leads (started with new_session=True)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def session_processes(sid: int) -> list[str]:
    """Live (not zombie) processes of session `sid`: their command lines."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            if os.getsid(int(entry.name)) == sid and stat[stat.rindex(")") + 2] != "Z":
                found.append((entry / "cmdline").read_text().replace("\0", " ")[:200])
        except (OSError, ValueError):
            continue
    return found


def no_process_left(sid: int, timeout_s: float = 60) -> list[str]:
    """The session's processes, polled until there are none (loky's resource tracker exits a moment
    after the command, when its pipe closes) or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def free_port() -> int:
    """A TCP port no one listens on now (the OS picks it), for a daemon a test starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What a numdev command's console must not show unless numdev means to: library noise and tracebacks
# (Hydra's schema-name deprecation, Lightning's hints and its srun/LeafSpec warnings, TensorBoard's
# directory watcher, loky's leaked-folder warning, repeated "[n/a: ...]" markers).
CONSOLE_NOISE = ("Traceback", "Warning", "warnings.warn", "deprecated", "[HYDRA]", "No path found after", "leaked",
                 "KeyError", "GPU available", "TPU available", "srun", "LeafSpec", "litlogger", "Trainer.fit", "[n/a:")


def console_noise(*outputs: str) -> list[str]:
    """The lines of a command's stdout/stderr that hold any of CONSOLE_NOISE."""
    return [line for text in outputs for line in text.splitlines() if any(n in line for n in CONSOLE_NOISE)]
