"""Every console command answers --help; the Hydra apps list their config groups."""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points

import pytest

SCRIPTS = {e.name: e.value for e in entry_points(group="console_scripts") if e.name.startswith("numdev-")}
HYDRA_APPS = {"numdev-bench": ("numerics", "inputs", "methods", "experiment"), "numdev-train": ("attention", "precision", "model", "study")}
# What the other app has: never listed (the apps share conf/, each lists only its own groups and experiments).
APP = {"numdev-bench": "bench", "numdev-train": "train"}
FOREIGN = {"numdev-bench": ("trainer", "model", "study", "data", "flash_stability"), "numdev-train": ("numerics", "inputs", "fig4")}


def test_every_command_of_the_package_is_covered():
    assert {"numdev-demo", "numdev-bench", "numdev-train", "numdev-compare", "numdev-study", "numdev-report"} <= set(SCRIPTS)


@pytest.mark.parametrize("command", sorted(set(SCRIPTS) - set(HYDRA_APPS)))
def test_argparse_commands_have_help(command, capsys):
    module, function = SCRIPTS[command].split(":")
    with pytest.raises(SystemExit) as exit_:
        getattr(importlib.import_module(module), function)(["--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(HYDRA_APPS))
def test_hydra_apps_list_their_groups_and_only_theirs(command, tmp_path, monkeypatch, capsys):
    """In-process (Hydra's help is the same there); every command of the README answers --help as a real
    process in test_readme_commands.py (slow)."""
    from hydra.core.global_hydra import GlobalHydra

    from numdev.config.groups import app_defaults

    module, function = SCRIPTS[command].split(":")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [command, "--help"])
    with pytest.raises(SystemExit) as exit_:
        try:
            getattr(importlib.import_module(module), function)()
        finally:
            GlobalHydra.instance().clear()
    assert exit_.value.code in (0, None)
    out = capsys.readouterr().out
    assert "== Configuration groups ==" in out
    for group in HYDRA_APPS[command]:
        assert f"\n{group}:" in out, group
    groups = out.split("== Configuration groups ==")[1].split("== Experiments ==")[0]
    for group in app_defaults(APP[command]):
        assert f"\n{group}: " in groups, group
    for name in FOREIGN[command]:
        assert name not in groups, name
    assert not any(tmp_path.iterdir())  # --help runs nothing
    experiments = out.split("== Experiments ==")[1].split("== Config ==")[0]
    from numdev.config.groups import options

    for name in options("experiment", APP[command]):  # every experiment, with its first sentence
        assert f"\nexperiment={name}: " in experiments, name
    if command == "numdev-train":  # measured by scripts/bench_study.py (docs/results/bench_study_harm.json)
        assert "experiment=harm: " in experiments and "[measured: " in experiments.split("experiment=harm: ")[1].splitlines()[0]


@pytest.mark.parametrize("command", sorted(HYDRA_APPS))
def test_hydra_apps_answer_help_and_config_mistakes_without_torch(command, tmp_path):
    """--help, a misspelled key and a missing sibling.reference need no torch or Lightning (deferred until a
    run starts): they answer in about a second (scripts/bench_startup.py times them)."""
    import subprocess

    module = SCRIPTS[command].split(":")[0]
    mistakes = {"numdev-train": ["trainer.max_step=2", "sibling.reference=/nonexistent/run"], "numdev-bench": ["seed=1"]}
    probe = ("import sys, runpy\n"
             f"sys.argv = [{command!r}] + sys.argv[1:]\n"
             "try:\n"
             f"    runpy.run_module({module!r}, run_name='__main__')\n"
             "except SystemExit as e:\n"
             "    code = e.code\n"
             "else:\n"
             "    code = 0\n"
             "heavy = sorted(m for m in ('torch', 'lightning', 'scipy.stats') if m in sys.modules)\n"
             "print('IMPORTED', heavy, 'EXIT', code)\n")
    for args in (["--help"], *([m] for m in mistakes[command])):
        done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120)
        last = done.stdout.strip().splitlines()[-1]
        assert last.startswith("IMPORTED [] EXIT"), (args, last, done.stderr[-500:])
        assert last.endswith("EXIT 0") == (args == ["--help"]), (args, last, done.stderr[-300:])


def test_ctrl_c_before_a_run_starts_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C while Hydra composes, prints --help or the checks run (numdev.cli.workers.console_script)."""
    from numdev.cli.workers import console_script

    def app():
        raise KeyboardInterrupt

    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/numdev-train", "--help"])
    with pytest.raises(SystemExit) as exited:
        console_script(app)
    assert exited.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("numdev-train: error: interrupted (SIGINT)"), err
