"""A user's own nn.Module through numdev (docs/workloads.md#custom): a model and datasets defined in a package outside
numdev's source tree (tests/fixtures/user_package/toy_user), chosen by a YAML file in the user's own config folder
(tests/fixtures/user_conf), trained, and put through the harm study unchanged."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from helpers import REPO, compose_train
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from numdev.train.run import build_model, build_module, train

PACKAGE = REPO / "tests" / "fixtures" / "user_package"
CONF = REPO / "tests" / "fixtures" / "user_conf"
SEARCH = f"hydra.searchpath=[file://{CONF}]"
SHORT = ("trainer.max_steps=4", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "threads=1",
         "snapshot.every_n_steps=2", "callbacks.checkpoint.every_n_steps=2", "optim.warmup_steps=0", "callbacks.heldout.num_images=16")


@pytest.fixture
def user_package(monkeypatch):
    monkeypatch.syspath_prepend(str(PACKAGE))
    yield
    sys.modules.pop("toy_user", None)


def test_a_user_model_trains_and_its_heldout_loss_is_its_own_loss_over_the_heldout_items(user_package, tmp_path):
    cfg = compose_train(SEARCH, "model=toy", *SHORT, run_dir=tmp_path / "run", smoke=False)
    record = train(cfg)
    assert record["status"] == "finished" and record["model"] == "toy"
    heldout = json.loads((tmp_path / "run" / "heldout.json").read_text())
    assert heldout["images"] == 16 and len(heldout["item_losses"]) == 16
    assert math.isclose(sum(heldout["item_losses"]) / 16, heldout["heldout_loss"], rel_tol=1e-6)
    # the loss recomputed here, in FP64, from the final weights
    from numdev.weights.store import load_snapshot

    model = build_model(cfg, instantiate(cfg.attention)).double()
    weights = load_snapshot(tmp_path / "run", 4)
    model.load_state_dict({k: v.double() for k, v in weights.items()})
    data = instantiate(cfg.data)
    items = [data.heldout_dataset(16)[i] for i in range(16)]
    x = torch.stack([i["x"] for i in items]).double()
    y = torch.stack([i["y"] for i in items]).double()
    with torch.no_grad():
        expected = float(((model(x) - y) ** 2).mean())
    assert math.isclose(heldout["heldout_loss"], expected, rel_tol=1e-4)
    assert record["attention_tiling"]["layers"][0]["layer"] == "attn"  # numdev sees the user's attention layer


def test_two_backends_start_from_the_same_weights(user_package):
    states = []
    for backend in ("baseline", "flash_emulated"):
        cfg = compose_train(SEARCH, "model=toy", f"attention={backend}", *SHORT, run_dir="/tmp/unused", smoke=False)
        states.append(build_model(cfg, instantiate(cfg.attention)).state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_a_model_without_a_loss_method_is_a_one_line_error(user_package):
    cfg = compose_train(SEARCH, "model=toy", "model._target_=torch.nn.Identity", "~model.width", "~model.heads", "~model.name",
                        *SHORT, run_dir="/tmp/unused", smoke=False)
    with pytest.raises(ValueError, match="without a loss\\(batch\\) method"):
        build_module(cfg, torch.nn.Linear(1, 1))


def test_a_train_set_that_is_not_a_dataset_is_a_one_line_error(user_package):
    cfg = compose_train(SEARCH, "model=toy", "data.train._target_=builtins.object", "~data.train.size", *SHORT,
                        run_dir="/tmp/unused", smoke=False)
    with pytest.raises(InstantiationException, match="data.train builds a object, not a map-style dataset"):
        instantiate(cfg.data)


def test_the_user_model_goes_through_the_harm_study_unchanged(tmp_path):
    study = tmp_path / "study"
    env = {**os.environ, "PYTHONPATH": f"{PACKAGE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "numdev.train.app", SEARCH, "experiment=harm", "model=toy", "study=reference,ulp,lr_x10",
               "study.replicate=0,1", "trainer.max_steps=8", "optim.cooldown_steps=2", "optim.warmup_steps=2",
               "callbacks.shadow.every_n_steps=4", "trainer.enable_progress_bar=false", "study.harm.learned_below=1.0",
               f"hydra.sweep.dir={study}", "hydra.launcher.n_jobs=1"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((study / "summary.json").read_text())
    assert set(summary["roles"]) == {"reference", "ulp", "lr_x10"}
    assert summary["headline"]["gate"]["learned"]["ok"]  # the registered learned_below gate, met
    for role in ("ulp", "lr_x10"):  # paired held-out effects and the evaluation set's own error, per replicate
        assert set(summary["roles"][role]["function_level"]["evaluation_error"]["per_replicate"]) == {"0", "1"}


def test_a_model_target_that_is_not_a_module_and_a_missing_config_folder_are_one_line_errors(user_package):
    from numdev.config.groups import override_mistake

    cfg = compose_train(SEARCH, "model=toy", "model._target_=collections.OrderedDict", "~model.width", "~model.heads",
                        "~model.name", *SHORT, run_dir="/tmp/unused", smoke=False)
    with pytest.raises(ValueError, match="builds a OrderedDict, not a torch.nn.Module"):
        build_model(cfg, instantiate(cfg.attention))
    said = override_mistake("train", ["hydra.searchpath=[file:///nonexistent/conf]", "model=toy"])
    assert said.startswith("hydra.searchpath: file:///nonexistent/conf is not a folder")
    assert override_mistake("train", [SEARCH, "model=toy"]) is None
