"""Every command README.md and the demo print runs as printed, from the repository root.

The commands are read out of README.md: the lines of its ```bash blocks and the inline code spans
that start with `.venv/bin/` or `make `. Each is run exactly as printed with `--help` appended (its
placeholders, `<time>` or `...`, filled or dropped): a missing program, a bare `numdev-bench` that
is "command not found" without an activated venv, an unknown config group or key, or a `pip install`
of a name that is not on the package index fails here. `make` targets run as `make -n`.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path

import pytest
from helpers import REPO

from numdev.cli import demo
from numdev.cli.commands import tensorboard
from numdev.config.groups import override_mistake

README = REPO / "README.md"
PROGRAM = re.compile(r"^(numdev-[a-z]+|tensorboard|pip|python3?|pytest)(\s|$)")  # console scripts a reader types
HYDRA_APPS = {"numdev-bench": "bench", "numdev-train": "train"}
# Names the README asks the reader to create first (a new backend's configs): run with a shipped one.
READER_MADE = {"methods=my_methods": "methods=flash_vs_baseline", "attention=my_kernel": "attention=sdpa_flash"}


def readme_commands(text: str) -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(shlex.join(words))
    for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text):
        if span.startswith((".venv/bin/", "make ")) and span != ".venv/bin/":
            commands.append(shlex.join(shlex.split(span, comments=True)))
    return list(dict.fromkeys(commands))


def bare_commands(text: str) -> list[str]:
    """Code (block lines and inline spans) that starts with a console script without .venv/bin/."""
    code = [line for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S) for line in block.splitlines()]
    code += re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
    return [c for c in code if PROGRAM.match(c.strip())]


def demo_commands() -> list[str]:
    """What numdev-demo prints, run from the repository root (as make demo does)."""
    root = Path("outputs")
    return [
        *(demo.bench_command(e, root) for e in demo.BENCH_FIGURES),
        demo.study_command(root),
        demo.catalogue_command(root),
        demo.report_command(root),
        tensorboard("outputs/train/flash_stability/multirun_2026-01-01_00-00-00"),
    ]


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def _as_run(command: str) -> list[str]:
    """The command as printed, placeholders filled, asking for --help (make: a dry run)."""
    words = [READER_MADE.get(w, re.sub(r"<[^>]*>", "x", w)) for w in shlex.split(command) if w not in ("...", "\\")]
    if words[0] == "make":
        return ["make", "-n", *words[1:]]
    # Hydra's --help cannot read a sweep (a,b,c), given with -m or by an experiment that sets
    # hydra.mode=MULTIRUN: ask about the sweep's first job.
    if Path(words[0]).name in HYDRA_APPS:
        words = [_first_value(w) for w in words if w not in ("-m", "--multirun")]
    return [*words, "--help"]


def _first_value(word: str) -> str:
    key, sep, value = word.partition("=")
    if not sep or value.startswith(("[", "'", '"')) or "," not in value:
        return word
    return f"{key}={value.split(',')[0]}"


def _missing_script(program: str) -> str | None:
    """Why a printed .venv/bin/<program> is absent here though a fresh `make` creates it, or None if it is a real gap."""
    name = Path(program).name
    if name in {e.name for e in entry_points(group="console_scripts")}:
        return f"{program} is declared by an installed package but missing from this venv's bin/ (a shared worktree venv)"
    return None


def test_readme_has_commands_and_none_is_bare():
    assert len(COMMANDS) >= 25
    assert {c.split()[0] for c in COMMANDS} >= {"make", ".venv/bin/numdev-bench", ".venv/bin/numdev-train", ".venv/bin/tensorboard"}
    assert bare_commands(README.read_text(encoding="utf-8")) == [], "print them as .venv/bin/<command> (or say how to activate)"


def test_the_demo_prints_runnable_commands(monkeypatch):
    """Under make's venv: .venv/bin/<script>; from another environment without the scripts beside its
    interpreter: <python> -m <module>. Never a bare name, which runs only in an activated venv."""
    monkeypatch.chdir(REPO)
    for command in demo_commands():
        words = shlex.split(command)
        assert "/" in words[0], command  # a path, not a bare name: runs without activating the venv
        if words[1:2] == ["-m"]:
            assert Path(words[0]).resolve() == Path(sys.executable).resolve() and find_spec(words[2]), command
        else:
            assert (REPO / words[0]).is_file() or _missing_script(words[0]), command


def test_install_extras_exist():
    """`pip install -e '.[cuda]'`: numdev is not on the package index; the extras must be the project's own."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    text = README.read_text(encoding="utf-8")
    assert "numdev[" not in text, "numdev is not on the package index: pip install -e '.[extra]'"
    for extra in re.findall(r"pip install -e '\.\[(\w+)\]'", text):
        assert extra in extras, extra


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.split()[0].removeprefix(".venv/bin/") in HYDRA_APPS])
def test_readme_overrides_belong_to_their_app(command):
    words = _as_run(command)[:-1]
    assert override_mistake(HYDRA_APPS[Path(words[0]).name], words[1:]) is None


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS + demo_commands())
def test_the_command_runs_as_printed(command):
    words = _as_run(command)
    if words[0].startswith(".venv/bin/") and not (REPO / words[0]).is_file():
        reason = _missing_script(words[0])
        assert reason, f"{words[0]} does not exist and no installed package declares it"
        pytest.skip(reason)
    result = subprocess.run(words, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{command}\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
    if words[0] != "make":
        assert "usage" in (result.stdout + result.stderr).lower() or "== Configuration groups ==" in result.stdout



def test_from_an_environment_without_the_scripts_commands_fall_back_to_python_m(monkeypatch, tmp_path):
    """numdev's printed commands (numdev.cli.commands) under an interpreter whose bin/ has no numdev
    scripts (another venv, a pip --target install): `<python> -m <the entry point's module>`, which runs."""
    from numdev.cli.commands import argv, command, script

    real = sys.executable
    python = tmp_path / "env" / "bin" / "python"  # an interpreter path with no numdev scripts beside it
    python.parent.mkdir(parents=True)
    python.symlink_to(real)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.chdir(tmp_path)
    assert argv("numdev-report") == [str(python), "-m", "numdev.report.app"]
    assert script("numdev-bench") == "env/bin/python -m numdev.bench.app"
    assert command("numdev-gather", tmp_path / "sweep") == "env/bin/python -m numdev.bench.gather sweep"
    assert script("not-a-numdev-script") == "not-a-numdev-script"  # nothing to fall back to: the name as given
    fallback = argv("numdev-figure")  # run by this environment's interpreter, as the fallback means
    result = subprocess.run([real, *fallback[1:], "--list"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "fig4" in result.stdout, result.stderr
