"""Common mistakes get a one-line answer that names the fix, not silence or a constructor's TypeError."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import REPO, run_cli

from numdev.cli.commands import script
from numdev.config.groups import app_defaults, experiment_app, options, override_mistake
from numdev.train.callbacks.snapshots import SnapshotWriter


def _with_scripts(text: str) -> str:
    """{numdev-train} -> the console script as numdev prints it here (.venv/bin/numdev-train under make's venv)."""
    for name in ("numdev-train", "numdev-bench"):
        text = text.replace("{" + name + "}", script(name))
    return text


def _run(tmp, name, value):
    writer = SnapshotWriter(tmp / name, "m", {"w": [3, 2]})
    for step in (0, 2):
        writer.write(step, {"w": torch.full((3, 2), value + step)})
    return tmp / name


def test_compare_refuses_the_same_run_twice(tmp_path):
    run = _run(tmp_path, "a", 0.0)
    for other in (str(run), f"{tmp_path}/./a", f"{tmp_path}/a/"):
        result = run_cli("numdev.analysis.compare", str(run), other, cwd=tmp_path, check=False)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.startswith("numdev-compare: error: ") and "are the same run directory" in result.stderr
        assert result.stderr.count("\n") == 1
    (tmp_path / "link").symlink_to(run)
    result = run_cli("numdev.analysis.compare", str(run), str(tmp_path / "link"), cwd=tmp_path, check=False)
    assert result.returncode == 2 and "are the same run directory" in result.stderr
    assert not (run / "compare_a").exists() and not (run / "compare_link").exists()  # nothing written


def test_compare_of_a_sweep_names_its_runs(tmp_path):
    _run(tmp_path / "sweep", "reference", 0.0)
    _run(tmp_path / "sweep", "flash", 0.5)
    result = run_cli("numdev.analysis.compare", str(tmp_path / "sweep"), str(tmp_path / "sweep" / "flash"), cwd=tmp_path, check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"{tmp_path / 'sweep'} is a sweep holding 2 run(s), not one run: compare two runs ({tmp_path / 'sweep' / 'flash'}, " in result.stderr


def test_compare_warns_loudly_when_two_runs_are_bit_identical(tmp_path):
    a = _run(tmp_path, "a", 0.0)
    shutil.copytree(a, tmp_path / "copy")
    result = run_cli("numdev.analysis.compare", str(a), str(tmp_path / "copy"), cwd=tmp_path)
    assert "WARNING" in result.stderr and "bit-identical at every compared step (2 steps)" in result.stderr
    summary = json.loads((a / "compare_copy" / "compare.json").read_text())
    assert summary["bit_identical"] is True and summary["final"]["step"] == 2
    assert summary["final"]["max_abs"] == summary["final"]["mean_abs"] == summary["final"]["pooled_wasserstein"] == 0.0
    assert summary["provenance"]["machine"]["cpu"]


def test_compare_of_two_different_runs_is_quiet_and_records_provenance(tmp_path):
    a, b = _run(tmp_path, "a", 0.0), _run(tmp_path, "b", 0.5)
    result = run_cli("numdev.analysis.compare", str(a), str(b), cwd=tmp_path)
    assert "WARNING" not in result.stderr
    summary = json.loads((a / "compare_b" / "compare.json").read_text())
    assert summary["bit_identical"] is False and summary["final"]["max_abs"] == 0.5 and summary["steps"] == [0, 2]
    assert summary["final"]["wasserstein"] == pytest.approx(0.5)
    assert len(summary["provenance"]["git"]["commit"]) == 40


@pytest.mark.parametrize(
    ("module", "args", "expected"),
    [
        # Hydra would suggest +data.root, which then fails in ShapesDataModule's constructor.
        ("numdev.train.app", ["data.root=/tmp/images"], "data.root is a setting of data=folder, not of data=shapes (the data in use): "
         "choose it too, e.g. {numdev-train} data=folder data.root=/tmp/images"),
        ("numdev.bench.app", ["trainer=gpu"], "trainer is a config group of numdev-train, not of numdev-bench: run {numdev-train} trainer=gpu"),
    ],
)
def test_an_override_for_another_option_or_app_is_one_line_naming_the_fix(tmp_path, monkeypatch, module, args, expected):
    result = run_cli(module, *args, f"output_root={tmp_path}", cwd=REPO, check=False)
    monkeypatch.chdir(REPO)  # the command is printed as the user in REPO types it
    expected = _with_scripts(expected)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    program = "numdev-train" if "train" in module else "numdev-bench"
    assert result.stderr.startswith(f"{program}: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr
    assert not (tmp_path / "train").exists() and not (tmp_path / "bench").exists()  # nothing ran


@pytest.mark.parametrize(
    ("app", "args", "expected"),
    [
        ("train", ["+data.root=/tmp/images"], "e.g. {numdev-train} data=folder data.root=/tmp/images"),
        ("train", ["data.shards=/d/shard-0.tar"], "data.shards is a setting of data=webdataset, not of data=shapes"),
        ("train", ["experiment=train_gpu_base", "data.manifest=c.csv"], "data.manifest is a setting of data=folder, not of data=shapes"),
        ("train", ["experiment=fig4"], "experiment=fig4 is a numdev-bench experiment, not a numdev-train one: "
         "run {numdev-bench} experiment=fig4"),
        ("bench", ["experiment=flash_stability"], "experiment=flash_stability is a numdev-train experiment"),
        ("bench", ["-m", "trainer.max_steps=3,4"], "trainer.max_steps is a setting of numdev-train, not of numdev-bench"),
        ("train", ["numerics=fa2"], "numerics is a config group of numdev-bench, not of numdev-train"),
        ("bench", ["-m", "numerics.precision=bf16,fp16", "--help"], "--help with a sweep (a,b,c): Hydra's help cannot read sweeps"),
    ],
)
def test_overrides_that_belong_elsewhere_are_named(app, args, expected):
    assert _with_scripts(expected) in (override_mistake(app, args) or "")


@pytest.mark.parametrize(
    ("app", "args"),
    [
        ("train", ["data=folder", "data.root=/x"]),  # the fix itself
        ("train", ["experiment=train_gpu_base", "data.resolution=64", "trainer.devices=2"]),
        ("train", ["trainer=ddp_cpu", "trainer.strategy=ddp"]),  # a key inherited from the option's defaults
        ("train", ["-m", "data=folder,shapes", "data.root=/x"]),  # a sweep over options: Hydra decides per job
        ("train", ["attention@shadow=baseline", "callbacks.shadow.every_n_steps=5"]),
        ("bench", ["numerics=fa2", "numerics.accum=bf16", "tiles.block_c=32", "shape.seq_q=128"]),
        ("bench", ["-m", "experiment=fig4", "hydra/launcher=parallel"]),
        ("bench", ["-m", "seeds=[0,1,2]", "--help"]),  # a list, not a sweep
        ("train", ["data.nope=1"]),  # a key no option has: Hydra's own error names it
        ("bench", ["numerics=fastest", "numerics.precision=fp16"]),  # an unknown option: Hydra lists the options
    ],
)
def test_valid_overrides_pass_the_check(app, args):
    assert override_mistake(app, args) is None


def test_every_experiment_belongs_to_one_app():
    """--help and the checks above tell the apps' experiments apart by the folder each is in
    (conf/<app>/experiment/): a name in both would be ambiguous."""
    for name in options("experiment"):
        assert experiment_app(name) in ("bench", "train"), f"experiment {name} is in both conf/bench/experiment and conf/train/experiment"
    assert set(options("experiment", "bench")).isdisjoint(options("experiment", "train"))


@pytest.mark.parametrize(("app", "foreign"), [("bench", ("trainer", "model", "study", "data", "flash_stability")),
                                              ("train", ("numerics", "inputs", "fig4"))])
def test_help_lists_only_the_apps_own_groups(app, foreign, tmp_path):
    out = run_cli(f"numdev.{app}.app", "--help", cwd=tmp_path).stdout
    groups = out.split("== Configuration groups ==")[1].split("== Config ==")[0]
    for group in app_defaults(app):
        assert f"\n{group}: " in groups, group
    for name in foreign:
        assert name not in groups, name


def test_a_shadow_that_is_the_training_backend_warns(tmp_path):
    """attention@shadow=baseline with attention=baseline: every per-call deviation is 0, said loudly."""
    from types import SimpleNamespace

    from numdev.attention import build_backend
    from numdev.models.attention import Attention
    from numdev.train.callbacks.shadow import ShadowDeviation

    model = torch.nn.Sequential(Attention(32, 4, build_backend("baseline")))
    callback = ShadowDeviation(str(tmp_path), backend=build_backend("baseline"))
    with pytest.warns(UserWarning, match="attention@shadow is the training backend itself"):
        callback.setup(None, SimpleNamespace(model=model), "fit")
    callback.teardown(None, None, "fit")
    other = ShadowDeviation(str(tmp_path), backend=build_backend("sdpa_math"))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        other.setup(None, SimpleNamespace(model=model), "fit")  # another backend: no warning
    other.teardown(None, None, "fit")


def test_an_added_key_that_reaches_a_constructor_names_the_option(tmp_path, monkeypatch, capsys):
    """Past the command-line check (e.g. an experiment adds the key): the constructor's TypeError is named."""
    from hydra.core.global_hydra import GlobalHydra

    from numdev.config.groups import unexpected_key

    assert unexpected_key("data", "root") == (
        "data.root is not a setting of the chosen data: it is one of data=folder; "
        "choose that option too (data=folder data.root=...) instead of +data.root"
    )
    assert unexpected_key("data", "nope") == "data.nope is not a setting of data: remove +data.nope (see --help for the keys it has)"
    # through numdev-train, with the command-line check bypassed (an experiment could add the key)
    import sys

    from numdev.train import app

    monkeypatch.setattr("numdev.config.groups.override_mistake", lambda app, args: None)
    monkeypatch.setattr("numdev.config.preflight.problem", lambda app, args, check: None)
    monkeypatch.setattr(sys, "argv", ["numdev-train", "+data.root=/x", "experiment=train_smoke", f"output_root={tmp_path}",
                                      "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"])
    with pytest.raises(SystemExit) as exit_:
        try:
            app.main()
        finally:
            GlobalHydra.instance().clear()
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == "numdev-train: error: " + unexpected_key("data", "root")
