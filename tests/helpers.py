"""Test helpers: compose the numdev-train config in-process, with the seconds-long smoke settings;
SIGKILL a process once it has got far enough."""

from __future__ import annotations

import os
import signal
import time

from hydra import compose, initialize_config_module


def compose_train(*overrides: str, run_dir=None, smoke: bool = True):
    """The numdev-train config as the command line would compose it (no Hydra run dir involved)."""
    base = ["experiment=train_smoke"] if smoke else []
    if run_dir is not None:
        base.append(f"run_dir={run_dir}")
    with initialize_config_module(config_module="numdev.conf.train", version_base="1.3"):
        return compose(config_name="train", overrides=[*base, *overrides])


def kill_when(process, reached, timeout_s: float = 240) -> None:
    """SIGKILL `process` as soon as reached() is true (polled every 10 ms); fail if it ends first or
    timeout_s passes. The process is reaped either way."""
    deadline = time.monotonic() + timeout_s
    try:
        while not reached():
            assert process.poll() is None, f"finished before it could be killed: {process.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, f"not reached within {timeout_s:g} s"
            time.sleep(0.01)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()


# What a numdev command's console must not show unless numdev means to: library noise and tracebacks
# (Hydra's schema-name deprecation, Lightning's hints and its srun/LeafSpec warnings, TensorBoard's
# directory watcher, loky's leaked-folder warning, repeated "[n/a: ...]" markers).
CONSOLE_NOISE = ("Traceback", "Warning", "warnings.warn", "deprecated", "[HYDRA]", "No path found after", "leaked",
                 "KeyError", "GPU available", "TPU available", "srun", "LeafSpec", "litlogger", "Trainer.fit", "[n/a:")


def console_noise(*outputs: str) -> list[str]:
    """The lines of a command's stdout/stderr that hold any of CONSOLE_NOISE."""
    return [line for text in outputs for line in text.splitlines() if any(n in line for n in CONSOLE_NOISE)]
