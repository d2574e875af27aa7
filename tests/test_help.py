"""Every console command answers --help; the Hydra apps list their config groups."""

from __future__ import annotations

import importlib

import pytest
import tomllib
from conftest import REPO, run_cli

SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
HYDRA_APPS = {"numdev-bench": ("numerics", "inputs", "methods", "experiment"), "numdev-train": ("attention", "precision", "model", "study")}


@pytest.mark.parametrize("command", sorted(set(SCRIPTS) - set(HYDRA_APPS)))
def test_argparse_commands_have_help(command, capsys):
    module, function = SCRIPTS[command].split(":")
    with pytest.raises(SystemExit) as exit_:
        getattr(importlib.import_module(module), function)(["--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(HYDRA_APPS))
def test_hydra_apps_list_their_groups(command, tmp_path):
    module = SCRIPTS[command].split(":")[0]
    out = run_cli(module, "--help", cwd=tmp_path).stdout
    assert "== Configuration groups ==" in out
    for group in HYDRA_APPS[command]:
        assert f"\n{group}:" in out, group
