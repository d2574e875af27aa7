"""model=hf, hf_gpt2, hf_qwen2: Hugging Face causal LMs built from a config, offline, their attention
computed by numdev's backends through transformers' attention registry (issue 34's second item)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from helpers import compose_train, train_run

from numdev.attention import Baseline, FlashEmulated, build_backend
from numdev.config.preflight import problem
from numdev.models.attention import AttentionCall
from numdev.models.hf import HFCausalLM, numdev_attention
from numdev.train.run import build_model

transformers = pytest.importorskip("transformers")  # the optional extra .[hf]: `make test-hf` installs it and runs these

RUN = ("model.context_length=64", "data.batch_size=4", "trainer.max_steps=3", "trainer.enable_progress_bar=false",
       "trainer.enable_model_summary=false", "snapshot.every_n_steps=2", "callbacks.checkpoint.every_n_steps=2",
       "callbacks.samples.every_n_steps=1000", "callbacks.samples.num_samples=2", "callbacks.samples.length=8",
       "callbacks.heldout.num_images=8", "optim.warmup_steps=0", "threads=1")
SMALL = {  # one layer of width 32, two query heads of 16 (Llama and Qwen2: sharing one key/value head)
    "hf": ("model.config.hidden_size=32", "model.config.intermediate_size=64", "model.config.num_hidden_layers=1",
           "model.config.num_attention_heads=2", "model.config.num_key_value_heads=1"),
    "hf_qwen2": ("model.config.hidden_size=32", "model.config.intermediate_size=64", "model.config.num_hidden_layers=1",
                 "model.config.num_attention_heads=2", "model.config.num_key_value_heads=1"),
    "hf_gpt2": ("model.config.n_embd=32", "model.config.n_layer=1", "model.config.n_head=2"),
}


def config(name: str, *overrides: str):
    return compose_train(f"model={name}", *SMALL[name], *RUN, *overrides, run_dir="/tmp/unused", smoke=False)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_each_config_computes_what_transformers_own_attention_computes_with_every_backend(name):
    """Same weights, transformers' own sdpa attention against numdev's: eager, the Baseline and the Flash emulator
    tiled in key/value blocks of 16 (4 per call at 64 tokens), FP32: within FP32 rounding of a 64-key softmax."""
    tokens = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    cfg = config(name)
    flash = FlashEmulated(block_r=16, block_c=16)
    models = {label: build_model(cfg, backend) for label, backend in
              (("eager", build_backend("eager")), ("baseline", Baseline()), ("flash", flash))}
    reference = transformers.AutoModelForCausalLM.from_config(models["eager"].hf.config, attn_implementation="sdpa")
    reference.load_state_dict(models["eager"].hf.state_dict())
    with torch.no_grad():
        expected = reference(input_ids=tokens, use_cache=False).logits
        for label, model in models.items():
            assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), models["eager"].state_dict().values()))
            torch.testing.assert_close(model(tokens), expected, rtol=1e-5, atol=2e-5, msg=label)
    assert flash.kv_tiling(64, 64, 16)["kv_blocks"] == 4
    calls = [m for m in models["flash"].modules() if isinstance(m, AttentionCall)]
    assert len(calls) == 1 and calls[0].causal and calls[0].heads == 2 and calls[0].head_dim == 16


def test_sdpa_flash_and_flash_emulated_runs_start_from_bit_identical_weights_and_record_their_tiles(tmp_path):
    from safetensors.torch import load_file

    records, first = {}, {}
    for attention in ("sdpa_flash", "flash_emulated"):
        run_dir = tmp_path / attention
        records[attention] = train_run("model=hf", *SMALL["hf"], *RUN, f"attention={attention}", run_dir=run_dir, smoke=False)
        first[attention] = load_file(run_dir / "weights" / "step_00000000.safetensors")
        assert records[attention]["status"] == "finished" and records[attention]["final_step"] == 3
    assert first["sdpa_flash"].keys() == first["flash_emulated"].keys() and len(first["sdpa_flash"]) > 5
    assert all(torch.equal(first["sdpa_flash"][k], first["flash_emulated"][k]) for k in first["sdpa_flash"])
    layers = records["flash_emulated"]["attention_tiling"]["layers"]
    assert [layer["layer"] for layer in layers] == ["hf.model.layers.0.self_attn.numdev_attention"]
    assert layers[0]["n_keys"] == 64 and layers[0]["kv_blocks"] > 1 and layers[0]["causal"] is True
    heldout = json.loads((tmp_path / "flash_emulated" / "heldout.json").read_text())
    assert heldout["tokens"] == 8 * 64 and 0 < heldout["heldout_loss"] < 6  # near ln 256 = 5.55 after 3 steps


class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.numdev_attention = AttentionCall(2, 16, Baseline(), causal=True)
        self.numdev_attention.layer_name = "layer0"


@pytest.mark.parametrize("change, message", [
    ({"attention_mask": torch.zeros(1, 1, 8, 8)}, "transformers passed an attention mask"),
    ({"dropout": 0.1}, "attention dropout 0.1 while training"),
    ({"scaling": 0.5}, "scales scores by 0.5, not 1/sqrt"),
    ({"softcap": 30.0}, "softcap=30.0 is not computed"),
    ({"sliding_window": 4}, "sliding_window=4 is not computed"),
])
def test_what_numdev_does_not_compute_is_refused_naming_the_layer(change, message):
    q, k, v = torch.randn(1, 2, 8, 16), torch.randn(1, 1, 8, 16), torch.randn(1, 1, 8, 16)
    args = {"attention_mask": None, **change}
    with pytest.raises(ValueError, match=message) as error:
        numdev_attention(_Layer(), q, k, v, **args)
    assert "layer0" in str(error.value) and "\n" not in str(error.value)
    out, weights = numdev_attention(_Layer(), q, k, v, None, scaling=16**-0.5)  # grouped heads: k, v repeated
    expected = Baseline()(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1), causal=True).transpose(1, 2)
    assert weights is None and torch.equal(out, expected)


def test_bad_configs_and_a_missing_transformers_are_one_line_errors(monkeypatch):
    with pytest.raises(ValueError, match="model.config must be a transformers config with its model_type"):
        HFCausalLM(Baseline(), {"hidden_size": 32})
    with pytest.raises(ValueError, match="max_position_embeddings=32 is shorter than model.context_length=64"):
        HFCausalLM(Baseline(), {"model_type": "llama", "max_position_embeddings": 32, "hidden_size": 32,
                                "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 64}, context_length=64)
    with pytest.raises(ValueError, match="model.config.vocab_size=100: data=text's tokens are bytes"):
        train_run("model=hf", *SMALL["hf"], *RUN, "model.config.vocab_size=100", run_dir="/tmp/unused-hf", smoke=False)
    with pytest.raises(ValueError, match=r"model_type='lama': transformers .* does not know it \(did you mean llama"):
        HFCausalLM(Baseline(), {"model_type": "lama"})
    with pytest.raises(ValueError, match=r"model.config.hiden_size is not a setting of transformers' LlamaConfig \(did you mean hidden_size"):
        HFCausalLM(Baseline(), {"model_type": "llama", "hiden_size": 32})
    with pytest.raises(ValueError, match="num_attention_heads=4 is not a multiple of model.config.num_key_value_heads=3"):
        HFCausalLM(Baseline(), {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match=r"LlamaConfig refuses it: ValueError: The hidden size \(-5\)"):
        HFCausalLM(Baseline(), {"model_type": "llama", "hidden_size": -5})
    with pytest.raises(ValueError, match="transformers builds no causal language model from it"):
        HFCausalLM(Baseline(), {"model_type": "t5", "d_model": 32, "num_layers": 1, "num_heads": 2, "vocab_size": 256})
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"model=hf_\* needs transformers, which is not installed: pip install -e '.\[hf\]'"):
        HFCausalLM(Baseline(), {"model_type": "llama"})


def test_a_hugging_face_model_goes_through_the_harm_study_unchanged(tmp_path):
    """The harm study's roles on model=hf (one Llama layer): Flash tiles, the shadow backend compares every call, the
    ladder's noise reaches the model, the analysis reads it all back."""
    import subprocess

    study = tmp_path / "study"
    command = [sys.executable, "-m", "numdev.train.app", "experiment=harm", "model=hf", *SMALL["hf"], "model.context_length=64",
               "data.batch_size=4", "callbacks.heldout.num_images=8", "callbacks.samples.num_samples=2",
               "study=reference,flash_fa2,delta_1e-1", "study.replicate=0,1", "study.kv_block=16", "trainer.max_steps=8",
               "optim.cooldown_steps=2", "optim.warmup_steps=2", "callbacks.shadow.every_n_steps=4", "trainer.enable_progress_bar=false",
               f"hydra.sweep.dir={study}", "hydra.launcher.n_jobs=1"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((study / "summary.json").read_text())
    assert set(summary["roles"]) == {"reference", "flash_fa2", "delta_1e-1"}
    record = json.loads((study / "r0" / "flash_fa2" / "run.json").read_text())
    assert {layer["kv_blocks"] for layer in record["attention_tiling"]["layers"]} == {4}  # 64 keys in blocks of 16
    shadow = (study / "r0" / "flash_fa2" / "shadow.csv").read_text().splitlines()
    assert len(shadow) > 1 and "numdev_attention" in shadow[1]


def test_the_docs_parameter_counts_are_what_transformers_builds():
    from helpers import REPO

    text = " ".join((REPO / "docs" / "workloads.md").read_text(encoding="utf-8").split())
    section = text[text.index("## Hugging Face models from a config"):text.index("## Your own model")]
    for name in SMALL:
        cfg = compose_train(f"model={name}", run_dir="/tmp/unused", smoke=False)
        parameters = sum(p.numel() for p in build_model(cfg, Baseline()).parameters())
        start = section.index(f"`{name}` a ")
        assert f"{parameters:,}" in section[start:start + 120], (name, parameters)


def test_a_key_added_under_the_transformers_config_is_for_transformers_to_check():
    """The preflight passes +model.config.<key> (HFCausalLM takes model.config whole and checks its keys against the
    config class), but still names a key added where nothing reads it."""
    assert problem("train", ["model=hf", "+model.config.rms_norm_eps=1e-5"], lambda cfg: None) is None
    said = problem("train", ["model=hf", "+model.contxt_length=64"], lambda cfg: None)
    assert said.startswith("+model.contxt_length=64: model (numdev.models.hf.HFCausalLM) has no setting contxt_length")


def test_gpt2s_token_embedding_is_the_one_transformers_names():
    from numdev.weights.token_rows import embedding_name

    model = build_model(config("hf_gpt2"), Baseline())
    assert embedding_name(model) == "hf.transformer.wte.weight"  # not wpe, its position embedding
