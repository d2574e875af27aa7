"""The memory estimate reads the sizes the model will be built with: a size deleted on the command
line (`~model.depth`) is its constructor's default, not a crash after the run's directory exists."""

import pytest
from helpers import compose_train
from omegaconf import open_dict

from numdev.train.memory import estimate


def test_a_deleted_size_is_the_constructors_default():
    deleted = estimate(compose_train("~model.depth", run_dir="/tmp/unused"), None, parameters=0)
    default = estimate(compose_train("model.depth=12", run_dir="/tmp/unused"), None, parameters=0)  # DiT(depth=12)
    given = estimate(compose_train("model.depth=2", run_dir="/tmp/unused"), None, parameters=0)
    assert deleted == default and given.activation_bytes < default.activation_bytes


def test_a_deleted_size_without_a_default_is_one_line_naming_it():
    cfg = compose_train("~model.depth", run_dir="/tmp/unused")
    with open_dict(cfg):
        cfg.model._target_ = "builtins.dict"  # a constructor that gives depth no default
    with pytest.raises(ValueError, match=r"model.depth is not set and builtins.dict gives it no default: set model.depth=\.\.\."):
        estimate(cfg, None, parameters=0)
