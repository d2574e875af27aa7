"""The numbers in README.md and docs/results.md are what the scripts write from the committed results.

Each generated block is rebuilt here from the JSON it was generated from (docs/results/) and must
equal the block in the file: a number typed by hand, or a block left behind after its result
changed, fails.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from helpers import REPO, load_script

from numdev.report.docblocks import read_block

README, RESULTS_DOC = REPO / "README.md", REPO / "docs" / "results.md"


_script = load_script


def test_every_block_in_readme_and_results_is_filled_and_names_its_script():
    for doc in (README, RESULTS_DOC):
        names = re.findall(r"<!-- numdev:begin ([\w.-]+) -->", doc.read_text(encoding="utf-8"))
        assert names, doc
        for name in names:
            text = read_block(doc, name)
            assert text, f"{doc.name}: block {name} is empty"
            assert re.search(r"scripts/\w+\.py|`\.venv/bin/numdev-", text), f"{doc.name}: block {name} names no command"


def test_the_phase1_sentence_is_the_scripts_from_the_committed_results():
    phase1 = _script("phase1_results")
    figures = json.loads((REPO / "docs" / "results" / "phase1.json").read_text(encoding="utf-8"))["figures"]
    assert read_block(README, "findings-phase1") == phase1.findings_sentence(figures).strip()
    assert read_block(RESULTS_DOC, "phase1-table").startswith(phase1.results_table(figures))


def test_the_study_headline_is_the_scripts_from_the_committed_summaries():
    table = _script("study_table")
    early = json.loads(table.EARLY_RESULT.read_text(encoding="utf-8"))
    full = json.loads(table.RESULT.read_text(encoding="utf-8"))
    expected = table.headline_text(early, table.EARLY_RESULT, full, table.RESULT, doc=RESULTS_DOC, details="")
    assert read_block(RESULTS_DOC, "study-headline") == expected.strip()
    assert "numdev:begin study-headline" not in README.read_text(encoding="utf-8")  # README's phase-2 answer: the harm study's
    assert read_block(RESULTS_DOC, "study-early") == table.early_block(early, table.EARLY_RESULT).strip()
    assert read_block(RESULTS_DOC, "study-results") == table.block_text(full, "numdev-train experiment=flash_stability").strip()


def test_the_budgets_table_is_the_scripts_from_the_committed_timings():
    budgets = _script("budgets_table")
    rows = budgets.rows()
    assert len(rows) > 2, "no timing JSON in docs/results"
    assert "\n".join(rows) in read_block(RESULTS_DOC, "budgets")
    assert read_block(README, budgets.COSTS) == budgets.costs().strip()  # the Quick start's time and disk


@pytest.mark.parametrize("doc", [README, RESULTS_DOC])
def test_user_text_has_no_session_history(doc):
    """README and the results page speak to a user: no 'this session', no bare commit hashes outside provenance lines."""
    text = doc.read_text(encoding="utf-8")
    assert "this session" not in text.lower()
    if doc == README:
        assert not re.search(r"\b(commit|@) [0-9a-f]{7,40}\b", text), "a commit hash in README.md's text"


@pytest.mark.parametrize("workload", ["dit", "gpt_tiny"])
def test_the_optimizations_tables_are_the_scripts_from_the_committed_summary(workload):
    """Each workload's catalogue on its page (the DiT's in docs/optimizations.md and README, the language
    model's in docs/workloads.md) is what optimization_table.py writes from the committed summary."""
    table = _script("optimization_table")
    work = table.WORKLOADS[workload]
    summary = json.loads(work.result.read_text(encoding="utf-8"))
    assert summary["model"] == work.model
    assert read_block(work.doc, work.table_block) == table.table_text(summary, work.result, work.command).strip()
    assert read_block(work.doc, work.ordering_block) == table.ordering_text(summary, work.result, work.command).strip()
    if workload == "dit":
        assert read_block(README, "findings-optimizations") == table.findings_sentence(summary, work.result, work.command).strip()
        assert read_block(table.DOC, "optimization-catalogue") == table.catalogue_text().strip()  # every option in conf/


def test_the_configuration_reference_lists_every_option_in_conf():
    reference = _script("config_reference")
    assert read_block(reference.DOC, reference.BLOCK) == reference.text().strip()


@pytest.mark.parametrize(("block", "result", "writer"), [
    ("emulator-speed", "bench_emulator.json", "write_table"),
    ("kernel-model-speed", "bench_kernel_model.json", "write_kernel_model_table"),
])
def test_the_speed_tables_are_the_benchmarks_from_the_committed_timings(tmp_path, block, result, writer):
    """docs/microbenchmark.md's speed blocks, sentences included, are what bench_emulator.py writes from its JSON."""
    bench = _script("bench_emulator")
    doc = REPO / "docs" / "microbenchmark.md"
    copy = tmp_path / doc.name
    copy.write_text(doc.read_text(encoding="utf-8"), encoding="utf-8")
    source = REPO / "docs" / "results" / result
    getattr(bench, writer)(json.loads(source.read_text(encoding="utf-8")), copy, source)
    assert read_block(doc, block) == read_block(copy, block)


def test_the_precision_speed_table_is_the_scripts_from_the_committed_benchmarks():
    table = _script("precision_speed_table")
    assert table.results(), "no docs/results/bench_precision_*.json"
    assert read_block(table.DOC, table.BLOCK) == table.block_text().strip()


def test_the_harm_blocks_are_the_scripts_from_the_committed_summaries():
    table = _script("harm_table")
    for which, (result, doc_block, readme_block, experiment, _) in table.STUDIES.items():
        summary = table.read_harm_summary(result)
        assert summary.command == f"numdev-train experiment={experiment}", result
        assert read_block(table.DOC, doc_block) == table.results_block(summary, which).strip(), which
        if readme_block is not None:
            assert read_block(README, readme_block) == table.readme_text(summary, which).strip(), which


def test_no_committed_verdict_rests_on_a_range_of_fewer_than_5_replicates():
    """docs/results' verdicts are what today's rules give on their own numbers (a range from fewer than
    5 replicates carries no verdict): re-judging them changes nothing (scripts/phase1_results.py,
    gemm_results.py and study_table.py --rejudge made them so)."""
    from numdev.analysis.study import rejudge
    from numdev.figures.common import rejudged
    from numdev.runs.harm_summary import is_harm_summary

    results = REPO / "docs" / "results"
    for name in ("phase1.json", "gemm.json"):
        for figure, summary in json.loads((results / name).read_text(encoding="utf-8"))["figures"].items():
            assert rejudged(summary) == summary, f"{name}: {figure}"
    for path in sorted(results.glob("*_summary.json")):
        summary = json.loads(path.read_text(encoding="utf-8"))
        if is_harm_summary(summary):  # the harm study's verdicts are its own (numdev.analysis.harm), made under today's rules
            continue
        assert rejudge(summary) == summary, path.name


def test_the_gpu_call_rehearsal_table_is_the_scripts_from_the_committed_record():
    """docs/gpu.md's table of the GPU call's steps is what gpu_call.py writes from the committed rehearsal,
    a whole one (every step ran and exited 0)."""
    call = _script("gpu_call")
    record = json.loads(call.REHEARSAL.read_text(encoding="utf-8"))
    assert record["complete"] and record["rehearsal"] and all(step["ok"] for step in record["steps"])
    assert [step["name"] for step in record["steps"]] == [step.name for step in call.steps("cuda", call.REPO, call.REPO, 1)]
    assert read_block(call.DOC, call.BLOCK) == call.table(record).strip()
    # the rehearsal under the GPU image's versions: its own record and table (its steps may fail: the table says which)
    image = json.loads(call.IMAGE_REHEARSAL.read_text(encoding="utf-8"))
    assert image["complete"] and image["rehearsal"] and image["provenance"]["versions"]["torch"] != record["provenance"]["versions"]["torch"]
    assert read_block(call.DOC, call.IMAGE_BLOCK) == call.table(image, image=True).strip()


def test_the_triton_compile_table_is_the_scripts_from_the_committed_reports():
    script = _script("triton_compile")
    reports = [json.loads(f.read_text(encoding="utf-8")) for f in sorted(script.RESULTS.glob("triton_compile_*.json"))]
    assert len(reports) >= 2 and all(r["complete"] and r["summary"]["failed"] == 0 for r in reports)
    assert read_block(script.DOC, "triton-compile") == script.doc_table(reports).strip()


def test_the_lr_edge_tables_are_the_scripts_from_the_committed_summaries():
    """docs/gpu.md's edge-of-stability block is what lr_edge.py --write-docs renders from every committed
    lr_edge_cpu*.json, each a replicated sweep (no verdict there rests on fewer than 5 replicates)."""
    script = _script("lr_edge")
    results = [json.loads(f.read_text(encoding="utf-8")) for f in sorted(script.RESULTS.glob(script.PATTERN))]
    assert len(results) >= 2 and all(r["replicated"]["n"] >= 5 for r in results)
    assert read_block(script.DOC, script.BLOCK) == script.render(results).strip()


def _confirmation(**change):
    """The committed confirmation's summary as JSON, with `change` applied (dotted paths): a second machine's study."""
    data = json.loads((REPO / "docs" / "results" / "harm_confirm_summary.json").read_text(encoding="utf-8"))
    for path, value in change.items():
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value
    return data


def test_the_second_cpu_claims_hold_on_the_first_machines_numbers_and_fail_on_cases_built_to_fail():
    """S1-S3 (docs/harm.md#second-cpu) judged by harm_table.replication_claims: the confirmation's own summary passes
    all three; each claim fails on a summary built to fail it; from 3 replicates none gets a verdict."""
    from numdev.runs.harm_summary import from_json

    table = _script("harm_table")
    claims = {line.split(":")[0]: line for line in
              table.replication_claims(from_json(_confirmation()), "harm_confirm_zen5").splitlines()[1:]}
    assert all("✓ holds" in line for line in claims.values()), claims
    assert "run again on Intel(R) Xeon(R) Processor (AMX)" in table.replication_claims(from_json(_confirmation()), "harm_confirm_zen5")
    assert "(40x [21, 77] on the Intel(R) Xeon(R) Processor, 40x [21, 77] on the Intel(R) Xeon(R) Processor)" in claims["- S2, Flash's per-call margin to harm has its lower end above 10"]
    built_to_fail = {
        "- S1, the answer is given again": {"headline.shown": False},
        "- S2, Flash's per-call margin to harm has its lower end above 10": {"roles.flash_fa2.margin_per_call.estimate.low": 9.5},
        "- S3, Flash's held-out effect inside ±10% in every replicate":
            {"roles.flash_fa2.effects.heldout_loss.sign.counts": {"above": 1, "inside": 4, "below": 0, "negative": 4, "positive": 1}},
    }
    for claim, change in built_to_fail.items():
        lines = table.replication_claims(from_json(_confirmation(**change)), "harm_confirm_zen5").splitlines()[1:]
        judged = {line.split(":")[0]: line for line in lines}
        assert "✗ fails" in judged[claim], (claim, judged[claim])
        assert sum("✓ holds" in line for line in lines) == 2, lines
    unmeasured = from_json(_confirmation(**{"roles.flash_fa2.margin_per_call": None, "roles.flash_fa2.effects": {}}))
    lines = table.replication_claims(unmeasured, "harm_confirm_zen5").splitlines()[1:]
    assert ["– (not measured: no verdict)" in line for line in lines] == [False, True, True], lines  # S1 judged; S2, S3 not
    three = from_json(_confirmation(replicates=[5, 6, 7]))
    assert all("– (range of 3: no verdict)" in line for line in table.replication_claims(three, "harm_confirm_zen5").splitlines()[1:])


def test_the_machines_table_gives_each_runs_relative_difference():
    from numdev.runs.harm_summary import from_json

    table = _script("harm_table")
    moved = _confirmation(**{"roles.reference.outcomes.heldout_loss.5": 0.0398 * 1.25, "roles.reference.outcomes.heldout_loss.6": math.nan})
    text = table.machines_table(from_json(moved), "harm_confirm_zen5")
    row = next(line for line in text.splitlines() if line.startswith("| reference |"))
    first = json.loads((REPO / "docs" / "results" / "harm_confirm_summary.json").read_text(encoding="utf-8"))
    expected = 0.0398 * 1.25 / first["roles"]["reference"]["outcomes"]["heldout_loss"]["5"] - 1
    assert f"({expected:+.1%})" in row.split("|")[2] and row.endswith(f"| {expected:.1%} |"), row
    assert row.split("|")[3].strip().endswith("→ nan"), row  # a non-finite run: its values, no ratio
    assert "| ulp | " in text and "-8.8% to +1.5% there" in text


ZEN5 = {"provenance.machine.cpu": "AMD EPYC", "provenance.machine.cpu_flags": ["avx2", "avx512_bf16", "avx512f"]}


@pytest.mark.parametrize("change, problem", [
    ({}, "ran on Intel(R) Xeon(R) Processor (AMX), the first study's CPU kind: not a second one"),
    ({**ZEN5, "workload.steps": 500}, "its workload is {"),
    ({**ZEN5, "margin.margin": 0.2}, "its margin is 0.2, the first study's 0.1"),
    ({**ZEN5, "margin.test": "t"}, "its test is 't', the first study's 'sign'"),
    ({**ZEN5, "replicates": [0, 1, 2, 3, 4]}, "its replicates [0, 1, 2, 3, 4] are not among the first study's [5, 6, 7, 8, 9]"),
    ({**ZEN5, "provenance.machine": "forged"}, "its provenance names no CPU (provenance.machine.cpu)"),  # cpu_kind never raises
    ({**ZEN5, "provenance.machine.cpu_flags": "avx2"}, None),  # flags not a list: 'AMD EPYC (its instruction sets not recorded)'
    ({**ZEN5, "replicates": [5, 6, 7]}, None),  # a study stopped by the clock: its replicates are the first's
    (ZEN5, None),
])
def test_a_second_cpu_summary_must_be_the_same_design_on_another_cpu_kind(change, problem):
    from numdev.runs.harm_summary import from_json

    found = _script("harm_table").replication_problem(from_json(_confirmation(**change)), "harm_confirm_zen5")
    assert (found is None) if problem is None else (problem in found), found


def test_a_second_cpu_summary_without_flash_is_refused_not_judged():
    from numdev.runs.harm_summary import from_json

    data = _confirmation(**ZEN5)
    del data["roles"]["flash_fa2"]
    data["table"] = []  # the headline table's column was Flash's
    assert "it has no role flash_fa2" in _script("harm_table").replication_problem(from_json(data), "harm_confirm_zen5")


def test_harm_table_refuses_a_second_cpu_summary_of_another_design_in_one_line(tmp_path, monkeypatch, capsys):
    forged = tmp_path / "summary.json"
    forged.write_text(json.dumps(_confirmation(**{**ZEN5, "workload.steps": 500})), encoding="utf-8")
    monkeypatch.setattr("sys.argv", ["harm_table.py", "--which", "harm_confirm_zen5", "--summary", str(forged)])
    with pytest.raises(SystemExit) as exit_:
        _script("harm_table").main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert f"{forged}: its workload is" in err and "not the same design run again" in err, err


def test_a_figure_that_cannot_be_written_stops_the_docs_before_any_block_is_written(tmp_path, monkeypatch, capsys):
    table = _script("harm_table")
    doc, readme, figure = tmp_path / "harm.md", tmp_path / "README.md", tmp_path / "machines.png"
    doc.write_text(table.DOC.read_text(encoding="utf-8").replace("S1, the answer", "S1, an edit: the answer"), encoding="utf-8")
    readme.write_text(README.read_text(encoding="utf-8").replace("S1, the answer", "S1, an edit: the answer"), encoding="utf-8")
    figure.mkdir()
    before = doc.read_bytes(), readme.read_bytes()
    monkeypatch.setattr(table, "DOC", doc)
    monkeypatch.setattr(table, "README", readme)
    monkeypatch.setattr(table, "FIGURES", {"harm_confirm_zen5": figure})
    monkeypatch.setattr("sys.argv", ["harm_table.py", "--which", "harm_confirm_zen5", "--write-docs"])
    with pytest.raises(SystemExit) as exit_:
        table.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"{figure} is a directory" in err and err.count("\n") == 1, err
    assert (doc.read_bytes(), readme.read_bytes()) == before  # nothing written: the edits are still there
