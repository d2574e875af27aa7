"""Quiet by default, everything in the log (numdev.cli.logs): the console shows numdev's messages and the
libraries' warnings; each job's app.log holds its run's story; -v shows everything."""

from __future__ import annotations

import json
import logging

from helpers import console_noise, run_cli

from numdev.cli import logs


def _record(name: str, level: int) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, "message", None, None)


def test_the_console_shows_numdev_and_the_libraries_warnings_and_everything_when_verbose(monkeypatch):
    console = logs.Console()
    monkeypatch.setattr(logs, "VERBOSE", False)
    shown = {(name, level): console.filter(_record(name, level))
             for name in ("numdev.train.app", "lightning.pytorch.utilities.rank_zero", "py.warnings")
             for level in (logging.DEBUG, logging.INFO, logging.WARNING)}
    assert shown == {
        ("numdev.train.app", logging.DEBUG): False, ("numdev.train.app", logging.INFO): True, ("numdev.train.app", logging.WARNING): True,
        ("lightning.pytorch.utilities.rank_zero", logging.DEBUG): False, ("lightning.pytorch.utilities.rank_zero", logging.INFO): False,
        ("lightning.pytorch.utilities.rank_zero", logging.WARNING): True,
        ("py.warnings", logging.DEBUG): False, ("py.warnings", logging.INFO): False, ("py.warnings", logging.WARNING): True,
    }
    monkeypatch.setattr(logs, "VERBOSE", True)
    assert all(console.filter(_record(name, level)) for name, level in shown)
    printed = _record("numdev.cli.errors", logging.ERROR)
    printed.console = False  # numdev.cli.errors prints its one line itself: the log gets it, the console not twice
    assert not console.filter(printed)


def test_dash_v_becomes_verbose_true_for_the_jobs(monkeypatch):
    monkeypatch.setattr(logs, "VERBOSE", False)
    assert logs.verbosity_from_argv(["numdev-train", "-m", "seed.init=0,1"]) == ["numdev-train", "-m", "seed.init=0,1"]
    assert logs.VERBOSE is False
    assert logs.verbosity_from_argv(["numdev-train", "-v", "-m", "seed.init=0,1"]) == ["numdev-train", "-m", "seed.init=0,1", "verbose=true"]
    assert logs.VERBOSE is True


def test_a_bench_sweep_in_parallel_says_only_what_numdev_means_and_each_job_logs_its_story(tmp_path):
    result = run_cli("numdev.bench.app", "-m", "hydra/launcher=parallel", "numerics.precision=bf16,fp32",
                     "shape.seq_q=64", "shape.seq_k=64", "threads=1", "name=quiet", cwd=tmp_path)
    # No Hydra schema-name deprecation, no loky leaked-folder warning and KeyError, no traceback.
    assert console_noise(result.stdout, result.stderr) == [], result.stdout + result.stderr
    assert result.stderr == ""
    (sweep,) = (tmp_path / "outputs" / "bench" / "quiet").glob("multirun_*")
    assert result.stdout.splitlines()[0] == f"2 job(s), 2 at a time -> {sweep.relative_to(tmp_path)}"
    for job in ("0", "1"):
        records = [json.loads(line) for line in (sweep / job / "results.jsonl").read_text().splitlines()]
        story = (sweep / job / "app.log").read_text()
        assert "[numdev.bench.app][INFO] - " in story
        assert f"[numdev.bench.app][INFO] - {len(records)} records -> {sweep / job / 'results.jsonl'}" in story
