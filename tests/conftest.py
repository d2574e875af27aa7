from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import compose_train

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.manual_seed(0)
    yield


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
