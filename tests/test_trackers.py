"""The experiment trackers (numdev.train.trackers): TensorBoard, CSV, MLflow and W&B, alone or together,
each holding the run's own numbers; a tracker whose package is missing is one line naming the extra."""

from __future__ import annotations

import csv
import importlib.util
import logging
import sys

import pytest
from helpers import compose_train
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from numdev.cli.errors import UserError
from numdev.runs.layout import RunDir
from numdev.train import trackers
from numdev.train.run import train

SHORT = ("trainer.max_steps=2", "snapshot.every_n_steps=1", "callbacks.samples.every_n_steps=2", "callbacks.samples.num_samples=2")


def _csv_losses(run_dir) -> list[float]:
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        return [float(r["loss/train"]) for r in csv.DictReader(f) if r.get("loss/train")]


def test_tensorboard_and_csv_together_hold_the_same_losses_as_the_run(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="numdev.train.callbacks.step_time")
    run = train(compose_train(*SHORT, "logger=[tensorboard,csv]", run_dir=tmp_path))
    assert run["status"] == "finished"
    events = EventAccumulator(str(RunDir(tmp_path).events()), size_guidance={"scalars": 0})
    events.Reload()
    tensorboard_losses = [e.value for e in events.Scalars("loss/train")]
    csv_losses = _csv_losses(tmp_path)
    assert len(csv_losses) == len(tensorboard_losses) == 2
    assert csv_losses == pytest.approx(tensorboard_losses, rel=1e-6)
    assert csv_losses[-1] == pytest.approx(run["final_loss"], rel=1e-6)
    # the run's log (app.log in a Hydra job) has its losses and step times
    lines = [r.getMessage() for r in caplog.records if r.name == "numdev.train.callbacks.step_time"]
    assert any(line.startswith("step 2: loss ") and "s/step" in line for line in lines), lines


def test_the_hparams_view_shows_the_runs_choices_not_its_whole_config(tmp_path):
    from tensorboard.plugins.hparams import plugin_data_pb2

    cfg = compose_train(*SHORT, run_dir=tmp_path)
    train(cfg)
    events = EventAccumulator(str(RunDir(tmp_path).events()))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    shown = dict(start.hparams)
    assert shown["model"].string_value == cfg.model.name and shown["attention"].string_value == cfg.attention._target_.split(".")[-1]
    assert shown["lr"].number_value == pytest.approx(cfg.optim.optimizer.lr)
    assert len(shown) < 25 and not any(k.endswith("_target_") or "/" in str(v) for k, v in trackers.choices(cfg).items())
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} >= {"loss/train", "loss/heldout"}


def test_a_sibling_run_shows_its_distance_and_the_shadow_its_deviation_in_hparams():
    from numdev.train.tensorboard import metric_tags

    cfg = OmegaConf.create({"sibling": {"reference": "/x/r0/reference", "label": None}, "callbacks": {"shadow": {"a": 1}}})
    tags = metric_tags(cfg)
    assert "distance/reference/rel_frobenius" in tags and "shadow/all/out_rel_rms" in tags
    assert not any(t.startswith(("distance/", "shadow/")) for t in metric_tags(OmegaConf.create({})))


@pytest.mark.parametrize("node, message", [
    ({"csv": {"save_dir": "x"}}, "logger.csv: has no _target_"),
    ({"csv": [1, 2]}, "logger.csv: has no _target_"),
    ({"csv": {"_target_": "lightning.pytorch.loggers.CSVLogger", "save_dir": "x", "nope": 1}}, "logger.csv: TypeError"),
    ({"x": {"_target_": "no.such.Logger"}}, "logger.x: "),
])
def test_a_broken_tracker_setting_is_one_line_naming_its_key(node, message):
    with pytest.raises(UserError, match=message) as error:
        trackers.build_loggers(OmegaConf.create(node))
    assert "\n" not in str(error.value)


def test_no_tracker_is_no_logger_and_a_list_is_refused_by_name():
    assert trackers.build_loggers(None) == [] and trackers.build_loggers(OmegaConf.create({})) == []
    assert trackers.build_loggers(OmegaConf.create({"csv": None})) == []
    with pytest.raises(UserError, match="logger: holds ListConfig"):
        trackers.build_loggers(OmegaConf.create(["csv"]))


@pytest.mark.parametrize("option, package", [("mlflow", "mlflow"), ("wandb", "wandb")])
def test_a_missing_tracker_package_is_one_line_naming_the_extra(option, package, tmp_path, monkeypatch):
    for name in list(sys.modules):
        if name == package or name.startswith(package + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # `import mlflow` raises ModuleNotFoundError
    cfg = compose_train(*SHORT, f"logger={option}", run_dir=tmp_path)
    with pytest.raises(UserError, match=rf"logger.{option}: logger={option} needs the {package} package.*pip install -e '.\[{option}\]'"):
        trackers.build_loggers(cfg.logger)


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="the mlflow extra is not installed")
def test_mlflow_holds_the_runs_losses_in_a_shared_local_store(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # the store is outputs/mlflow.db where the command starts
    runs = [train(compose_train(*SHORT, "logger=mlflow", f"seed.init={seed}", run_dir=tmp_path / f"r{seed}")) for seed in (0, 1)]
    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(compose_train(*SHORT).name)
    found = client.search_runs([experiment.experiment_id])
    assert len(found) == 2
    for run, seed in zip(runs, (0, 1)):
        mine = next(r for r in found if r.data.tags.get("mlflow.runName") == str(tmp_path / f"r{seed}"))
        history = client.get_metric_history(mine.info.run_id, "loss/train")
        assert history[-1].value == pytest.approx(run["final_loss"], rel=1e-6)
        assert mine.data.params["seed.init"] == str(seed)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="the wandb extra is not installed")
def test_wandb_runs_offline_into_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = train(compose_train(*SHORT, "logger=wandb", run_dir=tmp_path))
    assert run["status"] == "finished"
    offline = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0


def test_a_step_on_a_gpu_waits_for_its_kernels_at_both_ends(monkeypatch):
    """CUDA runs kernels after their launch: without a synchronize the optimizer's kernels would count in the next step."""
    import types

    import torch

    from numdev.train.callbacks.step_time import StepTimes

    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(str(device)))
    times = StepTimes()
    trainer = types.SimpleNamespace(global_step=1, log_every_n_steps=50, max_steps=10)
    for device, expected in ((torch.device("cpu"), []), (torch.device("cuda", 0), ["cuda:0", "cuda:0"])):
        waited.clear()
        module = types.SimpleNamespace(device=device)
        times.on_train_batch_start(trainer, module, None, 0)
        times.on_train_batch_end(trainer, module, {"loss": torch.tensor(1.0)}, None, 0)
        assert waited == expected
    assert len(times.seconds) == 2
