"""token_rows.json: which token-embedding rows the captions index, declared exactly and checked."""

from __future__ import annotations

import json

import pytest
from helpers import compose_train
from hydra.utils import instantiate

from numdev.data.shapes import ShapesDataset
from numdev.runs.layout import RunDir, indexed_rows
from numdev.train.run import build_model
from numdev.weights.token_rows import TokenRows, TokenRowsError, embedding_name


@pytest.fixture(scope="module")
def model():
    cfg = compose_train()
    return build_model(cfg, instantiate(cfg.attention))


def _token_rows(model, run_dir):
    name = embedding_name(model)
    return TokenRows(run_dir, name, dict(model.named_parameters())[name].shape[0], model.tokenize)


def test_the_shapes_grammar_declares_exactly_the_tokens_its_captions_have(model, tmp_path):
    datamodule = instantiate(compose_train("data.max_objects=3").data)
    rows = _token_rows(model, tmp_path)
    rows.start(datamodule.caption_vocabulary(), 0)
    captions = [ShapesDataset(size=3000, max_objects=3)[i]["caption"] for i in range(0, 3000, 3)]  # real captions
    seen = rows.ids_of([*captions, ""])
    assert seen == set(rows.first_step)  # nothing missing, nothing extra
    record = RunDir(tmp_path).read_token_rows()
    assert record["source"] == "declared" and record["ids"] == sorted(seen) and set(record["first_step"]) == {0}
    assert embedding_name(model) == record["tensor"] == "text.encoder.token_embedding.weight"


def test_a_caption_outside_the_declaration_stops_the_run_by_name(model, tmp_path):
    rows = _token_rows(model, tmp_path)
    rows.start((["a small red circle at the top"], "one caption"), 0)
    rows.check(["a small red circle at the top", ""], 3)
    with pytest.raises(TokenRowsError, match=r"token ids \[\d+.*\] that one caption do not: .*caption_vocabulary\(\) is wrong"):
        rows.check(["a purple circle"], 3)


def test_seen_rows_count_from_the_snapshot_after_their_batch(model, tmp_path):
    rows = _token_rows(model, tmp_path)
    rows.start(None, 0)  # a streamed dataset: nothing known before training
    rows.check(["a red circle"], 0)
    rows.check(["a red circle", "a blue square"], 5)
    record = RunDir(tmp_path).read_token_rows()
    red, blue = rows.ids_of(["a red circle"]), rows.ids_of(["blue square"]) - rows.ids_of(["a red circle"])
    at = lambda step: set(indexed_rows([record], step)[record["tensor"]].tolist())  # noqa: E731
    assert at(0) == set() and at(1) == red and at(6) == red | blue
    rows = _token_rows(model, tmp_path)  # resumed from a checkpoint at step 4: the later ids are seen again
    rows.start(None, 4)
    assert set(rows.first_step) == red


def test_the_union_of_both_runs_rows_is_compared():
    a = {"format": 1, "tensor": "e", "rows": 10, "source": "declared", "ids": [1, 2], "first_step": [0, 0]}
    b = {**a, "ids": [2, 7]}
    assert indexed_rows([a, b], 0)["e"].tolist() == [1, 2, 7]
    assert indexed_rows([a, None], 0) is None


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(ids=[1, 1]), "'ids' must be distinct integers"),
        (lambda r: r.update(ids=[1, 99]), r"'ids' must be distinct integers in \[0, 10\)"),
        (lambda r: r.update(first_step=[0]), "'ids' and 'first_step' must be lists of one length"),
        (lambda r: r.update(source="guess"), "'source' must be declared or seen"),
    ],
)
def test_a_damaged_record_is_one_line_naming_the_file(tmp_path, edit, message):
    record = {"format": 1, "tensor": "e", "rows": 10, "source": "declared", "ids": [1, 2], "first_step": [0, 0]}
    edit(record)
    RunDir(tmp_path).token_rows.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=rf"token_rows.json: {message}"):
        RunDir(tmp_path).read_token_rows()
