"""Test helpers: compose the numdev-train config in-process, with the seconds-long smoke settings."""

from __future__ import annotations

from hydra import compose, initialize_config_module


def compose_train(*overrides: str, run_dir=None, smoke: bool = True):
    """The numdev-train config as the command line would compose it (no Hydra run dir involved)."""
    base = ["experiment=train_smoke"] if smoke else []
    if run_dir is not None:
        base.append(f"run_dir={run_dir}")
    with initialize_config_module(config_module="numdev.conf", version_base="1.3"):
        return compose(config_name="train", overrides=[*base, *overrides])
