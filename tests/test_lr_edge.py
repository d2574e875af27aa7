"""scripts/lr_edge.py and experiment=lr_edge (issue 37 item 4, Wortsman et al.'s LR sweep, eager against
Flash): a real small sweep read back; its fail rule fails on a learning rate built to fail it (lr 10, a
positive control) and not on one that trains; the LR sensitivity and the edge by their definitions;
edited, missing and mixed-up runs refused in one line or reported as not run."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from helpers import REPO, load_script, run_numdev
from scipy import stats as scipy_stats

SMALL = ["model.context_length=64", "model.hidden=32", "trainer.max_steps=40", "data.batch_size=4",
         "callbacks.heldout.num_images=8", "threads=1", "trainer.enable_progress_bar=false", "optim.warmup_steps=5"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    where = tmp_path_factory.mktemp("lr_edge") / "sweep"
    result = run_numdev("numdev-train", "-m", "experiment=lr_edge", *SMALL, "optim.optimizer.lr=1e-2,10",
                        "attention=eager,sdpa_flash", f"hydra.sweep.dir={where}", cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return where


def _read(paths, capsys):
    assert load_script("lr_edge").main([str(p) for p in paths]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_sweep_reads_back_and_the_rule_fails_only_the_rate_built_to_fail(sweep, capsys, tmp_path):
    figure = tmp_path / "edge.png"
    assert load_script("lr_edge").main([str(sweep), "--figure", str(figure), "--out", str(tmp_path / "edge.json")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == json.loads((tmp_path / "edge.json").read_text())
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cells = {(c["backend"], c["lr"]): c for c in result["cells"]}
    assert set(cells) == {("eager", 0.01), ("eager", 10.0), ("sdpa_flash", 0.01), ("sdpa_flash", 10.0)}
    assert result["not_run"] == [] and result["siblings"]["trainer.max_steps"] == 40
    for backend in ("eager", "sdpa_flash"):
        trains, blows = cells[(backend, 0.01)], cells[(backend, 10.0)]
        assert trains["status"] == "finished" and trains["final_step"] == 40
        # lr 1e-2 learns (below ln 256, toward the unigram entropy); lr 10 (Adam moves every weight ~10 a step) diverges
        assert trains["unigram_entropy"] < trains["heldout_loss"] < math.log(256) - 1 and not trains["failed"], trains
        assert blows["failed"] and (blows["heldout_loss"] is None or blows["heldout_loss"] >= math.log(256)), blows
        summary = result["per_backend"][backend]
        assert summary["best_lr"] == 0.01 and summary["edge_lr"] == 10.0 and summary["failed_lrs"] == [10.0]
        losses = [min(cells[(backend, lr)]["heldout_loss"] or math.inf, math.log(256)) for lr in (0.01, 10.0)]
        assert summary["lr_sensitivity"] == pytest.approx(sum(losses) / 2 - cells[(backend, 0.01)]["heldout_loss"])
    # the same seed and data: at a rate that trains, Flash and eager end close (bf16 rounding apart)
    small = next(r for r in result["against_eager"] if r["lr"] == 0.01)
    assert small["backend"] == "sdpa_flash" and abs(small["heldout_minus_eager"]) < 0.05


def test_edge_and_sensitivity_by_their_definitions():
    edge = load_script("lr_edge")

    def cell(lr, loss, failed):
        return {"backend": "b", "lr": lr, "heldout_loss": loss, "failed": failed, "complete": True}

    cells = [cell(1e-3, 3.0, True), cell(1e-2, 2.0, False), cell(1e-1, 2.5, False), cell(1.0, None, True), cell(3.0, 9.0, True)]
    summary = edge.per_backend(cells)["b"]
    assert summary["best_lr"] == 1e-2 and summary["edge_lr"] == 1.0  # the first failure above the best, not 1e-3's
    l0 = math.log(256)
    assert summary["lr_sensitivity"] == pytest.approx((3.0 + 2.0 + 2.5 + l0 + l0) / 5 - 2.0)
    assert edge.per_backend(cells[:3])["b"]["edge_lr"] is None  # nothing above the best failed


def test_a_job_the_sweep_did_not_reach_is_listed_not_read(sweep, tmp_path, capsys):
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    (copy / "3" / "run.json").unlink()  # a job killed before it wrote its record
    result = _read([copy], capsys)
    assert result["not_run"] == [str(copy / "3")] and len(result["cells"]) == 3
    assert result["per_backend"]["sdpa_flash"]["lrs"] == [0.01]


def _provenance_edited(job, key: str, value) -> dict:
    """run.json with its provenance's dotted `key` set to `value` (a forged sub-field)."""
    record = json.loads((job / "run.json").read_text())
    node, *path = record["provenance"], *key.split(".")
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return record


@pytest.mark.parametrize("edit, says", [
    (lambda job: (job / "run.json").write_text("{ truncated"), "run.json"),
    (lambda job: (job / "config.yaml").write_text((job / "config.yaml").read_text().replace("lr: 10\n", "lr: abc\n")),
     "optim.optimizer.lr is 'abc'"),
    (lambda job: (job / "config.yaml").write_text((job / "config.yaml").read_text().replace("max_steps: 40", "max_steps: 41")),
     "differs from"),
    *((lambda job, k=key, v=value: (job / "run.json").write_text(json.dumps({**json.loads((job / "run.json").read_text()), k: v})),
       f"run.json: field '{key}' is {shown}") for key, value, shown in (
        ("backend", 3, "an integer, not a string"), ("status", "done", "'done', not one of 'running', 'finished'"),
        ("attention", "eager", "a string ('eager'), not a mapping"),
        ("device", 0, "an integer, not a string"), ("threads", "1", "a string ('1'), not an integer"))),
    (lambda job: (job / "run.json").write_text(json.dumps({k: v for k, v in json.loads((job / "run.json").read_text()).items()
                                                           if k != "backend"})), "no 'backend'"),
    *((lambda job, k=key, v=value: (job / "run.json").write_text(json.dumps(_provenance_edited(job, k, v))),
       f"run.json: field 'provenance.{key}' {shown}") for key, value, shown in (
        ("machine", 3, "holds an integer, not a mapping"), ("machine.cpu", [1], "is a list, not a string"),
        ("git.dirty", "no", "is a string ('no'), not true/false"), ("versions.torch", [2], "is a list"))),
    (lambda job: (job / "run.json").write_text(json.dumps({**json.loads((job / "run.json").read_text()), "provenance": [1]})),
     "run.json: field 'provenance' holds a list, not a mapping"),
    (lambda job: (job / "config.yaml").write_text((job / "config.yaml").read_text().replace("max_steps: 40", "max_steps: [40]")),
     "config.yaml: field 'trainer.max_steps' is a list, not an integer"),
    (lambda job: (job / "config.yaml").write_text((job / "config.yaml").read_text().replace("\nprecision:\n", "\nprecision: 3\nunused:\n")),
     "config.yaml: field 'precision' is an integer, not a mapping or a string"),
    (lambda job: (job / "heldout.json").write_text("{}"), "heldout.json: field 'heldout_loss' is missing"),
    (lambda job: (job / "config.yaml").write_text((job / "config.yaml").read_text().replace("numdev.data.text.TextDataModule",
                                                                                            "numdev.data.shapes.ShapesDataModule")),
     "the fail rule's ln 256 holds for a language model on bytes"),
    (lambda job: (job / "config.yaml").write_text((job / "config.yaml").read_text()[:200]), "config.yaml"),
])
def test_an_edited_run_is_one_line_naming_it(sweep, tmp_path, capsys, edit, says):
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    edit(copy / "3")
    with pytest.raises(SystemExit) as exit_:
        load_script("lr_edge").main([str(copy)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and says in err, err


def test_two_sweeps_mixed_and_empty_places_are_refused(sweep, tmp_path, capsys):
    copy = tmp_path / "again"
    shutil.copytree(sweep, copy)
    (tmp_path / "empty").mkdir()
    for paths, says in (([sweep, copy], "two sweeps mixed"), ([sweep, sweep], "given twice"), ([tmp_path / "empty"], "neither a run directory"),
                        ([tmp_path / "nope"], "no such directory")):
        with pytest.raises(SystemExit) as exit_:
            load_script("lr_edge").main([str(p) for p in paths])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and says in err, err


def test_a_run_that_went_non_finite_fails_whatever_its_loss(sweep, tmp_path, capsys):
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    path = copy / "0" / "instability.json"  # eager at 1e-2, which trained
    record = json.loads(path.read_text())
    record["events"].append({"step": 7, "kind": "nonfinite_gradient", "action": "stopped"})
    path.write_text(json.dumps(record))
    cells = {(c["backend"], c["lr"]): c for c in _read([copy], capsys)["cells"]}
    assert cells[("eager", 0.01)]["failed"] and cells[("eager", 0.01)]["nonfinite_events"] == 1
    assert not cells[("sdpa_flash", 0.01)]["failed"]


def _replicas(sweep, tmp_path, n):
    """n copies of the sweep, copy r given seed.init = seed.data = r in its configs (replicates with the same runs)."""
    copies = []
    for r in range(n):
        copy = tmp_path / f"seed{r}"
        shutil.copytree(sweep, copy)
        for config in copy.glob("*/config.yaml"):
            text = config.read_text().replace("seed:\n  init: 0\n  data: 0\n", f"seed:\n  init: {r}\n  data: {r}\n")
            config.write_text(text.replace("  num_workers: 0\n  seed: 0\n", f"  num_workers: 0\n  seed: {r}\n"))  # data.seed
        copies.append(copy)
    return copies


def test_replicates_are_read_as_such_and_judged_against_eager_of_the_same_seeds(sweep, tmp_path, capsys):
    result = _read(_replicas(sweep, tmp_path, 5), capsys)
    assert "per_backend" not in result and "against_eager" not in result  # one seed's layout would mix the replicates
    rep = result["replicated"]
    assert rep["n"] == 5 and rep["labels"] == [f"data={r},init={r}" for r in range(5)] and rep["margin"] == 0.03
    assert {c["replicate"] for c in result["cells"]} == set(rep["labels"]) and len(result["cells"]) == 20
    assert rep["failures"]["eager"] == {"0.01": {"failed": 0, "runs": 5}, "10": {"failed": 5, "runs": 5}}
    flash = rep["against_eager"]["sdpa_flash"]
    cells = {(c["backend"], c["lr"]): c for c in result["cells"] if c["replicate"] == rep["labels"][0]}
    at = {row["lr"]: row["heldout"] for row in flash["heldout"]}
    expected = cells[("sdpa_flash", 0.01)]["heldout_loss"] / cells[("eager", 0.01)]["heldout_loss"] - 1
    assert at[0.01]["per_replicate"] == {r: pytest.approx(expected) for r in rep["labels"]}
    assert at[10.0]["per_replicate"] == {r: 0.0 for r in rep["labels"]}  # both failed: both count as ln 256
    # five equal replicates inside the margin: no more than a seed by both tests
    assert at[0.01]["sign"]["equivalence"]["status"] == "holds" and at[0.01]["equivalence"]["status"] == "holds"
    assert flash["edge"]["counts"] == {"earlier": 0, "same": 5, "later": 0}
    assert all(e["eager"] == 10.0 and e["sdpa_flash"] == 10.0 for e in flash["edge"]["per_replicate"].values())
    assert rep["edge_moved"]["per_backend"] == {"sdpa_flash": {"moved": 0, "replicates": 5}} and rep["edge_moved"]["pairs"] == []
    figure = tmp_path / "replicated.png"  # the sweep beside where each seed's edge moved: two panels, twice as wide
    edge = load_script("lr_edge")
    edge.figure(result, figure)
    png = figure.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") > 1.5 * 6.4 * 110


def test_fewer_than_five_replicates_give_ranges_and_no_verdict(sweep, tmp_path, capsys):
    rep = _read(_replicas(sweep, tmp_path, 2), capsys)["replicated"]
    heldout = rep["against_eager"]["sdpa_flash"]["heldout"][0]["heldout"]
    assert heldout["n"] == 2 and heldout["interval"]["method"] == "range" and heldout["tost_interval"] is None
    assert heldout["equivalence"]["status"] == heldout["sign"]["equivalence"]["status"] == "not measurable"


def _cells(losses: dict, failed=()):
    """Synthetic complete cells: {(backend, lr, replicate): held-out loss}; `failed` keys fail."""
    return [{"backend": b, "lr": lr, "replicate": r, "heldout_loss": loss, "failed": (b, lr, r) in failed or loss is None,
             "complete": True} for (b, lr, r), loss in losses.items()]


def test_the_replicated_rules_fail_on_a_backend_built_to_fail_them():
    """Positive control: a backend 10% worse at every rate and one rate earlier to fail in every replicate: harm
    holds by both tests, equivalence fails, the edge is earlier in all five; an identical backend passes."""
    edge = load_script("lr_edge")
    grid, labels = (1e-3, 1e-2, 1e-1, 1.0), [f"init={r}" for r in range(5)]
    losses, failed = {}, set()
    for i, r in enumerate(labels):
        base = {1e-3: 3.0 + 0.01 * i, 1e-2: 2.5 + 0.01 * i, 1e-1: 2.8 + 0.02 * i, 1.0: None}
        for lr in grid:
            losses["eager", lr, r] = base[lr]
            losses["same", lr, r] = base[lr]
            losses["worse", lr, r] = None if lr >= 1e-1 else base[lr] * 1.1
            failed |= {("worse", 1e-1, r)}
    rep = edge.replicated(_cells(losses, failed), labels, 0.03)
    worse, same = rep["against_eager"]["worse"], rep["against_eager"]["same"]
    low = next(row["heldout"] for row in worse["heldout"] if row["lr"] == 1e-3)
    assert low["per_replicate"] == {r: pytest.approx(0.1) for r in labels}
    assert low["sign"]["harm"]["status"] == "holds" and low["sign"]["equivalence"]["status"] == "fails"
    assert low["equivalence"]["status"] == "fails" and low["exceeds"] is True
    assert worse["edge"]["counts"] == {"earlier": 5, "same": 0, "later": 0}
    assert worse["edge"]["judged"]["sign"]["harm"]["status"] == "holds"
    assert worse["lr_sensitivity"]["sign"]["harm"]["status"] == "holds"  # a worse sweep everywhere: a larger mean excess
    assert all(row["heldout"]["sign"]["equivalence"]["status"] == "holds" for row in same["heldout"])
    assert same["edge"]["counts"] == {"earlier": 0, "same": 5, "later": 0}
    assert same["lr_sensitivity"]["per_replicate"] == {r: 0.0 for r in labels}
    assert rep["failures"]["worse"]["0.1"] == {"failed": 5, "runs": 5} and rep["failures"]["eager"]["0.1"]["failed"] == 0


def test_mcnemar_tells_a_backend_that_moves_every_edge_from_one_that_moves_none_and_not_two_alike():
    """MOVED_RULE: 'worse' fails one rate earlier than eager in all 8 seeds, 'same' never moves, 'half' moves in seeds
    0-3 (two earlier, two later) and 'some' in seeds 2-4: worse against same is 8 discordant seeds to 0, McNemar
    p = 2 / 2^8, 'moves it more often'; half against some is 2 to 1, not told apart."""
    edge = load_script("lr_edge")
    grid, labels = (1e-2, 1e-1, 1.0, 2.0), [f"init={r}" for r in range(8)]
    losses, failed = {}, set()
    for i, r in enumerate(labels):
        for lr in grid:
            ok = {1e-2: 3.0 + 0.01 * i, 1e-1: 2.5 + 0.01 * i, 1.0: 2.9, 2.0: None}[lr]
            losses["eager", lr, r] = losses["same", lr, r] = ok
            losses["worse", lr, r] = None if lr >= 1.0 else ok
            losses["half", lr, r] = (None if lr >= 1.0 else ok) if i < 2 else (ok if lr <= 1.0 or i >= 4 else 2.8)
            losses["some", lr, r] = None if 2 <= i <= 4 and lr >= 1.0 else ok
    rep = edge.replicated(_cells(losses, failed), labels, 0.03)
    assert rep["against_eager"]["half"]["edge"]["counts"] == {"earlier": 2, "same": 4, "later": 2}
    moved = rep["edge_moved"]
    assert moved["per_backend"] == {"half": {"moved": 4, "replicates": 8}, "same": {"moved": 0, "replicates": 8},
                                    "some": {"moved": 3, "replicates": 8}, "worse": {"moved": 8, "replicates": 8}}
    pairs = {(p["a"], p["b"]): p for p in moved["pairs"]}
    assert pairs["same", "worse"]["b_only"] == 8 and pairs["same", "worse"]["a_only"] == 0
    assert pairs["same", "worse"]["mcnemar_p"] == pytest.approx(scipy_stats.binomtest(0, 8, 0.5).pvalue) == pytest.approx(2 / 256)
    assert pairs["same", "worse"]["more_often"] == "worse"
    assert (pairs["half", "some"]["a_only"], pairs["half", "some"]["b_only"], pairs["half", "some"]["both"]) == (2, 1, 2)
    assert pairs["half", "some"]["more_often"] is None and pairs["half", "some"]["mcnemar_p"] == pytest.approx(1.0)
    text = "\n".join(edge.block_text({"replicated": rep, "cells": [], "command": "x"}).splitlines()[-1:])
    assert "worse 8 of 8" in text and "worse moves it more often" in text and "half only 2, some only 1" in text


@pytest.mark.parametrize("margin", ["0", "-0.1", "1", "nan", "inf"])
def test_a_margin_outside_0_1_is_one_line(sweep, capsys, margin):
    with pytest.raises(SystemExit) as exit_:
        load_script("lr_edge").main([str(sweep), "--margin", margin])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "--margin" in err, err


def test_the_docs_block_renders_each_replicated_sweep_and_refuses_a_forged_one(sweep, tmp_path, capsys, monkeypatch):
    edge = load_script("lr_edge")
    results = tmp_path / "results"
    out = results / "lr_edge_cpu.json"
    assert edge.main([*map(str, _replicas(sweep, tmp_path, 5)), "--out", str(out)]) == 0
    assert edge.main([*map(str, _replicas(sweep, tmp_path / "again", 2)), "--out", str(results / "lr_edge_cpu_two.json")]) == 0
    capsys.readouterr()
    result = json.loads(out.read_text())
    assert result["command"].startswith("python scripts/lr_edge.py ") and str(out) in result["command"]
    doc = tmp_path / "gpu.md"
    doc.write_text("before\n<!-- numdev:begin lr-edge-cpu -->\nold\n<!-- numdev:end lr-edge-cpu -->\nafter\n")
    monkeypatch.setattr(edge, "DOC", doc)
    monkeypatch.setattr(edge, "RESULTS", results)
    assert edge.main(["--write-docs"]) == 0
    assert capsys.readouterr().err == f"lr_edge.py: {doc}: the table of 2 result(s) written\n"
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "\nold\n" not in text
    assert text.count("`python scripts/lr_edge.py ") == 2 and "5 replicates" in text and "2 replicates" in text
    assert "| 0.01 | " in text and "5 of 5 failed" in text and "0 of 5 failed" in text
    assert "Backends: eager: autocast bfloat16; sdpa_flash: as configured." in text
    assert "| sdpa_flash | held-out loss at lr 0.01 | " in text and "| sdpa_flash | edge, steps earlier (0 earlier, 5 same, 0 later)" in text
    assert "0 / 5 / 0 | ✗ ✓ | ✗ ✓ |" in text  # five equal replicates inside the margin: harm fails, no more than a seed holds, by both
    assert "[range of 2: " in text  # two replicates: a range, no interval
    assert "| 5 of 5 vs 5 of 5 (1) |" in text and "| 0 of 5 vs 0 of 5 (1) |" in text  # failed runs at lr 10 and 1e-2, Fisher p
    assert "numdev 0.1.0 @ " in text and text.count("Intel") + text.count("AMD") <= 4  # the machine once per sweep, not per run
    out.write_text(json.dumps({**result, "replicated": {}}))  # an edited result: one line naming it, the doc untouched
    assert edge.main(["--write-docs"]) == 2
    err = capsys.readouterr().err
    assert "lr_edge_cpu.json" in err and err.count("\n") == 1 and doc.read_text() == text
    for path in results.iterdir():
        path.unlink()
    assert edge.main(["--write-docs"]) == 2 and "run with --out there first" in capsys.readouterr().err
    for extra in (["--out", "x.json"], [str(sweep)]):
        with pytest.raises(SystemExit) as exit_:
            edge.main(["--write-docs", *extra])
        assert exit_.value.code == 2 and "--write-docs renders the committed result alone" in capsys.readouterr().err


def test_one_rate_has_no_sensitivity_or_edge_and_failures_are_counted_with_fishers_test():
    edge = load_script("lr_edge")
    labels = [f"init={r}" for r in range(5)]
    losses = {("eager", 0.5, r): (None if i < 4 else 3.0) for i, r in enumerate(labels)}
    losses.update({("sdpa_flash", 0.5, r): 3.0 for r in labels})
    against = edge.replicated(_cells(losses), labels, 0.03)["against_eager"]["sdpa_flash"]
    assert against["lr_sensitivity"] is None and against["edge"]["per_replicate"] == {}
    failures = against["heldout"][0]["failures"]
    assert failures["sdpa_flash"] == {"failed": 0, "runs": 5} and failures["eager"] == {"failed": 4, "runs": 5}
    assert failures["fisher_p"] == pytest.approx(scipy_stats.fisher_exact([[0, 5], [4, 1]]).pvalue)
    assert failures["fisher_p"] == pytest.approx(2 * 5 / 210)  # 4 failures in 10 runs, none among the 5: C(5,4) / C(10,4), both tails
    text = edge.block_text({"cells": [], "command": "c", "replicated": {**edge.replicated(_cells(losses), labels, 0.03), "labels": labels}})
    assert "| sdpa_flash | LR sensitivity and edge | not defined: one learning rate |" in text


def test_without_eager_nothing_is_judged_and_the_summary_says_why():
    edge = load_script("lr_edge")
    labels = [f"init={r}" for r in range(5)]
    rep = edge.replicated(_cells({("sdpa_flash", 1e-2, r): 2.5 for r in labels}), labels, 0.03)
    assert rep["against_eager"] == {} and "no eager runs" in rep["note"]
    assert rep["failures"] == {"sdpa_flash": {"0.01": {"failed": 0, "runs": 5}}}


def test_runs_of_one_backend_that_differ_in_settings_are_labelled_by_them_and_judged_against_the_named_reference(
        sweep, tmp_path, capsys):
    """Eager with and without attention.scores=fp32 in one reading: not 'two sweeps mixed', but two labels; --reference
    names the one the others are judged against."""
    copy = tmp_path / "scores"
    shutil.copytree(sweep, copy)
    eager_jobs = []
    for job in sorted(p for p in copy.iterdir() if p.name.isdigit()):
        record = json.loads((job / "run.json").read_text())
        if record["backend"] == "eager":
            record["attention"]["scores"] = "fp32"
            (job / "run.json").write_text(json.dumps(record))
            eager_jobs.append(job)
    result = _read([sweep, *eager_jobs], capsys)
    assert {c["backend"] for c in result["cells"]} == {"eager", "eager (scores fp32)", "sdpa_flash"}
    assert {row["backend"] for row in result["against_eager"]} == {"eager (scores fp32)", "sdpa_flash"}
    assert result["reference"] == "eager"
    result = _read([sweep, *eager_jobs, "--reference", "eager (scores fp32)"], capsys)
    assert result["reference"] == "eager (scores fp32)"
    assert {row["backend"] for row in result["against_eager"]} == {"eager", "sdpa_flash"}
    same = next(r for r in result["against_eager"] if r["backend"] == "eager" and r["lr"] == 0.01)
    assert same["heldout_minus_eager"] == 0  # the edited copy is the same run


def test_a_one_ulp_negative_control_is_its_own_label_and_moves_the_loss_by_little(sweep, tmp_path, capsys):
    """Eager trained from weights one ulp apart (init_perturbation=ulp, the edge study's negative control) is not the
    same run twice beside eager: it is labelled by the setting, judged against eager of the same seed, and its held-out
    loss differs from eager's (the perturbation reached the weights) by far less than the margin at a rate that trains."""
    ulp = tmp_path / "ulp"
    result = run_numdev("numdev-train", "experiment=lr_edge", *SMALL, "optim.optimizer.lr=1e-2", "attention=eager",
                        "init_perturbation=ulp", f"hydra.run.dir={ulp}", cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    result = _read([sweep, ulp], capsys)
    assert {c["backend"] for c in result["cells"]} == {"eager", "eager (init_perturbation ulp)", "sdpa_flash"}
    row = next(r for r in result["against_eager"] if r["backend"] == "eager (init_perturbation ulp)")
    eager = next(c for c in result["cells"] if c["backend"] == "eager" and c["lr"] == 0.01)
    assert row["lr"] == 0.01 and row["heldout_minus_eager"] != 0
    assert abs(row["heldout_minus_eager"]) < 0.03 * eager["heldout_loss"]
    alone = _read([ulp], capsys)  # a perturbed run is never plain 'eager', even with no eager run beside it
    assert {c["backend"] for c in alone["cells"]} == {"eager (init_perturbation ulp)"} and "no eager runs" in alone["note"]
    (ulp / "config.yaml").write_text((ulp / "config.yaml").read_text().replace("init_perturbation: ulp", "init_perturbation: 3"))
    with pytest.raises(SystemExit):
        load_script("lr_edge").main([str(ulp)])
    assert "config.yaml: init_perturbation=3: use null, ulp or" in capsys.readouterr().err


def test_labels_name_only_the_settings_that_differ_and_a_missing_reference_is_said():
    edge = load_script("lr_edge")
    labels = [f"init={r}" for r in range(5)]
    cells = _cells({("eager", 0.5, r): 3.0 for r in labels}) + _cells({("eager", 0.5, r): 3.1 for r in labels})
    for cell in cells[:5]:
        cell["attention"] = {"backend": "eager", "autocast": "bfloat16", "dtype": None, "seed": 1}
    for cell in cells[5:]:
        cell["attention"] = {"backend": "eager", "autocast": None, "dtype": "fp32", "seed": 2}
    edge.label_backends(cells)
    assert [c["backend"] for c in cells] == ["eager (autocast bfloat16)"] * 5 + ["eager (dtype fp32)"] * 5
    rep = edge.replicated(cells, labels, 0.03)
    assert rep["against_eager"] == {} and "--reference" in rep["note"] and "eager (dtype fp32)" in rep["note"]
    rep = edge.replicated(cells, labels, 0.03, "eager (autocast bfloat16)")
    fp32 = rep["against_eager"]["eager (dtype fp32)"]["heldout"][0]
    assert fp32["heldout"]["per_replicate"] == {r: pytest.approx(0.1 / 3) for r in labels}
    assert fp32["failures"]["eager (autocast bfloat16)"] == {"failed": 0, "runs": 5}
