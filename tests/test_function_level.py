"""numdev.analysis.function_level on tiny real runs: identical runs agree exactly (disagreement 0,
churn 0, barrier 0), runs of other seeds do not; the held-out predictions file is written with its
checksum and a damaged one is refused in one line naming it; runs made on other inputs are refused."""

import hashlib
import json
import shutil

import pytest
import torch
from helpers import compose_train
from hydra.utils import instantiate

from numdev.analysis.function_level import (
    BARRIER_RULE,
    CHURN_RULE,
    DISAGREEMENT_RULE,
    churn,
    loss_barrier,
    prediction_disagreement,
)
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
        prediction_disagreement(runs["a"], runs["off"])
    assert str(off.heldout) in _one_line(error)


def test_identical_runs_agree_exactly(runs):
    disagreement = prediction_disagreement(runs["a"], runs["b"])
    assert disagreement["relative_rms"] == 0.0 and disagreement["rms_difference"] == 0.0
    assert disagreement["correlation"]["min"] == 1.0 and disagreement["correlation"]["mean"] == 1.0
    assert disagreement["images"] == IMAGES and disagreement["rule"] == DISAGREEMENT_RULE
    same = churn(runs["a"], runs["b"])
    assert (same["colour"], same["shape"], same["position"], same["any"]) == (0.0, 0.0, 0.0, 0.0)
    assert same["samples"] == 48 and same["accuracy"]["a"] == same["accuracy"]["b"] and same["rule"] == CHURN_RULE
    barrier = loss_barrier(runs["a"], runs["b"])
    assert barrier["barrier"] == 0.0 and set(barrier["excess"]) == {0.0} and len(set(barrier["losses"])) == 1
    assert barrier["alphas"] == [0.0, 0.25, 0.5, 0.75, 1.0] and barrier["rule"] == BARRIER_RULE


def test_runs_of_other_seeds_differ_in_function(runs):
    disagreement = prediction_disagreement(runs["a"], runs["other"])
    assert disagreement["relative_rms"] > 0.01 and disagreement["correlation"]["mean"] < 0.99
    other = churn(runs["a"], runs["other"])
    assert other["any"] > 0 and other["any"] >= max(other["colour"], other["shape"], other["position"])
    barrier = loss_barrier(runs["a"], runs["other"], alphas=(0.5, 0.25, 0.75))
    assert barrier["barrier"] > 0 and barrier["alphas"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    worst = barrier["alphas"].index(barrier["barrier_alpha"])
    assert barrier["barrier"] == barrier["losses"][worst] - barrier["chord"][worst]


def test_the_evaluation_error_is_the_paired_per_image_difference_standard_error(runs):
    """Recomputed from the predictions, the per-image losses reproduce both runs' recorded losses; the effect is the
    recorded relative difference, and its se is the per-image differences' standard error (by hand with numpy)."""
    from numdev.analysis.function_level import EVALUATION_ERROR_RULE, evaluation_error

    got = evaluation_error(runs["other"], runs["a"])
    la, lb = RunDir(runs["other"]).read_heldout()["heldout_loss"], RunDir(runs["a"]).read_heldout()["heldout_loss"]
    assert got["effect"] == pytest.approx((la - lb) / lb, rel=1e-4) and got["images"] == IMAGES
    assert 0 < got["se"] < abs(got["effect"]) * 10 and got["rule"] == EVALUATION_ERROR_RULE
    same = evaluation_error(runs["a"], runs["b"])
    assert same["effect"] == 0.0 and same["se"] == 0.0


def test_the_barriers_ends_are_the_runs_own_held_out_losses(runs):
    """Evaluated the same way (one model, precision and attention), L(0) and L(1) repeat heldout.json exactly."""
    barrier = loss_barrier(runs["a"], runs["other"])
    recorded = {name: RunDir(runs[name]).read_heldout()["heldout_loss"] for name in ("a", "other")}
    assert barrier["loss_a"] == recorded["a"] and barrier["loss_b"] == recorded["other"]
    assert barrier["endpoints_match_heldout_json"] == {"a": True, "b": True} and barrier["steps"] == {"a": 40, "b": 40}
    assert barrier["losses"][0] == recorded["a"] and barrier["losses"][-1] == recorded["other"]
    eager = loss_barrier(runs["a"], runs["other"], alphas=(0.5,), attention="eager")  # the runs' own backend is eager
    assert eager["losses"] == [barrier["losses"][i] for i in (0, 2, 4)]


@pytest.mark.parametrize("damage, expect", [
    (lambda p: p.write_bytes(p.read_bytes()[:-7]), "the file is truncated, extended or was changed"),
    (lambda p: p.write_bytes(p.read_bytes()[:100] + bytes([p.read_bytes()[100] ^ 1]) + p.read_bytes()[101:]), "sha256 does not match"),
    (lambda p: p.unlink(), "is missing"),
])
def test_a_damaged_predictions_file_is_one_line_naming_it(runs, tmp_path, damage, expect):
    copy = tmp_path / "copy"
    shutil.copytree(runs["b"], copy)
    damage(copy / HELDOUT_PREDICTIONS)
    with pytest.raises(ValueError, match=expect) as error:
        prediction_disagreement(runs["a"], copy)
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


def test_predictions_of_another_held_out_set_are_refused(runs, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(runs["b"], copy)
    record = json.loads((copy / "heldout.json").read_text())
    record["seed"] = 1
    (copy / "heldout.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="different held-out sets") as error:
        prediction_disagreement(runs["a"], copy)
    line = _one_line(error)
    assert str(runs["a"] / "heldout.json") in line and str(copy / "heldout.json") in line and "seed 0 vs 1" in line
    record["seed"], record["inputs_sha256"] = 0, "0" * 64
    (copy / "heldout.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="the inputs' sha256"):
        prediction_disagreement(runs["a"], copy)
    with pytest.raises(ValueError, match="different held-out sets"):
        loss_barrier(runs["a"], copy)
    other = tmp_path / "other"  # both records forged alike: the inputs the barrier evaluates give them away
    shutil.copytree(runs["a"], other)
    (other / "heldout.json").write_text(json.dumps({**json.loads((other / "heldout.json").read_text()), "inputs_sha256": "0" * 64}))
    with pytest.raises(ValueError, match="other held-out inputs") as error:
        loss_barrier(other, copy)
    assert str(other / "heldout.json") in _one_line(error)


def test_churn_refuses_other_captions_or_sample_seeds(runs, tmp_path):
    for edit, expect in ((lambda r: r.update(sample_seed=1), "sample seeds"),
                         (lambda r: r["samples"][0].update(caption="a big red square at the top"), "captions"),
                         (lambda r: r.update(step=39), "steps")):
        copy = tmp_path / f"copy_{expect.replace(' ', '_')}"
        shutil.copytree(runs["b"], copy)
        record = json.loads((copy / "eval.json").read_text())
        edit(record)
        (copy / "eval.json").write_text(json.dumps(record))
        with pytest.raises(ValueError, match=f"different {expect}") as error:
            churn(runs["a"], copy)
        assert str(copy / "eval.json") in _one_line(error)


def _eval(path, samples):
    path.mkdir()
    scored = [s for s in samples if s is not None]
    (path / "eval.json").write_text(json.dumps({"step": 10, "sample_seed": 0, "scored": len(scored), "samples": samples,
                                                "colour_accuracy": 0.5, "shape_accuracy": 0.5, "position_accuracy": 0.5}))
    return path


def test_churn_by_hand(tmp_path):
    """Five samples, one not scored: colour differs in 1 of the 4 scored, shape in 2, position in 1 ('no object'
    against an object counts), any in 3."""
    def s(caption, colour, shape, position):
        return {"caption": caption, "colour": colour, "shape": shape, "position": position}

    caps = [f"a small red circle at the {p}" for p in ("top", "left", "center", "right")]
    a = _eval(tmp_path / "a", [s(caps[0], "red", "circle", "top"), s(caps[1], "red", "circle", "left"), None,
                               s(caps[2], "red", "square", "center"), s(caps[3], None, None, None)])
    b = _eval(tmp_path / "b", [s(caps[0], "red", "circle", "top"), s(caps[1], "red", "square", "left"), None,
                               s(caps[2], "red", "triangle", "center"), s(caps[3], "blue", None, "right")])
    result = churn(a, b)
    assert result["samples"] == 4
    assert (result["colour"], result["shape"], result["position"], result["any"]) == (0.25, 0.5, 0.25, 0.75)


def test_loss_barrier_refuses_another_model_and_bad_alphas(runs, tmp_path):
    import yaml

    copy = tmp_path / "copy"
    shutil.copytree(runs["b"], copy)
    config = yaml.safe_load((copy / "config.yaml").read_text())
    config["model"]["hidden"] = 64
    (copy / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="different models") as error:
        loss_barrier(runs["a"], copy)
    assert str(copy / "config.yaml") in _one_line(error)
    for alphas in ((0.0, 0.5), (1.0,), (), (0.5, 0.5)):
        with pytest.raises(ValueError, match="alphas"):
            loss_barrier(runs["a"], runs["b"], alphas=alphas)
    with pytest.raises(ValueError, match="attention="):
        loss_barrier(runs["a"], runs["b"], attention="flash")
