"""The report's frame: the provenance header (which machine and commit the numbers describe), the
stable section ids, and the page as headless Chromium renders it."""

from __future__ import annotations

import hashlib
import html
import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, run_cli
from PIL import Image

import numdev.report.study
from numdev.cli.commands import script
from numdev.report.app import build_report
from numdev.report.html import LOSS_CURVES, SAMPLES
from numdev.runs.provenance import machine_line, provenance

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _sweep(root: Path, figure: str, block: dict | None) -> Path:
    """A finished bench sweep as numdev-bench leaves it: the figure, its summary (with or without provenance)."""
    sweep = root / figure / "multirun_2026-01-01_00-00-00"
    sweep.mkdir(parents=True)
    Image.new("RGB", (8, 8), "white").save(sweep / f"{figure}.png")
    summary = {"figure": figure, "caption": f"measured {figure}"}
    if block is not None:
        summary["provenance"] = block
    (sweep / f"{figure}.json").write_text(json.dumps(summary))
    return sweep


def _other_machine(block: dict) -> dict:
    other = json.loads(json.dumps(block))
    other["machine"]["cpu"] = "AMD EPYC 7B13"
    other["git"]["commit"] = "0123456789abcdef"
    return other


def test_the_header_names_the_machine_every_result_came_from(tmp_path):
    block = provenance(seeds=[0, 1, 2])
    page = build_report([_sweep(tmp_path, "fig3", block), _sweep(tmp_path, "fig4", block)], None, tmp_path / "report").read_text()
    assert "<header id='provenance'>" in page
    assert page.index("id='provenance'") < page.index("Fig. 3")  # a header: before the figures
    assert f"Every result in this report was measured on: <b>{machine_line(block)}</b>" in page
    assert "different machines" not in page
    # the full block: CPU model, threads, versions, commit + dirty, seeds, date
    for value in (block["machine"]["cpu"], f"{block['machine']['torch_threads']} torch thread(s)", block["versions"]["torch"],
                  str(block["git"]["commit"]), "0, 1, 2", block["date"]):
        assert value in page, value
    assert page.count(f"Measured on: {machine_line(block)}") == 2  # each section says it too


def test_results_from_two_machines_are_said_to_be_so(tmp_path):
    block = provenance(seeds=[0])
    other = _other_machine(block)
    page = build_report([_sweep(tmp_path, "fig3", block), _sweep(tmp_path, "fig4", other)], None, tmp_path / "report").read_text()
    assert "come from different machines (2 origins)" in page
    assert machine_line(block) in page and machine_line(other) in page and "AMD EPYC 7B13" in page


def test_results_from_two_commits_on_one_machine_are_said_to_be_so(tmp_path):
    block = provenance(seeds=[0])
    other = json.loads(json.dumps(block))
    other["git"]["commit"] = "0123456789abcdef"
    page = build_report([_sweep(tmp_path, "fig3", block), _sweep(tmp_path, "fig4", other)], None, tmp_path / "report").read_text()
    assert "come from one machine but different code (versions or commits) (2 origins)" in page
    assert "@ 0123456789" in page


def test_files_written_before_provenance_read_unknown(tmp_path):
    page = build_report([_sweep(tmp_path, "fig3", None)], None, tmp_path / "report").read_text()
    assert "measured on: <b>unknown (written before numdev recorded provenance)</b>" in page
    assert "Measured on: unknown" in page
    assert "Report written by: " + provenance()["machine"]["cpu"] in page  # the report's own machine is known


def test_bench_records_carry_provenance_and_the_sweep_says_what_next(tmp_path, monkeypatch):
    result = run_cli("numdev.bench.app", "-m", "numerics.precision=bf16,fp16", "shape.seq_q=32", "shape.dim=16",
                     "tiles.block_r=16", "tiles.block_c=16", f"output_root={tmp_path}", cwd=REPO)
    echoes = [line for line in result.stdout.splitlines() if line.startswith("numdev-bench job ")]
    assert len(echoes) == 2  # one compact line per job, with the settings it ran with
    for i, (echo, precision) in enumerate(zip(echoes, ("bf16", "fp16"))):
        assert echo.startswith(f"numdev-bench job {i}: ") and "numerics=paper" in echo
        for part in (f"stages {precision} everywhere", "shape B1 H1 Nq32 Nk32 d16", "tiles 16x16 fa2", "seeds [0]"):
            assert f"| {part} |" in echo, (part, echo)
    sweep = next((tmp_path / "bench" / "default").glob("multirun_*"))
    assert f"sweep done: 2 job(s) in {sweep}" in result.stdout
    monkeypatch.chdir(REPO)  # as numdev prints it for a user in the repository's root: .venv/bin/numdev-gather under make's venv
    assert f"next: {script('numdev-gather')} {sweep}" in result.stdout  # runnable from the repo root as printed
    records = [json.loads(line) for line in (sweep / "0" / "results.jsonl").read_text().splitlines()]
    assert len(records) == 3
    for record in records:
        block = record["provenance"]
        assert block["seeds"] == [0] and block["machine"]["cpu"] == provenance()["machine"]["cpu"]
        assert len(block["git"]["commit"]) == 40 and isinstance(block["git"]["dirty"], bool)


def _study_has(anchor: str) -> bool:
    """Whether this tree's study report makes a section with this id (the study's loss curves, sample grids):
    report/study.py sets Section(anchor=LOSS_CURVES / SAMPLES) (numdev.report.html), or the literal id."""
    constant = {LOSS_CURVES: "LOSS_CURVES", SAMPLES: "SAMPLES"}[anchor]
    source = inspect.getsource(numdev.report.study)
    return re.search(rf"anchor\s*=\s*(\w+\.)?{constant}\b|anchor\s*=\s*[\"']{anchor}[\"']", source) is not None


@pytest.fixture(scope="module")
def report_of_a_study(tmp_path_factory):
    """numdev-report over a micro study and a tiny bench sweep, as make demo builds it (small)."""
    root = tmp_path_factory.mktemp("demo")
    run_cli("numdev.bench.app", "experiment=fig3", "shape.seq_q=32", "shape.dim=16", "tiles.block_r=16",
            "tiles.block_c=16", f"output_root={root}", cwd=root)
    run_cli("numdev.train.app", "experiment=flash_stability_smoke", f"output_root={root}", cwd=root)  # the study on a micro model
    run_cli("numdev.report.app", "--outputs", str(root), cwd=root)
    return root / "report" / "index.html"


@pytest.mark.slow
def test_the_report_of_a_study_has_its_marked_sections(report_of_a_study):
    page = report_of_a_study.read_text()
    assert "<header id='provenance'>" in page and "Every result in this report was measured on" in page
    assert "different machines" not in page  # the bench and the study ran here, whatever their thread counts
    assert report_of_a_study.stat().st_size < 2_000_000  # figures embedded at page size
    for anchor in (LOSS_CURVES, SAMPLES):
        if not _study_has(anchor):
            pytest.skip(f"the study's report has no section id {anchor!r} in this tree yet (report/study.py)")
        assert f"id='{anchor}'" in page or f'id="{anchor}"' in page, anchor


@pytest.mark.slow
def test_headless_chromium_shows_the_marked_sections(report_of_a_study, tmp_path):
    if not any(shutil.which(b) for b in BROWSERS):
        pytest.skip("no headless Chromium on this machine (apt install chromium)")
    required = ["provenance", *(a for a in (LOSS_CURVES, SAMPLES) if _study_has(a))]
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "screenshot_report.py"), str(report_of_a_study), "-o", str(tmp_path / "shot.png"),
         "--require", *required],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    shot = json.loads(result.stdout)
    assert all(shot["markers"][m] for m in required)
    assert shot["images_in_dom"] >= 3  # fig3, fig7, fig8 (and the study's curves and grids)
    assert shot["non_background_fraction"] > 0.03  # text and figures, not a blank page


@pytest.mark.parametrize("content, message", [
    ('{"primary_metric": "rel_frob', "not valid JSON"),
    ('{"primary_metric": "rel_frobenius"}', "field 'paper_metric' is missing"),
    ('[1, 2]', "holds a list, not a mapping"),
])
def test_a_damaged_study_summary_is_one_line_naming_the_file(tmp_path, content, message):
    from numdev.report.study import study_sections

    (tmp_path / "summary.json").write_text(content)
    with pytest.raises(ValueError, match=message) as error:
        study_sections(tmp_path)
    assert str(tmp_path / "summary.json") in str(error.value) and "\n" not in str(error.value)


def test_a_thread_count_is_not_another_origin(tmp_path):
    """bench on 2 threads, study on 1 (threads=1): one machine, one commit: no warning, the threads said plainly."""
    block = provenance(seeds=[0])
    one_thread = json.loads(json.dumps(block))
    one_thread["machine"]["torch_threads"] = 1
    block["machine"]["torch_threads"] = 2
    page = build_report([_sweep(tmp_path, "fig3", block), _sweep(tmp_path, "fig4", one_thread)], None, tmp_path / "report").read_text()
    assert "different machines" not in page and "different code" not in page
    assert ("torch threads per result (a setting of each run, not another machine): 2: Fig. 3 — precision sweep; "
            "1: Fig. 4 — against the FP64 golden value") in page


def test_each_verdict_once_with_contents_links_and_folded_long_tables(tmp_path):
    from numdev.report.html import FOLD_ROWS, Section, render

    table = "| a | b |\n| --- | --- |\n" + "\n".join(f"| row{i} | {i} |" for i in range(FOLD_ROWS + 5))
    sections = [
        Section(title="Fig. 3 — precision sweep", claim="c", measured="see arXiv:2405.02803", status="holds",
                verdict="✓ holds: slope -0.66", rule="a t-test", figure=None),
        Section(title="Reconciliation — where", claim="c", measured="m", status="partly", table_markdown=table,
                deciding_rows=[2, 7], parts={"cell": {"status": "holds", "detail": "✓ holds: 11x", "rule": "r"},
                                             "kernel": {"status": "fails", "detail": "✗ fails: 0.9x", "rule": "r"}},
                files=[("the run", tmp_path)]),
    ]
    page = render("t", "s", sections, out_dir=tmp_path / "report")
    body = page.split("<nav id='contents'>", 1)[1]
    nav, rest = body.split("</nav>", 1)
    assert "<a href='#fig-3'>Fig. 3 — precision sweep</a>" in nav and "<a href='#reconciliation'>" in nav
    assert rest.count("✓") == 1 and rest.count("◐") == 1  # each symbol once: in its section's heading
    assert "<h2>Fig. 3 — precision sweep <span class='badge holds'>✓ holds</span></h2>" in rest
    assert "slope -0.66" in rest and "✓ holds: slope" not in rest  # the detail without a second verdict
    assert "The rows the verdict rests on (2 of 20):" in rest and "<summary>All 20 rows</summary>" in rest
    shown = rest.split("<details><summary>All 20 rows", 1)[0]
    assert "row2" in shown and "row7" in shown and "row3" not in shown
    assert "<a href='https://arxiv.org/abs/2405.02803'>arXiv:2405.02803</a>" in rest
    assert "<a href='..'>the run</a>" in rest  # relative to the page


@pytest.mark.parametrize("low, high, expect", [(0.10, 0.40, True), (0.40, 0.60, False), (0.01, 0.05, False)])
def test_an_agreement_score_whose_interval_contains_chance_is_at_chance(low, high, expect):
    from numdev.report.study import _agreement_cell, at_chance
    from numdev.stats.intervals import Estimate
    from numdev.train.evaluation import CHANCE

    assert CHANCE == {"colour": 1 / 6, "shape": 1 / 3, "position": 1 / 9}
    mean = Estimate(value=(low + high) / 2, low=low, high=high, n=3, method="t")
    assert at_chance("shape_accuracy", mean) is expect
    cell = _agreement_cell("shape_accuracy", {"mean": mean.as_dict(), "difference_to_reference": mean.as_dict()})
    assert (cell == f"at chance ({mean.value:.2f})") is expect  # no interval, no difference shown
    assert ("[" in cell) is not expect


def _analysed(root: Path, name: str, stamp: str, summary: Path) -> Path:
    study = root / "train" / name / f"multirun_{stamp}"
    study.mkdir(parents=True)
    shutil.copyfile(summary, study / "summary.json")
    return study


def test_the_report_finds_the_study_and_the_catalogue_apart_and_shows_the_catalogues_table(tmp_path):
    """The demo runs the early study and then the catalogue: the newest study is not the catalogue, a
    damaged older summary is skipped with a note, and the catalogue adds its table only."""
    from numdev.report.app import latest_study

    results = REPO / "docs" / "results"
    study = _analysed(tmp_path, "flash_stability_early", "2026-01-01_00-00-00", results / "flash_stability_early_summary.json")
    catalogue = _analysed(tmp_path, "optimizations", "2026-01-02_00-00-00", results / "optimizations_summary.json")
    damaged = _analysed(tmp_path, "flash_stability", "2026-01-03_00-00-00", results / "flash_stability_summary.json")
    (damaged / "summary.json").write_text('{"truncated": ')
    notes: list[str] = []
    assert latest_study(tmp_path, notes) == study and latest_study(tmp_path, catalogue=True) == catalogue
    assert any(str(damaged) in note for note in notes)

    page = build_report([], None, tmp_path / "report", catalogue=catalogue).read_text()
    assert page.count("<section") == 1 and "id='optimizations'" in page
    rows = json.loads((catalogue / "summary.json").read_text())["optimizations"]["rows"]
    for row in rows:  # every row whole: its cells' own "|" (as in "mean |Δ|") do not split it
        assert f"<td>{html.escape(row['downstream']['text'], quote=False)}</td>" in page, row["role"]
    assert "<th>phase 1 vs FP64: max |d|</th>" in page  # an escaped | is not a cell boundary
    shown = re.sub(r"<[^>]+>", "", page)  # as a reader sees it (paths are links)
    assert f">{catalogue}</a>" in page and f"{html.escape(script('numdev-report'))} --study {catalogue}" in shown  # its own Figs. 7-8
    with pytest.raises(ValueError, match="no optimizations table"):
        build_report([], None, tmp_path / "report2", catalogue=study)


def test_a_gpu_result_names_its_gpu_driver_and_kernel_libraries(monkeypatch, tmp_path, request):
    """On a CUDA machine the block adds the capability, the driver (nvidia-smi), cuDNN and Triton;
    on a CPU machine none of these keys appear. The GPU is faked here: the fields' plumbing only."""
    import subprocess

    import torch

    from numdev.runs import provenance as module

    assert "gpu_driver" not in provenance()["machine"] or torch.cuda.is_available()
    module.gpu_details.cache_clear()  # read once per process: cleared for the faked GPU, and after it
    request.addfinalizer(module.gpu_details.cache_clear)
    library = tmp_path / "libtorch_cuda.so"
    library.write_bytes(b"machine code")
    monkeypatch.setattr(module, "torch_cuda_library", lambda: library)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91400)
    real_run = subprocess.run

    calls = []

    def run(args, *rest, **options):
        calls.append(args[0])
        if args[0] == "nvidia-smi":
            return subprocess.CompletedProcess(args, 0, stdout="580.95.05\n")
        return real_run(args, *rest, **options)

    monkeypatch.setattr(subprocess, "run", run)
    block = provenance()
    assert block["machine"]["gpu_capability"] == "9.0" and block["machine"]["gpu_driver"] == "580.95.05"
    assert block["versions"]["cudnn"] == 91400
    assert block["versions"]["torch_cuda_sha256"] == hashlib.sha256(b"machine code").hexdigest()
    provenance()
    assert calls.count("nvidia-smi") == 1  # once per process, however often results are written
    assert ", GPU NVIDIA H100 80GB HBM3 (driver 580.95.05);" in machine_line(block)


def test_no_markdown_is_shown_literally_and_the_answer_comes_first(tmp_path):
    from numdev.report.html import ANSWER, LEGEND, Section, render

    section = Section(title="T — x", claim="the paper's `claim`", measured="**measured** with `numdev-study`")
    page = render("r", "s", [section], header="<header id='provenance'></header>", lead="<p>the answer</p>")
    body = page.split("</style>", 1)[1]
    assert "`" not in body and "**" not in body
    assert "<code>numdev-study</code>" in body and "<b>measured</b>" in body
    assert body.index(f"id='{ANSWER}'") < body.index(f"id='{LEGEND}'") < body.index("id='provenance'") < body.index("id='contents'")


@pytest.mark.parametrize("machine, kind", [
    ({"cpu": "Intel(R) Xeon(R) Processor", "cpu_flags": ["amx_bf16", "amx_tile", "avx2", "avx512_bf16", "avx512f"]},
     "Intel(R) Xeon(R) Processor (AMX)"),
    ({"cpu": "AMD EPYC", "cpu_flags": ["avx2", "avx512_bf16", "avx512f"]}, "AMD EPYC (AVX-512-BF16)"),
    ({"cpu": "AMD EPYC", "cpu_flags": ["avx2"]}, "AMD EPYC (AVX2 only)"),
    ({"cpu": "AMD EPYC", "cpu_flags": "avx2"}, "AMD EPYC (its instruction sets not recorded)"),
    ({"cpu": 3}, "an unknown CPU (no provenance.machine.cpu)"),
    ("forged", "an unknown CPU (no provenance.machine.cpu)"),
])
def test_the_cpu_kind_names_what_decides_bf16_rounding(machine, kind):
    """numdev's three CPU kinds round bf16 products differently (AMX tiles, AVX-512-BF16, AVX2 emulation): cpu_kind
    tells them apart from a provenance block, and never raises on a forged one."""
    from numdev.runs.provenance import cpu_kind

    assert cpu_kind({"machine": machine}) == kind
    assert cpu_kind(provenance()).startswith(provenance()["machine"]["cpu"])  # this machine's own block
