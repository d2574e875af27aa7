"""The held-out predictions file on tiny real runs: written with its checksum beside the loss it
was computed with, and a damaged one refused in one line naming it."""

import hashlib
import json
import shutil

import pytest
import torch
from helpers import compose_train
from hydra.utils import instantiate

from numdev.runs.layout import HELDOUT_PREDICTIONS, PREDICTION_TENSOR, RunDir

IMAGES = 64
# 40 steps and 8 sampler steps: enough that two runs of other seeds differ in what they generate
# (with 4 steps and 2 sampler steps every sample is the same blank), seconds per run; one thread so
# that the barrier's ends repeat heldout.json bit for bit.
COMMON = ("attention=eager", "trainer.max_steps=40", "snapshot.every_n_steps=40", "callbacks.checkpoint=null",
          "callbacks.samples.num_samples=48", "diffusion.sampler.steps=8", f"callbacks.heldout.num_images={IMAGES}",
          "threads=1")
RUNS = {"a": (), "b": (), "other": ("seed.init=1", "seed.data=1", "seed.noise=1"), "off": ("callbacks.heldout.save_predictions=false",)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from numdev.train.run import train

    root = tmp_path_factory.mktemp("function_level")
    for name, extra in RUNS.items():
        train(compose_train(*COMMON, *extra, run_dir=root / name))
    return {name: root / name for name in RUNS}


def _one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_the_predictions_are_the_held_out_losss_own(runs):
    """heldout_predictions.safetensors: float32 (images, C, H, W), its sha256 and size in heldout.json, and
    the MSE of those predictions against the held-out targets is the recorded loss."""
    from numdev.diffusion import training_target
    from numdev.runs.schemas import read_saved_config

    run = RunDir(runs["a"])
    predictions, record = run.read_heldout_predictions()
    assert predictions.dtype == "float32" and predictions.shape == (IMAGES, 3, 16, 16)
    data = run.heldout_predictions.read_bytes()
    assert record["predictions"] == {"file": HELDOUT_PREDICTIONS, "sha256": hashlib.sha256(data).hexdigest(),
                                     "shape": [IMAGES, 3, 16, 16], "dtype": "float32", "bytes": len(data)}
    assert record["images"] == IMAGES and record["seed"] == 0 and record["step"] == 40 and len(record["inputs_sha256"]) == 64
    cfg = read_saved_config(run.config)
    dataset = instantiate(cfg["data"]).heldout_dataset(IMAGES)  # one batch of 64: the loss is one mean
    schedule = instantiate(cfg["diffusion"]["schedule"])
    images = torch.stack([dataset[i]["image"] for i in range(IMAGES)])
    t = torch.linspace(0, schedule.num_steps - 1, IMAGES).round().long()
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(0))
    target = training_target(schedule, cfg["diffusion"]["prediction"], images, noise, t)
    mse = float(((torch.from_numpy(predictions) - target) ** 2).mean())
    assert mse == pytest.approx(record["heldout_loss"], rel=1e-6)


def test_save_predictions_false_writes_none_and_the_same_loss(runs):
    off, on = RunDir(runs["off"]), RunDir(runs["a"])
    assert not off.heldout_predictions.exists()
    assert off.read_heldout()["heldout_loss"] == on.read_heldout()["heldout_loss"]
    assert off.read_heldout()["inputs_sha256"] == on.read_heldout()["inputs_sha256"]
    with pytest.raises(ValueError, match="records no held-out predictions") as error:
        off.read_heldout_predictions()
    assert str(off.heldout) in _one_line(error)


@pytest.mark.parametrize("damage, expect", [
    (lambda p: p.write_bytes(p.read_bytes()[:-7]), "sha256 does not match"),
    (lambda p: p.write_bytes(p.read_bytes()[:100] + bytes([p.read_bytes()[100] ^ 1]) + p.read_bytes()[101:]), "sha256 does not match"),
    (lambda p: p.unlink(), "is missing"),
])
def test_a_damaged_predictions_file_is_one_line_naming_it(runs, tmp_path, damage, expect):
    copy = tmp_path / "copy"
    shutil.copytree(runs["b"], copy)
    damage(copy / HELDOUT_PREDICTIONS)
    with pytest.raises(ValueError, match=expect) as error:
        RunDir(copy).read_heldout_predictions()
    assert str(copy / HELDOUT_PREDICTIONS) in _one_line(error)


def test_a_forged_predictions_file_is_refused(runs, tmp_path):
    """A file whose checksum was rewritten to match: not safetensors, or not the recorded tensor."""
    import safetensors.numpy

    copy = tmp_path / "copy"
    shutil.copytree(runs["b"], copy)
    path, record_path = copy / HELDOUT_PREDICTIONS, copy / "heldout.json"
    for data, expect in ((b"not safetensors at all", "not a safetensors file"),
                         (safetensors.numpy.save({PREDICTION_TENSOR: torch.zeros(IMAGES, 3, 16, 16).double().numpy()}), "no float32 tensor")):
        path.write_bytes(data)
        record = json.loads(record_path.read_text())
        record["predictions"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
        record_path.write_text(json.dumps(record))
        with pytest.raises(ValueError, match=expect) as error:
            RunDir(copy).read_heldout_predictions()
        assert str(path) in _one_line(error)
