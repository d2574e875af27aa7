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


@pytest.mark.parametrize("edit, says", [
    (lambda job: (job / "run.json").write_text("{ truncated"), "run.json"),
    (lambda job: (job / "config.yaml").write_text((job / "config.yaml").read_text().replace("lr: 10\n", "lr: abc\n")),
     "optim.optimizer.lr is 'abc'"),
    (lambda job: (job / "config.yaml").write_text((job / "config.yaml").read_text().replace("max_steps: 40", "max_steps: 41")),
     "differs from"),
    (lambda job: (job / "run.json").write_text(json.dumps({**json.loads((job / "run.json").read_text()), "backend": 3})),
     "no 'backend'"),
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
