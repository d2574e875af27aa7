"""run.json attention_tiling: each attention layer's lengths and the key/value blocks its backend splits
a call into, from the backend's own rule (numdev.attention.*.kv_tiling) and the shapes the first step saw."""

from __future__ import annotations

import math

import pytest
from helpers import compose_train

from numdev.attention import Baseline, Eager, OutputNoise, build_backend
from numdev.attention.registry import UNTILED
from numdev.attention.tiles import resolve_tiles
from numdev.train.run import train

NO_EXTRAS = ("callbacks.samples=null", "callbacks.heldout=null", "callbacks.checkpoint=null")


@pytest.mark.parametrize(("n_keys", "block_c", "blocks"), [(64, 8, 8), (64, 16, 4), (24, 8, 3), (20, 8, 3), (5, 8, 1), (64, 64, 1)])
def test_the_emulator_splits_the_keys_by_its_tile(n_keys, block_c, blocks):
    tiling = build_backend("flash_emulated", block_c=block_c).kv_tiling(64, n_keys, 16)
    assert tiling["kv_blocks"] == blocks == math.ceil(n_keys / min(block_c, n_keys))
    assert tiling["kv_block"] == min(block_c, n_keys)


def test_the_emulator_follows_its_tile_rule():
    pinned = build_backend("flash_emulated", tile_rule="kv_blocks", kv_blocks=64)
    assert pinned.kv_tiling(4096, 4096, 64)["kv_blocks"] == 64 and pinned.kv_tiling(4096, 4096, 64)["kv_block"] == 64
    assert build_backend("flash_emulated", tile_rule="cpu_sdpa").kv_tiling(64, 1500, 16)["kv_blocks"] == 3  # 512-key blocks


@pytest.mark.parametrize(("n_keys", "block", "blocks"), [(16, 16, 1), (64, 64, 1), (512, 512, 1), (513, 512, 2), (4096, 512, 8)])
def test_the_cpu_flash_kernel_is_recorded_by_its_rule(n_keys, block, blocks):
    """PyTorch's CPU flash kernel: key/value blocks of 512, clamped to the length (one block at the study's sizes)."""
    tiling = build_backend("sdpa_flash").kv_tiling(64, n_keys, 16)
    assert (tiling["kv_block"], tiling["kv_blocks"]) == (block, blocks)
    assert resolve_tiles(64, n_keys, 16, rule="cpu_sdpa").block_c == block
    assert build_backend("sdpa_flash").kv_tiling(64, n_keys, 16, device="cuda")["kv_blocks"] is None  # FA2 picks its own


@pytest.mark.parametrize("backend", [Eager(), Baseline(), build_backend("sdpa_math"), OutputNoise(Eager(), delta=0.1)])
def test_untiled_backends_say_one_block(backend):
    assert backend.kv_tiling(64, 24, 16) == {"kv_block": 24, "kv_blocks": 1, "rule": UNTILED}


def test_output_noise_tiles_as_its_inner_backend():
    noise = OutputNoise(inner=build_backend("flash_emulated", block_c=8))
    assert noise.kv_tiling(64, 64, 16)["kv_blocks"] == 8


def test_a_backend_whose_kernel_picks_its_blocks_records_none():
    assert build_backend("sdpa_efficient").kv_tiling(64, 64, 16)["kv_blocks"] is None


def _tiling(tmp_path, *overrides, smoke=False) -> dict:
    record = train(compose_train(*overrides, "trainer.max_steps=1", *NO_EXTRAS, run_dir=tmp_path, smoke=smoke))
    assert record["status"] == "finished"
    return {layer["layer"]: layer for layer in record["attention_tiling"]["layers"]}


def test_dit_study_at_32x32_with_8_wide_tiles_records_8_blocks_for_image_self_attention(tmp_path):
    layers = _tiling(tmp_path, "model=dit_study", "data.resolution=32", "data.batch_size=4", "attention=flash_emulated",
                     "attention.block_c=8")
    assert len(layers) == 3 * 2 + 2  # 3 DiT blocks (self, cross), 2 text blocks
    for depth in range(3):
        image = layers[f"blocks.{depth}.attn"]
        assert (image["n_queries"], image["n_keys"], image["kv_block"], image["kv_blocks"]) == (64, 64, 8, 8)
        cross = layers[f"blocks.{depth}.cross_attn"]
        assert (cross["n_queries"], cross["n_keys"], cross["kv_blocks"]) == (64, 24, 3)  # the caption's 24 tokens
    text = layers["text.encoder.transformer.resblocks.0.attn"]
    assert (text["n_queries"], text["n_keys"], text["kv_blocks"], text["causal"]) == (24, 24, 3, True)
    assert all(layer["backend"] == "flash_emulated" and layer["head_dim"] == 16 for layer in layers.values())


@pytest.mark.parametrize(("attention", "rule"), [("sdpa_flash", "PyTorch's CPU flash kernel"), ("baseline", UNTILED)])
def test_the_cpu_flash_kernel_and_an_untiled_backend_record_one_block(tmp_path, attention, rule):
    layers = _tiling(tmp_path, f"attention={attention}", smoke=True)
    assert set(layers) == {"blocks.0.attn", "blocks.0.cross_attn", "text.encoder.transformer.resblocks.0.attn"}
    for layer in layers.values():
        assert layer["kv_blocks"] == 1 and layer["kv_block"] == layer["n_keys"] and layer["rule"].startswith(rule)
