from __future__ import annotations

import pytest
from helpers import compose_train


@pytest.fixture
def train_config():
    """compose_train(*overrides, run_dir=None): the numdev-train config with the smoke settings."""
    return compose_train
