"""A refused command leaves nothing behind and says what to type instead; what numdev writes others can read.

  - results are written 0666 less the umask (0644 under the usual 022), not mkstemp's 0600;
  - a refused command (exit 2) creates no run directory; a sweep with a bad value runs no job;
  - an added key nothing reads, or a misspelled group, is one line naming the nearest known ones.
"""

from __future__ import annotations

import os
import stat
import sys

import pytest
from hydra.core.global_hydra import GlobalHydra

from numdev.runs.atomic import append_jsonl, write_json

QUIET = ["hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
BENCH = ["shape.seq_q=16", "shape.dim=16", "tiles.block_r=16", "tiles.block_c=16"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_written_files_have_the_mode_the_umask_gives(umask, tmp_path):
    old = os.umask(umask)
    try:
        write_json(tmp_path / "a.json", {"x": 1})
        append_jsonl(tmp_path / "b.jsonl", [{"x": 1}])
    finally:
        os.umask(old)
    for name in ("a.json", "b.jsonl"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name
    if umask == 0o022:
        assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644


def _bench(args: list[str], tmp_path, monkeypatch, capsys) -> tuple[int, str]:
    from numdev.bench import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["numdev-bench", *args, f"output_root={tmp_path / 'outputs'}", *QUIET])
    capsys.readouterr()
    try:
        app.main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        GlobalHydra.instance().clear()
    return code, capsys.readouterr().err


def _made(tmp_path) -> list[str]:
    root = tmp_path / "outputs"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize("args, expect", [
    (["numerics.precision=fp17"], "unknown float format 'fp17'"),  # found when the formats are built
    (["inputs.scale=-1"], "inputs.scale=-1 must be a positive number"),  # the schema
    (["+shape.seqq=256"], "+shape.seqq=256: shape has no setting seqq, so nothing would read it: did you mean shape.seq_q or shape.seq_k?"),
    (["numeric=fa2"], "numeric=fa2: numdev-bench has no group or setting numeric: did you mean numerics=fa2?"),
    (["+numeric=fa2"], "+numeric=fa2: numeric is not a setting of numdev-bench, and nothing would read it; did you mean numerics=fa2?"),
    (["-m", "numerics.precision=bf16,fp17"], "sweep job 1 (numerics.precision=fp17): unknown float format 'fp17'"),
    (["-m", "experiment=fig3", "inputs.scale=0"], "sweep job 0 (numerics.precision=bf16): inputs.scale=0 must be a positive number"),
])
def test_a_refused_bench_command_is_one_line_and_creates_no_directory(args, expect, tmp_path, monkeypatch, capsys):
    code, err = _bench([*args, *BENCH], tmp_path, monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("numdev-bench: error: ") and expect in lines[0], err
    assert _made(tmp_path) == []  # no run or sweep directory, no job run


def test_a_refused_training_run_leaves_no_run_directory(tmp_path, monkeypatch, capsys):
    """Refused inside the run (no images under data.root: found when the data is set up), after Hydra
    created the run directory: the directory goes again. One that existed before is kept."""
    from numdev.train import app

    (tmp_path / "images").mkdir()
    for run_dir, kept in ((None, False), (tmp_path / "mine", True)):
        if kept:
            run_dir.mkdir()
        args = ["experiment=train_smoke", "data=folder", f"data.root={tmp_path / 'images'}", f"output_root={tmp_path / 'outputs'}"]
        args += [f"hydra.run.dir={run_dir}"] if run_dir else []
        monkeypatch.setattr(sys, "argv", ["numdev-train", *args, *QUIET])
        with pytest.raises(SystemExit) as exit_:
            try:
                app.main()
            finally:
                GlobalHydra.instance().clear()
        assert exit_.value.code == 2
        assert "no images" in capsys.readouterr().err
        assert not list((tmp_path / "outputs").glob("train/*/*"))  # no dated run directory
        if kept:
            assert run_dir.is_dir()


def test_every_job_of_an_experiment_sweep_is_checked_before_the_first_runs():
    """experiment=flash_stability_smoke sweeps its roles and replicates by itself (hydra.mode=MULTIRUN in
    the experiment, no -m): a bad value set for all of them is refused naming the first job."""
    from numdev.config import preflight
    from numdev.train.run import check_config

    problem = preflight.problem("train", ["experiment=flash_stability_smoke", "optim.optimizer.lr=-1"], check_config)
    assert problem == ("sweep job 0 (study=truth study.replicate=0): optim.optimizer.lr=-1 must be a positive number; "
                       "no job was run")
    assert preflight.problem("train", ["experiment=flash_stability_smoke"], check_config) is None


def test_an_added_constructor_argument_it_does_not_take_is_named(tmp_path, monkeypatch, capsys):
    from numdev.train import app

    for added, expect in (("+optim.optimizer.epss=1e-8", "optim.optimizer (torch.optim.AdamW) has no setting epss, so nothing would "
                                                          "read it: did you mean optim.optimizer.eps?"),
                          ("+trainer.max_stepz=3", "did you mean trainer.max_steps or ")):
        monkeypatch.setattr(sys, "argv", ["numdev-train", "experiment=train_smoke", added, f"output_root={tmp_path}", *QUIET])
        with pytest.raises(SystemExit) as exit_:
            try:
                app.main()
            finally:
                GlobalHydra.instance().clear()
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and expect in err, err
        assert not any(tmp_path.iterdir())


def test_added_keys_a_constructor_takes_still_run():
    from hydra import compose, initialize_config_module
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from numdev.config.preflight import _added_key_problem

    parsed = OverridesParser.create().parse_overrides(["experiment=train_smoke", "+optim.optimizer.eps=1e-8", "+trainer.max_time=null"])
    with initialize_config_module(config_module="numdev.conf.train", version_base="1.3"):
        assert _added_key_problem("train", parsed, compose) is None
