"""What a finished training sweep prints: the number of runs it holds, for a plain sweep and a study."""

from numdev.cli.commands import script
from numdev.cli.next_steps import train_sweep as _train


def _runs(root, *names):
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "run.json").write_text("{}")


def test_a_plain_sweep_counts_its_jobs_and_offers_a_comparison(tmp_path):
    _runs(tmp_path, "0", "1", "2")
    lines = _train(tmp_path)
    assert lines[0] == f"sweep done: 3 run(s) in {tmp_path}"
    assert any(script("numdev-compare") in line for line in lines)  # .venv/bin/numdev-compare, or python -m


def test_a_study_counts_the_runs_of_every_replicate(tmp_path):
    _runs(tmp_path, "r0/reference", "r0/flash", "r1/reference", "r1/flash")
    (tmp_path / "summary.json").write_text("{}")
    assert _train(tmp_path) == [f"sweep done: 4 run(s) in {tmp_path}"]
