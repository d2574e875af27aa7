"""The scripts' one entry point and their generated doc blocks (numdev.cli.script_args.run_script,
numdev.report.docblocks): a doc that lost its markers, or a results file that is truncated, ends a
script in one line before it computes anything, never in a traceback after its measurement."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import REPO, load_script

from numdev.report.docblocks import DocBlockError, check_blocks, read_block, replace_block

SCRIPTS = sorted((REPO / "scripts").glob("*.py"))
GOOD = "intro\n<!-- numdev:begin t -->\nold\n<!-- numdev:end t -->\noutro\n"


def _main_block(path) -> ast.If:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test):
            return node
    raise AssertionError(f"{path.name}: no `if __name__ == '__main__':` block")


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_script_enters_through_run_script(path):
    """Not one script calls main() bare: each goes through run_script, so each turns a user error into one line."""
    block = _main_block(path)
    assert ast.unparse(block.body[-1]) == "run_script(main)" and not block.orelse, ast.unparse(block)


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_script_imports_script_entry_before_anything_else(path):
    """numdev.cli.script_entry comes first (after `from __future__`), so a Ctrl-C while the other imports load is its one
    line, not a traceback from inside torch's import."""
    imports = [node for node in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(node, (ast.Import, ast.ImportFrom))]
    first = next(node for node in imports if not (isinstance(node, ast.ImportFrom) and node.module == "__future__"))
    assert ast.unparse(first) == "import numdev.cli.script_entry", ast.unparse(first)


def _interrupting_program(tmp_path, name: str, main_body: str):
    """A program file `name` that imports numdev, sends itself SIGINT while 'loading' (as a Ctrl-C during torch's import
    would land), then runs main_body through run_script."""
    path = tmp_path / name
    path.write_text("import os\nimport signal\n\nimport numdev  # noqa: F401\n\n"
                    "os.kill(os.getpid(), signal.SIGINT)\nfor _ in range(10**7):\n    pass  # the signal lands between bytecodes\n"
                    "from numdev.cli.script_args import run_script\n\n\ndef main():\n" + textwrap.indent(main_body, "    ")
                    + "\n\n\nrun_script(main)\n")
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_ctrl_c_while_a_program_of_ours_loads_is_one_line_and_exit_130_and_later_the_usual_path(tmp_path):
    done = _interrupting_program(tmp_path, "numdev-study", "return 0")  # an app's console script, by its name
    assert done.returncode == 130 and done.stderr.splitlines() == [
        "numdev-study: error: interrupted (SIGINT) while starting, before anything was written: run the same command again"
    ], done.stderr[-2000:]
    # another program that imports numdev (numdev-train has its own handling; a user's) keeps Python's handler
    for name in ("numdev-train", "mine.py"):
        done = _interrupting_program(tmp_path, name, "return 0")
        assert done.returncode != 0 and "KeyboardInterrupt" in done.stderr, (name, done.stderr[-2000:])
    # once the entry has begun (run_script here, main() in an app), Ctrl-C is its KeyboardInterrupt path again
    path = tmp_path / "numdev-report"
    path.write_text("import os\nimport signal\n\nfrom numdev.cli.script_args import run_script\n\n\ndef main():\n"
                    "    os.kill(os.getpid(), signal.SIGINT)\n    for _ in range(10**7):\n        pass\n\n\nrun_script(main)\n")
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 130 and done.stderr.startswith("numdev-report: error: interrupted (SIGINT): each file"), done.stderr


def test_the_loading_handler_is_for_numdevs_own_programs_only(monkeypatch, tmp_path):
    from numdev.cli import script_entry

    main = sys.modules["__main__"]
    for path, ours in ((REPO / "scripts" / "lr_edge.py", True), (tmp_path / "scripts" / "lr_edge.py", False),
                       (Path("/venv/bin/numdev-study"), True), (Path("/venv/bin/numdev-demo"), True),
                       (Path("/venv/bin/numdev-train"), False), (Path("/venv/bin/pytest"), False)):
        monkeypatch.setattr(main, "__file__", str(path), raising=False)
        assert script_entry._starting_one_of_ours() is ours, path


@pytest.mark.parametrize("app", ["numdev-study", "numdev-compare", "numdev-figure", "numdev-report", "numdev-demo"])
def test_every_app_the_handler_starts_for_puts_pythons_back_first(app):
    """An app in script_entry.APPS whose main() did not call loaded() would answer every Ctrl-C of its run as 'while
    starting': each one's main() calls it before its first statement of work."""
    from importlib.metadata import entry_points

    from numdev.cli import script_entry

    assert app in script_entry.APPS
    (entry,) = [e for e in entry_points(group="console_scripts") if e.name == app]
    module, function = entry.value.split(":")
    tree = ast.parse(Path(importlib.import_module(module).__file__).read_text(encoding="utf-8"))
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function)
    calls = [ast.unparse(node) for node in ast.walk(main) if isinstance(node, ast.Call)]
    assert "script_entry.loaded()" in calls, calls


def test_loading_a_script_as_a_module_leaves_the_sigint_handler_alone():
    import signal

    load_script("lr_edge")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize(("content", "found"), [
    ("no markers at all\n", "found 0 begin and 0 end marker(s)"),
    ("<!-- numdev:begin t -->\nx\n", "found 1 begin and 0 end marker(s)"),
    ("<!-- numdev:end t -->\nx\n<!-- numdev:begin t -->\n", "found 1 begin and 1 end marker(s), the end first"),
    (GOOD + GOOD, "found 2 begin and 2 end marker(s)"),
])
def test_a_block_whose_markers_are_broken_is_refused_naming_the_file_and_the_fix(tmp_path, content, found):
    doc = tmp_path / "doc.md"
    doc.write_text(content)
    for call in (lambda: check_blocks((doc, "t")), lambda: replace_block(doc, "t", "new"), lambda: read_block(doc, "t")):
        with pytest.raises(DocBlockError) as error:
            call()
        message = str(error.value)
        assert message.startswith(f"{doc}: block 't' needs exactly one") and found in message
        assert f"git checkout -- {doc}" in message and "\n" not in message
    assert doc.read_text() == content  # nothing written


def test_a_missing_or_binary_doc_is_one_line_and_a_good_one_is_rewritten_in_place(tmp_path):
    with pytest.raises(DocBlockError, match=r"gone.md: cannot read it to write block 't' \(No such file or directory\)"):
        check_blocks((tmp_path / "gone.md", "t"))
    (tmp_path / "bin.md").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(DocBlockError, match="not UTF-8 text"):
        replace_block(tmp_path / "bin.md", "t", "x")
    doc = tmp_path / "doc.md"
    doc.write_text(GOOD)
    check_blocks((doc, "t"), (doc, "t"))
    replace_block(doc, "t", "| a | 2.0 |")
    assert doc.read_text() == GOOD.replace("old", "| a | 2.0 |") and read_block(doc, "t") == "| a | 2.0 |"
    assert issubclass(DocBlockError, ValueError)  # callers that catch ValueError still do


def _script(tmp_path, body: str):
    path = tmp_path / "some_script.py"
    path.write_text("from numdev.cli.script_args import run_script\n\n\ndef main():\n" + textwrap.indent(body, "    ")
                    + '\n\n\nif __name__ == "__main__":\n    run_script(main)\n')
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize(("body", "code", "message"), [
    ("from numdev.report.docblocks import check_blocks\ncheck_blocks(('absent.md', 'x'))",
     2, "some_script.py: error: absent.md: cannot read it to write block 'x'"),
    ("from numdev.runs.atomic import read_json\nopen('r.json', 'w').write('{\"a\": ')\nread_json('r.json', 'result')",
     2, "some_script.py: error: r.json: not valid JSON (Expecting value): the result is corrupt or truncated"),
    ("raise KeyboardInterrupt", 130, "some_script.py: error: interrupted (SIGINT)"),
    ("return 3", 3, None),
    ("return None", 0, None),
])
def test_run_script_turns_user_errors_into_one_line_and_passes_exit_codes_on(tmp_path, body, code, message):
    done = _script(tmp_path, body)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code, done.stderr[-2000:]
    if message is None:
        assert lines == []
    else:
        assert len(lines) == 1 and lines[0].startswith(message), done.stderr[-2000:]


def test_a_reader_that_goes_away_is_no_traceback(tmp_path):
    """`script | head -c 1`: the script's later prints meet a closed pipe."""
    path = tmp_path / "chatty.py"
    path.write_text("from numdev.cli.script_args import run_script\n\n\ndef main():\n    for _ in range(100000):\n"
                    "        print('x' * 100)\n\n\nrun_script(main)\n")
    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    done = subprocess.run([sys.executable, str(path)], stdout=reader.stdin, stderr=subprocess.PIPE, text=True, timeout=120)
    reader.stdin.close()
    reader.wait(timeout=60)
    assert done.returncode == 1 and done.stderr == "", done.stderr[-2000:]


def test_a_bug_keeps_its_traceback(tmp_path):
    """Only user errors are shortened: a script's own bug (here an AttributeError) shows where it is."""
    done = _script(tmp_path, "None.missing")
    assert done.returncode == 1 and "Traceback" in done.stderr and "AttributeError" in done.stderr


def _refuse(*args, **kwargs):
    raise AssertionError("computed before the doc was checked")


# (script, arguments, the module attributes that name the doc (or the block: the committed doc, a block it lacks),
# the computation that must not start)
PREFLIGHT = [
    ("matmul_bf16_shapes", ["--write-docs"], ["DOC"], "measure"),
    ("tie_fix_bias", ["--write-docs"], ["DOC"], "measure"),
    ("tie_fix_bias", ["--docs-only"], ["DOC"], "read_json"),
    ("study_precision", ["--write-docs"], ["DOC"], "deviations"),
    ("sram_map", ["--write-docs"], ["DOC"], "run"),
    ("rounding_results", ["--write-docs"], ["DOC"], "run"),
    ("qiu_yao_search", ["--write-docs", "{tmp}"], ["DOC"], "read_run"),
    ("gemm_results", ["--run", "demo"], ["DOC"], "run_figure"),
    ("phase1_results", ["--run", "demo"], ["ROOT"], "run_figure"),
    ("harm_table", ["--which", "harm", "--write-docs"], ["DOC", "README"], "read_harm_summary"),
    ("optimization_table", [], ["DOC", "README"], "read_study_summary"),
    ("precision_speed_table", ["--write-docs"], ["BLOCK"], "block_text"),
    ("budgets_table", [], ["DOC", "README"], "rows"),
    ("config_reference", [], ["DOC"], "text"),
    ("bench_emulator", ["--out", "{tmp}/out.json", "--docs", "{tmp}/doc.md"], [], "bench_kernel_model"),
]


@pytest.mark.parametrize(("name", "args", "docs", "compute"), PREFLIGHT, ids=[f"{p[0]}-{i}" for i, p in enumerate(PREFLIGHT)])
def test_a_doc_without_its_block_stops_a_script_before_it_computes(tmp_path, monkeypatch, name, args, docs, compute):
    doc = tmp_path / "doc.md"
    doc.write_text("a doc someone edited: its markers are gone\n")
    script = load_script(name)
    for attribute in docs:
        monkeypatch.setattr(script, attribute, {"ROOT": tmp_path, "BLOCK": "no-such-block"}.get(attribute, doc))
    monkeypatch.setattr(script, compute, _refuse)
    monkeypatch.setattr(sys, "argv", [str(REPO / "scripts" / f"{name}.py"), *(a.format(tmp=tmp_path) for a in args)])
    with pytest.raises(DocBlockError, match=r"(needs exactly one|cannot read it)") as error:  # before anything is read
        script.main()
    assert "\n" not in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.md"]  # nothing written
    assert doc.read_text() == "a doc someone edited: its markers are gone\n"


def test_gpu_call_refuses_write_docs_into_a_doc_without_its_block_before_the_rehearsal(tmp_path, monkeypatch, capsys):
    script = load_script("gpu_call")
    monkeypatch.setattr(script, "BLOCK", "no-such-block")  # the committed docs/gpu.md lacks it
    with pytest.raises(SystemExit) as exit_:
        script.main(["--device", "cpu", "--out", str(tmp_path / "out"), "--write-docs"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"--write-docs: {script.DOC}: block 'no-such-block' needs exactly one" in err
    assert not (tmp_path / "out").exists()


# (script, arguments, the module attribute naming the result file ("ROOT": the repository root it lies under))
FORGED = [
    ("tie_fix_bias", ["--docs-only"], "RESULT"),
    ("bench_lm_step", ["--write-docs"], "RESULT"),
    ("qiu_yao_search", ["--docs-only"], "RESULT"),
    ("gemm_results", ["--rejudge", "--no-docs"], "ROOT"),
    ("phase1_results", ["--rejudge", "--no-docs"], "ROOT"),
    ("bench_emulator", ["--table", "{result}", "--docs", "{tmp}/doc.md"], None),
]


@pytest.mark.parametrize("content", ["{}", "[]", '{"figures": 3, "rows": [1], "runs": {"a": null}, "machine": null}'])
@pytest.mark.parametrize(("name", "args", "attribute"), FORGED, ids=[f[0] for f in FORGED])
def test_a_forged_result_is_one_line_naming_it_and_nothing_is_written(tmp_path, monkeypatch, name, args, attribute, content):
    """Valid JSON of the wrong shape (a field missing or of the wrong type) - not a KeyError's traceback."""
    script = load_script(name)
    result = tmp_path / "docs" / "results" / {"gemm_results": "gemm.json", "phase1_results": "phase1.json"}.get(name, "r.json")
    result.parent.mkdir(parents=True)
    result.write_text(content + "\n")
    doc = tmp_path / "doc.md"
    doc.write_text(GOOD.replace(" t -->", " emulator-speed -->"))
    if attribute is not None:
        monkeypatch.setattr(script, attribute, tmp_path if attribute == "ROOT" else result)
    if attribute == "RESULT" and hasattr(script, "REPO"):  # the help and the block name the result relative to it
        monkeypatch.setattr(script, "REPO", tmp_path)
    before = {p: p.read_bytes() for p in (*REPO.joinpath("docs").glob("*.md"), REPO / "README.md", doc)}
    monkeypatch.setattr(sys, "argv", [name, *(a.format(tmp=tmp_path, result=result) for a in args)])
    with pytest.raises(ValueError) as error:
        script.main()
    message = str(error.value)
    assert message.startswith(f"{result}: not a ") and "as its script writes it" in message and "\n" not in message, message
    assert re.search(r", read at [\w./]+\.py:\d+\): rerun the command that wrote it", message), message
    assert result.read_text() == content + "\n"
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize(("record", "says"), [
    ('{"status": "run', "not valid JSON"),
    ('["a list"]', "holds a list"),
    ('{"status": "running"}', "status 'running', no start and finish time"),
    ('{"status": "finished", "started": "yesterday", "finished": "today"}', "started/finished are not times numdev writes"),
])
def test_bench_study_reads_each_run_record_through_its_schema(tmp_path, record, says):
    run = tmp_path / "r0" / "flash"
    run.mkdir(parents=True)
    (run / "run.json").write_text(record)
    with pytest.raises(ValueError, match=r"run\.json") as error:
        load_script("bench_study").run_seconds(tmp_path)
    assert says in str(error.value) and "\n" not in str(error.value)
