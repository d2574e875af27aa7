"""numdev-train through the real command line: a multirun sweep, and training on a GPU with each backend.
(Its one-line errors: tests/test_bad_input_catalogue.py.)"""

from __future__ import annotations

import json
import math

import pytest
from helpers import run_numdev

SMOKE = ["experiment=train_smoke", "trainer.max_steps=2", "callbacks.samples.num_samples=2"]




def test_multirun_over_backends_and_init_seeds(tmp_path):
    result = run_numdev(
        "numdev-train",
        "-m", "attention=baseline,sdpa_flash", "seed.init=0,1", *SMOKE, f"output_root={tmp_path}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    sweeps = list((tmp_path / "train" / "train_smoke").glob("multirun_*"))
    assert len(sweeps) == 1
    jobs = sorted(p for p in sweeps[0].iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in jobs] == ["0", "1", "2", "3"]
    initial = {}
    for job in jobs:
        run = json.loads((job / "run.json").read_text())
        assert run["status"] == "finished" and run["final_step"] == 2
        index = json.loads((job / "weights" / "index.json").read_text())
        initial[(run["backend"], run["seeds"]["init"])] = index["snapshots"][0]["sha256"]
    assert set(initial) == {(b, s) for b in ("baseline", "sdpa_flash") for s in (0, 1)}
    # Same init seed: the same initial weights whatever the backend; another seed: other weights.
    assert initial[("baseline", 0)] == initial[("sdpa_flash", 0)]
    assert initial[("baseline", 1)] == initial[("sdpa_flash", 1)]
    assert initial[("baseline", 0)] != initial[("baseline", 1)]


def _flash_attn_installed() -> bool:
    from numdev.attention import flash_attn_backend

    return bool(flash_attn_backend.installed())


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
@pytest.mark.parametrize("attention", ["eager", "sdpa_flash", "flash_attn", "triton"])
def test_gpu_training_runs_with_each_backend(tmp_path, attention, precision):
    """trainer=gpu end to end (two steps, a snapshot, the samples) with each GPU backend; the record
    says the run was on CUDA and, for flash_attn, which kernel and version ran."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if attention == "flash_attn" and not _flash_attn_installed():
        pytest.skip("no FlashAttention kernel installed (docs/gpu.md)")
    result = run_numdev("numdev-train", *SMOKE, "trainer=gpu", f"attention={attention}", f"precision={precision}",
                          f"output_root={tmp_path}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    [record] = [json.loads(p.read_text()) for p in tmp_path.rglob("run.json")]
    assert record["status"] == "finished" and record["device"] == "cuda" and record["backend"] == attention
    assert record["provenance"]["machine"]["gpu"] and math.isfinite(record["final_loss"])
    if attention == "flash_attn":
        assert {"kernel", "module", "version"} <= set(record["attention"])
