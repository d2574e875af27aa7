"""Training runs end to end (seconds each, experiment=train_smoke): every CPU backend and precision,
identical initialisation, bit-identical reruns, resume equality, and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import compose_train, snapshot_hashes
from lightning.pytorch.plugins.precision import MixedPrecision
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from numdev.cli.errors import user_facing
from numdev.models.attention import Attention
from numdev.runs.layout import RunDir
from numdev.train.module import DiffusionModule
from numdev.train.run import build_trainer, train
from numdev.weights.store import list_snapshots, load_snapshot

CPU_BACKENDS = ("baseline", "flash_emulated", "sdpa_math", "sdpa_flash")
PRECISIONS = {"fp64": torch.float64, "bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16, "bf16-true": torch.bfloat16}


def _index(run_dir) -> dict:
    return json.loads((run_dir / "weights" / "index.json").read_text())



@pytest.fixture(scope="module")
def backend_runs(tmp_path_factory):
    """One smoke run per CPU backend (fp32), shared by the tests below."""
    runs = {}
    for name in CPU_BACKENDS:
        run_dir = tmp_path_factory.mktemp(name) / "run"
        record = train(compose_train(f"attention={name}", run_dir=run_dir))
        runs[name] = (run_dir, record)
    return runs


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_every_cpu_backend_trains_and_writes_the_run_layout(backend_runs, name):
    run_dir, record = backend_runs[name]
    assert record["status"] == "finished" and record["final_step"] == 4 and record["backend"] == name
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    assert list_snapshots(run_dir) == [0, 2, 4]
    index = _index(run_dir)
    assert index["model"] == "dit_micro" and index["format"] == 1
    state = load_snapshot(run_dir, 4)
    assert set(state) == set(index["param_shapes"]) and "text.encoder.token_embedding.weight" in state
    assert all(t.dtype == torch.float32 for t in state.values())
    assert "pos_embed" not in state  # buffers are not snapshotted
    for path in ("checkpoints/last.ckpt", "config.yaml", "samples.png", "eval.json"):
        assert (run_dir / path).exists(), path
    assert torch.isfinite(torch.tensor(record["final_loss"]))
    events = EventAccumulator(str(RunDir(run_dir).events()))
    events.Reload()
    tags = events.Tags()
    assert {"loss/train", "train/grad_norm", "lr-AdamW", "samples/colour_accuracy"} <= set(tags["scalars"])
    assert "samples" in tags["images"]


def test_runs_differing_only_in_backend_start_from_bit_identical_weights(backend_runs):
    initial = {name: snapshot_hashes(run_dir)[0] for name, (run_dir, _) in backend_runs.items()}
    assert len(set(initial.values())) == 1, initial
    reference = load_snapshot(backend_runs["baseline"][0], 0)
    other = load_snapshot(backend_runs["sdpa_flash"][0], 0)
    assert all(torch.equal(reference[k], other[k]) for k in reference)


def test_the_same_config_twice_gives_bit_identical_snapshots(backend_runs, tmp_path):
    first, _ = backend_runs["baseline"]
    train(compose_train("attention=baseline", run_dir=tmp_path / "again"))
    assert snapshot_hashes(tmp_path / "again") == snapshot_hashes(first)


def test_loader_workers_leave_the_snapshots_alone(backend_runs, tmp_path):
    train(compose_train("attention=baseline", "data.num_workers=2", run_dir=tmp_path))
    assert snapshot_hashes(tmp_path) == snapshot_hashes(backend_runs["baseline"][0])


def test_sampling_during_training_leaves_the_trajectory_alone(backend_runs, tmp_path):
    record = train(compose_train("attention=baseline", "callbacks.samples.every_n_steps=1", run_dir=tmp_path))
    assert record["eval"]["step"] == 4
    assert snapshot_hashes(tmp_path) == snapshot_hashes(backend_runs["baseline"][0])


def test_fast_dev_run_works(tmp_path):
    record = train(compose_train("trainer.fast_dev_run=true", run_dir=tmp_path))
    assert record["status"] == "finished" and record["final_step"] == 1


def test_a_different_init_seed_changes_the_weights(backend_runs, tmp_path):
    train(compose_train("attention=baseline", "seed.init=1", run_dir=tmp_path / "seed1"))
    assert snapshot_hashes(tmp_path / "seed1")[0] != snapshot_hashes(backend_runs["baseline"][0])[0]


@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_every_precision_trains_with_its_compute_dtype(precision, tmp_path, monkeypatch):
    seen = []
    original = Attention.attend

    def recording(self, q, k, v):
        seen.append(q.dtype)
        return original(self, q, k, v)

    monkeypatch.setattr(Attention, "attend", recording)
    record = train(compose_train(f"precision={precision}", "attention=flash_emulated", run_dir=tmp_path))
    assert record["status"] == "finished" and record["precision"] == precision
    assert set(seen) == {PRECISIONS[precision]}
    assert torch.isfinite(torch.tensor(record["final_loss"]))
    state = load_snapshot(tmp_path, 4)
    assert all(t.dtype == torch.float32 for t in state.values())
    if precision == "bf16-true":  # bf16 weights, stored exactly in float32
        assert all(torch.equal(t, t.bfloat16().float()) for t in state.values())


def test_fp16_mixed_on_cpu_uses_lightnings_plugin_with_a_grad_scaler(tmp_path):
    trainer, _ = build_trainer(compose_train("precision=fp16-mixed", run_dir=tmp_path))
    plugin = trainer.precision_plugin
    assert isinstance(plugin, MixedPrecision) and plugin.precision == "16-mixed" and plugin.device == "cpu"
    assert isinstance(plugin.scaler, torch.amp.GradScaler) and plugin.scaler.is_enabled()


def test_resume_after_a_crash_equals_the_uninterrupted_run(backend_runs, tmp_path, monkeypatch):
    uninterrupted, _ = backend_runs["baseline"]
    original = DiffusionModule.training_step

    def crashing(self, batch, batch_idx):
        if self.trainer.global_step == 3:
            raise RuntimeError("simulated crash")
        return original(self, batch, batch_idx)

    monkeypatch.setattr(DiffusionModule, "training_step", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(compose_train("attention=baseline", run_dir=tmp_path))
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "failed"
    monkeypatch.setattr(DiffusionModule, "training_step", original)
    record = train(compose_train("attention=baseline", "resume=true", run_dir=tmp_path))
    assert record["resumes"][0]["from_step"] == 2 and record["status"] == "finished"
    assert snapshot_hashes(tmp_path) == snapshot_hashes(uninterrupted)


def test_a_finished_run_can_be_extended_as_if_it_never_stopped(backend_runs, tmp_path):
    uninterrupted, _ = backend_runs["baseline"]
    train(compose_train("attention=baseline", "trainer.max_steps=2", run_dir=tmp_path))
    assert list_snapshots(tmp_path) == [0, 2]
    train(compose_train("attention=baseline", "trainer.max_steps=4", "resume=true", run_dir=tmp_path))
    assert snapshot_hashes(tmp_path) == snapshot_hashes(uninterrupted)


def test_the_cooldown_decays_the_rate_to_zero_at_max_steps_and_a_run_cannot_be_stretched(tmp_path, capsys):
    from numdev.train.module import lr_factor

    factors = [lr_factor(s, warmup=2, cooldown=4, max_steps=10) for s in range(10)]
    assert factors == pytest.approx([0.5, 1, 1, 1, 1, 1, 1.0, 0.75, 0.5, 0.25])  # warmup, constant, linear to 1/4 at the last step
    assert [lr_factor(s, warmup=2) for s in range(4)] == [0.5, 1, 1, 1]  # no cooldown: max_steps plays no part
    train(compose_train("attention=baseline", "trainer.max_steps=4", "optim.warmup_steps=0", "optim.cooldown_steps=2", run_dir=tmp_path))
    lrs = [e.value for e in _scalars(tmp_path, "lr-AdamW")]
    assert lrs[-1] == pytest.approx(0.5e-3, rel=1e-6)  # the step-3 factor (4 - 3) / 2 of lr 1e-3
    line = _one_line_error(capsys, "attention=baseline", "trainer.max_steps=6", "optim.warmup_steps=0", "optim.cooldown_steps=2",
                           "resume=true", run_dir=tmp_path)
    assert "cannot change with optim.cooldown_steps=2" in line


def _scalars(run_dir, tag):
    events = EventAccumulator(str(next(run_dir.rglob("events.out.tfevents.*"))), size_guidance={"scalars": 0})
    events.Reload()
    return events.Scalars(tag)


def _one_line_error(capsys, *overrides, run_dir):
    with pytest.raises(SystemExit) as exit_:
        user_facing("numdev-train")(train)(compose_train(*overrides, run_dir=run_dir))
    assert exit_.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("numdev-train: error:")]
    assert len(lines) == 1
    return lines[0]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["attention=flash_attn"], "attention=flash_attn with precision=fp32 on cpu: attention backend 'flash_attn' cannot run here"),
        (["attention=sdpa_efficient"], "the memory-efficient kernel runs on CUDA only"),
        (["attention=sdpa_cudnn", "precision=bf16-mixed"], "the cuDNN kernel runs on CUDA only"),
        (["trainer.accelerator=gpu"], "trainer.accelerator='gpu': use cpu or cuda"),
        (["trainer.max_steps=0"], "trainer.max_steps=0 must be a positive integer"),
        (["seed.init=-1"], "seed.init=-1 must be a non-negative integer"),
        (["data.batch_size=0"], "data.batch_size=0 must be a positive integer"),
        (["snapshot.every_n_steps=0"], "snapshot.every_n_steps=0 must be a positive integer"),
        (["precision.compute=fp12"], "unknown float format 'fp12'"),
        (["model.heads=3"], "not divisible by 3 heads"),
        (["diffusion.p_uncond=1.5"], "diffusion.p_uncond=1.5 must be a number in [0, 1)"),
        (["diffusion.sampler.kind=euler"], "unknown sampler 'euler'"),
        (["data=folder"], "data.root is not set"),
        (["resume=true"], "resume=true but"),
        (["optim.cooldown_steps=-1"], "optim.cooldown_steps=-1 must be a non-negative integer"),
        (["optim.cooldown_steps=5", "trainer.max_steps=4"], "optim.cooldown_steps=5 with optim.warmup_steps=0 is more than trainer.max_steps=4"),
    ],
)
def test_bad_settings_are_one_line_errors(capsys, tmp_path, overrides, message):
    line = _one_line_error(capsys, *overrides, run_dir=tmp_path)
    assert message in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for machines without CUDA")
def test_gpu_trainer_without_a_gpu_is_a_one_line_error(capsys, tmp_path):
    assert "no CUDA device is visible: use trainer=cpu" in _one_line_error(capsys, "trainer=gpu", run_dir=tmp_path)


def test_a_run_directory_is_never_overwritten_and_resume_checks_the_config(backend_runs, capsys):
    run_dir, _ = backend_runs["sdpa_math"]
    assert "already holds a run: add resume=true" in _one_line_error(capsys, "attention=sdpa_math", run_dir=run_dir)
    line = _one_line_error(capsys, "attention=sdpa_math", "resume=true", "model.hidden=64", run_dir=run_dir)
    assert "the config differs from the run's config.yaml at model.hidden (32 -> 64)" in line


def test_unknown_config_options_name_the_choices():
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException) as error:
        compose_train("attention=nope")
    assert "attention/nope" in str(error.value) and "sdpa_flash" in str(error.value)


def test_a_run_on_a_folder_of_captioned_images(tmp_path):
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    for i in range(6):
        Image.new("RGB", (40, 30), (40 * i, 100, 200)).save(images / f"{i}.png")
        (images / f"{i}.txt").write_text(f"picture number {i}")
    record = train(compose_train("data=folder", f"data.root={images}", run_dir=tmp_path / "run"))
    assert record["status"] == "finished" and list_snapshots(tmp_path / "run") == [0, 2, 4]
    assert record["eval"]["scored"] == 0  # not shapes captions: sampled and shown, not scored


class _Probed(Exception):
    pass


@pytest.mark.parametrize(("deterministic", "before", "after"), [
    ("true", None, ":4096:8"),     # set before the backend probe's first cuBLAS call
    ("warn", ":0:0", ":4096:8"),   # a nondeterministic workspace is replaced
    ("true", ":16:8", ":16:8"),    # the other deterministic workspace is kept
    ("false", None, None),         # left alone when determinism is off
])
def test_the_cublas_workspace_is_deterministic_before_the_backend_probe(deterministic, before, after, tmp_path,
                                                                        monkeypatch):
    """torch reads CUBLAS_WORKSPACE_CONFIG once, at the first cuBLAS call, which the backend probe makes before
    Lightning's Trainer sets it: a deterministic run must have it set before that probe (eager on a GPU raised)."""
    import numdev.train.run as run

    seen = {}

    def probe(cfg, backend):
        seen["value"] = run.os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        raise _Probed

    if before is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", before)
    monkeypatch.setattr(run, "check_backend_for", probe)
    with pytest.raises(_Probed):
        train(compose_train(f"trainer.deterministic={deterministic}", run_dir=tmp_path / "run"))
    assert seen["value"] == after
