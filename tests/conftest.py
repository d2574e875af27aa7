from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import compose_train

REPO = Path(__file__).resolve().parents[1]


def _machine_lines() -> list[str]:
    """What the run's numbers depend on: the CPU and its vector/matrix extensions, the kernels torch
    dispatches to (its CPU capability) and the BLAS."""
    from numdev.runs.provenance import cpu_flags_of_interest, cpu_model

    blas = next((line.strip(" -") for line in torch.__config__.show().splitlines() if "Math Kernel Library" in line
                 or "OpenBLAS" in line), "BLAS unknown")
    return [f"cpu: {cpu_model()}, {os.cpu_count()} logical CPU(s); flags: {' '.join(cpu_flags_of_interest()) or 'none of interest'}",
            f"torch {torch.__version__}: CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} "
            f"thread(s); {blas}"]


def pytest_terminal_summary(terminalreporter):
    """The machine, at the end of every test run (also under -q, which hides pytest's header)."""
    terminalreporter.section("machine")
    for line in _machine_lines():
        terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _loggers_enabled_again():
    """An in-process Hydra run with hydra/job_logging=disabled (Hydra's own config: disable_existing_loggers)
    disables every logger that exists; later tests reading numdev's log lines (caplog) would see nothing."""
    yield
    for logger in logging.Logger.manager.loggerDict.values():
        if isinstance(logger, logging.Logger):
            logger.disabled = False


def run_cli(module: str, *args: str, cwd: Path, check: bool = True, timeout: int = 600):
    """Run a numdev console command the way a user does (python -m keeps it on this venv)."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    result = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{module} {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture
def train_config():
    """compose_train(*overrides, run_dir=None): the numdev-train config with the smoke settings."""
    return compose_train
