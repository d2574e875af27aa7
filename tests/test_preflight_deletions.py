"""Which settings read a deleted key (numdev.config.preflight._interpolations_of): the check behind
"~seed.init: seed.data reads it" and the deletion-order message; and a key both deleted and set in one
command (_set_and_deleted). The real commands are in test_bad_input_catalogue.py."""

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from numdev.config.preflight import _interpolations_of, _replaced, _set_and_deleted


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


@pytest.mark.parametrize(("line", "says"), [
    ("~seed.init seed.init=3", "~seed.init seed.init=3: seed.init is deleted and then set"),
    ("~seed.init seed.init=0,1", "~seed.init seed.init=0,1: seed.init is deleted and then set"),
    ("~optim.optimizer optim.optimizer.lr=3", "~optim.optimizer optim.optimizer.lr=3: optim.optimizer is deleted and then "
     "optim.optimizer.lr, under it, is set"),
    ("seed.init=0,1 ~seed.init", "seed.init=0,1 ~seed.init: the sweep sets seed.init and ~seed.init then deletes it in every job"),
    ("optim.optimizer.lr=1,2 ~optim.optimizer", "optim.optimizer.lr=1,2 ~optim.optimizer: the sweep sets optim.optimizer.lr "
     "and ~optim.optimizer then deletes it in every job"),
    ("model.width=2 ~seed.init=3 seed.init=4", "~seed.init=3 seed.init=4: seed.init is deleted and then set"),
    ("~hydra.job.chdir hydra.job.chdir=false", "~hydra.job.chdir hydra.job.chdir=false: hydra.job.chdir is deleted and then set"),
])
def test_a_key_deleted_and_set_in_an_order_hydra_cannot_take_is_named(line, says):
    message = _set_and_deleted(OverridesParser.create().parse_overrides(line.split()))
    assert message is not None and message.startswith(says), message


@pytest.mark.parametrize("line", [
    "seed.init=0 ~seed.init",        # a null given a value so that Hydra can delete it
    "~seed.init +seed.init=3",       # deleted and added back: a replacement
    "~seed.init ++seed.init=3",
    "~seed.initial seed.init=3",     # another key, whose name starts the same
    "seed.init=0,1 ~seed.initial",
    "~seed.init ~seed.data",         # two deletions: the deletion-order check's
    "hydra.job.name=a ~hydra.job.name",
    "~seed.init ++seed.init=3 seed.data=2",
    "~seed seed.init=3",             # a top-level key may be a group: the checks that compose the config say it
])
def test_other_orders_and_other_keys_pass(line):
    assert _set_and_deleted(OverridesParser.create().parse_overrides(line.split())) is None


def test_a_deletion_added_back_later_is_a_replacement_and_no_other_is():
    parse = OverridesParser.create().parse_overrides
    assert [o.input_line for o in _replaced(parse("~seed.init ~seed.data +seed.init=3 ~model ++model.width=2".split()))] \
        == ["~seed.init", "~model"]
    assert _replaced(parse("+seed.init=3 ~seed.init ~seed.data seed.data=1 +seed.initial=4".split())) == []
