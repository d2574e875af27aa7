"""The install is quiet: every config folder is declared as a package in pyproject.toml (setuptools
warns "Package 'numdev.conf.<group>' is absent from the packages configuration" for each one left
out, and drops its files from a wheel)."""

from __future__ import annotations

from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def test_every_config_folder_is_a_declared_package():
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        "numdev.conf" + "".join(f".{part}" for part in d.relative_to(REPO / "conf").parts)
        for d in [REPO / "conf", *(REPO / "conf").rglob("*")] if d.is_dir() and any(d.glob("*.yaml")) or d == REPO / "conf"
    }
    missing = sorted(folders - declared)
    assert missing == [], f"add to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_every_source_package_is_declared():
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    source = REPO / "src"
    packages = {".".join(p.parent.relative_to(source).parts) for p in source.rglob("__init__.py")
                if "conf" not in p.relative_to(source).parts and "kernels" not in p.relative_to(source).parts}
    missing = sorted(packages - declared)
    assert missing == [], f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
