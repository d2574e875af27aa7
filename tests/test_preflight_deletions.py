"""Which settings read a deleted key (numdev.config.preflight._interpolations_of): the check behind
"~seed.init: seed.data reads it" and the deletion-order message (the real commands are in
test_bad_input_catalogue.py)."""

from omegaconf import OmegaConf

from numdev.config.preflight import _interpolations_of


def _cfg():
    return OmegaConf.create({
        "seed": {"init": 3, "data": "${seed.init}", "initial": 7},
        "data": {"seed": "${seed.data}", "paths": ["a", "${seed.init}/b"], "offset": "${oc.select:seed.init,0}"},
        "model": {"width": "${seed}", "depth": "${seed.initial}"},
        "name": "run_${seed.init}",
    })


def test_every_reader_is_found_in_nodes_lists_and_text_and_none_other():
    found = dict(_interpolations_of(_cfg(), "seed.init", set()))
    assert found == {"seed.data": "${seed.init}", "data.paths.1": "${seed.init}/b", "name": "run_${seed.init}"}
    # ${seed.initial} is another key; oc.select has a default, so it does not fail when the key is gone
    assert "model.depth" not in found and "data.offset" not in found


def test_a_reader_of_a_key_under_a_deleted_node_counts_and_deleted_readers_do_not():
    whole = dict(_interpolations_of(_cfg(), "seed", set()))
    assert set(whole) == {"seed.data", "data.seed", "data.paths.1", "model.width", "model.depth", "name"}
    assert [p for p, _ in _interpolations_of(_cfg(), "seed.data", set())] == ["data.seed"]
    assert [p for p, _ in _interpolations_of(_cfg(), "seed.init", {"seed.data", "data", "name"})] == []
