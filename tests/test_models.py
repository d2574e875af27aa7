"""DiT + open_clip text tower: shapes, initialisation independent of the backend, open_clip compatibility."""

from __future__ import annotations

from pathlib import Path

import open_clip
import pytest
import torch
from hydra.utils import instantiate

from numdev.attention import Baseline, backend_names
from numdev.models import DiT, TextTower
from numdev.train.run import build_model

ATTENTION_CONFIGS = sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "attention").glob("*.yaml"))


def test_every_backend_has_a_config():
    assert ATTENTION_CONFIGS == backend_names()  # every registered backend can be chosen with attention=<name>


def _state(cfg):
    return build_model(cfg, instantiate(cfg.attention)).state_dict()


def test_initial_weights_are_bit_identical_for_every_backend_and_precision(train_config):
    reference = _state(train_config("attention=baseline"))
    for name in ATTENTION_CONFIGS:  # building never runs the backend: CUDA-only ones build on CPU too
        state = _state(train_config(f"attention={name}"))
        assert list(state) == list(reference), name
        assert all(torch.equal(state[k], reference[k]) for k in reference), name
    for overrides in (["precision=bf16-mixed"], ["seed.data=5", "seed.noise=7"]):
        state = _state(train_config(*overrides))
        assert all(torch.equal(state[k], reference[k]) for k in reference), overrides


def test_only_seed_init_changes_the_initial_weights(train_config):
    a, b = _state(train_config("seed.init=0")), _state(train_config("seed.init=1"))
    changed = [k for k in a if not torch.equal(a[k], b[k])]
    # Everything drawn at random changes; the zero-initialised (adaLN-Zero, biases) does not.
    assert "blocks.0.attn.in_proj_weight" in changed and "text.encoder.token_embedding.weight" in changed
    assert "final_layer.linear.weight" not in changed


def test_building_a_model_leaves_the_global_rng_alone(train_config):
    cfg = train_config()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model(cfg, Baseline())
    assert torch.equal(torch.rand(3), expected)


def test_dit_predicts_zero_noise_at_init_and_keeps_shapes(train_config):
    cfg = train_config()
    model = build_model(cfg, Baseline())
    tokens = model.tokenize(["a small red circle at the top", ""])
    assert tokens.shape == (2, cfg.model.text.context_length)
    x = torch.randn(2, 3, cfg.data.resolution, cfg.data.resolution)
    out = model(x, torch.tensor([0, 999]), model.encode_text(tokens))
    assert out.shape == x.shape
    assert torch.count_nonzero(out) == 0  # adaLN-Zero: the final layer starts at zero
    assert len(model.attention_layers) == 2 * cfg.model.depth + cfg.model.text.layers


def test_text_tower_is_open_clips_and_loads_its_weights():
    torch.manual_seed(0)
    reference = open_clip.transformer.TextTransformer(
        context_length=12, vocab_size=49408, width=32, heads=4, layers=2, output_dim=16, output_tokens=True
    )
    tower = TextTower(Baseline(), width=32, heads=4, layers=2, context_length=12, output_dim=16)
    assert {k: v.shape for k, v in tower.encoder.state_dict().items()} == {k: v.shape for k, v in reference.state_dict().items()}
    tower.encoder.load_state_dict(reference.state_dict())
    tokens = tower.tokenize(["a large blue square at the left", "hello"])
    pooled, token_features = reference(tokens)
    features = tower(tokens)
    torch.testing.assert_close(features.pooled, pooled, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(features.tokens, token_features, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ViT-B-32", "give '<open_clip model>/<pretrained tag>'"),
        ("No-Such-Model/openai", "open_clip has no model 'No-Such-Model'"),
        ("ViT-B-32/no_such_tag", "no pretrained weights 'no_such_tag' for ViT-B-32"),
        ("ViT-B-32/openai", "its text tower has width=512"),  # sizes are checked before any download
    ],
)
def test_pretrained_text_tower_errors_are_one_line(spec, message):
    with pytest.raises(ValueError, match="model.text.pretrained") as error:
        TextTower(Baseline(), width=32, heads=4, layers=2, context_length=12, output_dim=16, pretrained=spec)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_dit_rejects_bad_sizes():
    with pytest.raises(ValueError, match="not a multiple of the patch size"):
        DiT(Baseline(), text={"width": 32, "heads": 2, "layers": 1, "context_length": 8, "output_dim": 32}, image_size=30, patch=4, hidden=32, depth=1, heads=2)


VIT_B_32_TEXT = {"width": 512, "heads": 8, "layers": 12, "context_length": 77, "output_dim": 512}


def test_pretrained_loads_an_open_clip_text_tower_by_name(monkeypatch):
    """The download is replaced by a randomly initialised ViT-B-32 (no network here); the
    tower must then reproduce that CLIP's own text encoder."""
    torch.manual_seed(0)
    clip = open_clip.create_model("ViT-B-32", pretrained=None)
    calls = []

    def fake_create_model(name, pretrained=None, device="cpu"):
        calls.append((name, pretrained))
        return clip

    monkeypatch.setattr(open_clip, "create_model", fake_create_model)
    tower = TextTower(Baseline(), pretrained="ViT-B-32/openai", **VIT_B_32_TEXT)
    assert calls == [("ViT-B-32", "openai")]
    tokens = tower.tokenize(["a large red circle at the top left"])
    with torch.no_grad():
        torch.testing.assert_close(tower(tokens).pooled, clip.encode_text(tokens), rtol=1e-4, atol=1e-4)


def test_pretrained_offline_is_a_one_line_error(monkeypatch):
    def offline(*args, **kwargs):
        raise RuntimeError("Failed to download weights for tag 'openai': Name or service not known\nmore")

    monkeypatch.setattr(open_clip, "create_model", offline)
    with pytest.raises(ValueError, match="needs the network or a warm cache; set model.text.pretrained=null") as error:
        TextTower(Baseline(), pretrained="ViT-B-32/openai", **VIT_B_32_TEXT)
    assert "\n" not in str(error.value)
