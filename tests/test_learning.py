"""The default CPU run learns: after the default budget, samples follow their captions (minutes: slow)."""

from __future__ import annotations

import json

import pytest
from helpers import compose_train

from numdev.train.run import train


@pytest.mark.slow
def test_the_default_run_learns_colours_and_positions(tmp_path):
    record = train(compose_train("trainer.enable_progress_bar=false", run_dir=tmp_path, smoke=False))
    scores = json.loads((tmp_path / "eval.json").read_text())
    assert record["final_step"] == 1200 and scores["scored"] == 36
    # Chance: colour 1/6, shape 1/3, position 1/9.
    assert scores["colour_accuracy"] >= 0.8 and scores["position_accuracy"] >= 0.6
    assert (tmp_path / "samples.png").stat().st_size > 10_000
