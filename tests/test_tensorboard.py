"""TensorBoard opens on what matters: read back with TensorBoard's own event reader.

A run's scalar groups sort with loss/ first (distance/ before it when there is a sibling), no
`epoch` card, per-tensor distances only on request, an HParams summary with the run's choices,
and the run's directory named by its overrides (what TensorBoard shows as the run's name).
"""

from __future__ import annotations

from pathlib import Path

from helpers import compose_train
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from numdev.runs.layout import RunDir
from numdev.train.run import train


def test_the_first_cards_are_the_loss_and_the_hparams_hold_the_runs_choices(tmp_path):
    run = train(compose_train("trainer.max_steps=2", "snapshot.every_n_steps=1", "callbacks.samples.every_n_steps=2",
                              "callbacks.samples.num_samples=2", run_dir=tmp_path))
    assert run["status"] == "finished"
    where = RunDir(tmp_path).events()
    assert where == tmp_path / "run"  # outside a Hydra job: no overrides to name it by
    events = EventAccumulator(str(where), size_guidance={"scalars": 0})
    events.Reload()
    scalars = events.Tags()["scalars"]
    groups = sorted({tag.split("/")[0] for tag in scalars})
    assert groups[0] == "loss" and "epoch" not in scalars, groups  # TensorBoard sorts the groups: loss first
    assert {"loss/train", "samples/colour_accuracy"} <= set(scalars)
    assert abs(events.Scalars("loss/train")[-1].value - run["final_loss"]) < 1e-6  # the run's own loss
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["model"].string_value == run_config_value(tmp_path, "model", "name")  # the run's choices
    assert start.hparams["max_steps"].number_value == 2 and "model.hidden" not in start.hparams
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} >= {"loss/train", "loss/heldout"}


def run_config_value(run_dir, *keys):
    import yaml

    node = yaml.safe_load((run_dir / "config.yaml").read_text())
    for key in keys:
        node = node[key]
    return node


def test_a_run_is_named_by_its_overrides(tmp_path):
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from numdev.train.tensorboard import TensorBoardLogger

    with initialize_config_module(config_module="numdev.conf.train", version_base="1.3"):
        cfg = compose(config_name="train", overrides=["attention=sdpa_flash", "seed.init=1", f"output_root={tmp_path}"],
                      return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.job.override_dirname = "attention=sdpa_flash,seed.init=1"  # as Hydra sets it (output_root excluded)
        cfg.hydra.runtime.output_dir = str(tmp_path)
    HydraConfig.instance().set_config(cfg)
    try:
        logger = TensorBoardLogger(str(tmp_path / "job"))
        assert logger.log_dir == str(tmp_path / "job" / "attention=sdpa_flash,seed.init=1")
        assert Path(TensorBoardLogger(str(tmp_path / "study"), run_name_default="").log_dir) == tmp_path / "study"
    finally:
        HydraConfig.instance().cfg = None
    assert "output_root" in cfg.hydra.job.config.override_dirname.exclude_keys
