"""The language-model workload: a nanoGPT-style causal model on real text (the Python help topics, as bytes),
trained by the same app, callbacks and records as the DiT (issue 34's first item)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import compose_train, train_run
from hydra.utils import instantiate

from numdev.attention import Baseline, FlashEmulated
from numdev.data.text import TextDataModule, corpus_bytes
from numdev.models.gpt import GPT
from numdev.runs.layout import RunDir
from numdev.train.run import build_model

SMALL = ("model=gpt_tiny", "model.hidden=32", "model.depth=1", "model.heads=2", "model.context_length=64",
         "data.batch_size=4", "trainer.max_steps=4", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
         "trainer.enable_model_summary=false", "snapshot.every_n_steps=2", "callbacks.checkpoint.every_n_steps=2",
         "callbacks.samples.every_n_steps=1000", "callbacks.samples.num_samples=2", "callbacks.samples.length=8",
         "callbacks.heldout.num_images=8", "optim.warmup_steps=0", "threads=1")


def lm_config(*overrides: str, run_dir="/tmp/unused"):
    return compose_train(*SMALL, *overrides, run_dir=run_dir, smoke=False)


def test_the_model_is_causal_and_its_attention_tiles_in_every_flash_call():
    torch.manual_seed(0)
    flash = FlashEmulated(block_r=16, block_c=16)
    model = GPT(flash, context_length=64, hidden=32, depth=2, heads=2)
    tokens = torch.randint(0, 256, (2, 64))
    changed = tokens.clone()
    changed[:, 40:] = (changed[:, 40:] + 1) % 256
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.equal(a[:, :40], b[:, :40])  # no position reads a later token
    assert not torch.equal(a[:, 40:], b[:, 40:])
    # the emulator (fp32 stages, 4 key/value blocks of 16) against softmax attention, both in fp32, and an FP64 forward
    reference = GPT(Baseline(), context_length=64, hidden=32, depth=2, heads=2)
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        exact = reference.double()(tokens)
        error = (a.double() - exact).abs().max() / exact.abs().max()
        baseline_error = (reference.float()(tokens).double() - exact).abs().max() / exact.abs().max()
    assert error < 1e-5 and baseline_error < 1e-5


def test_initial_weights_do_not_depend_on_the_backend_or_precision():
    def state(*overrides):
        cfg = lm_config(*overrides)
        return build_model(cfg, instantiate(cfg.attention)).state_dict()

    reference = state("attention=baseline")
    for overrides in (["attention=flash_emulated"], ["attention=sdpa_flash", "precision=bf16-mixed"], ["seed.data=3"]):
        other = state(*overrides)
        assert all(torch.equal(other[k], reference[k]) for k in reference), overrides
    assert not torch.equal(state("seed.init=1")["embed.weight"], reference["embed.weight"])


def test_the_corpus_is_the_interpreters_help_text_and_the_heldout_part_is_never_trained_on():
    from pydoc_data.topics import topics

    text = corpus_bytes("python_topics")
    assert len(text) == sum(len(topics[k].encode()) for k in topics) + 2 * (len(topics) - 1)
    data = TextDataModule(sequence_length=64, stride=16, batch_size=2)
    data.setup()
    last = data.dataset[len(data.dataset) - 1]["tokens"]
    assert len(last) == 65 and (len(data.dataset) - 1) * 16 + 65 <= data.split  # training windows end before the split
    heldout = data.heldout_dataset(4)
    assert bytes(heldout[0]["tokens"].tolist()) == text[data.split : data.split + 65]
    prompts = data.preview_captions(3)
    assert all(p.encode() in text[data.split :] for p in prompts)


@pytest.mark.parametrize("kwargs, message", [
    ({"corpus": "wiki"}, "data.corpus='wiki'"),
    ({"sequence_length": 0}, "data.sequence_length=0"),
    ({"stride": -1}, "data.stride=-1"),
    ({"heldout_fraction": 0.9}, "data.heldout_fraction=0.9"),
    ({"sequence_length": 10**7}, "longer than the text"),
])
def test_bad_text_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        data = TextDataModule(**kwargs)
        data.setup()


@pytest.mark.parametrize("kwargs, message", [
    ({"hidden": 30, "heads": 4}, "not divisible"),
    ({"depth": 0}, "model.depth=0"),
    ({"mlp_ratio": -1}, "model.mlp_ratio=-1"),
])
def test_bad_model_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GPT(Baseline(), **kwargs)


def test_a_run_trains_records_heldout_perplexity_greedy_tokens_and_continuations(tmp_path):
    record = train_run(*SMALL, run_dir=tmp_path / "a", smoke=False)
    assert record["status"] == "finished" and record["model"] == "gpt_tiny"
    heldout = json.loads((tmp_path / "a" / "heldout.json").read_text())
    assert heldout["tokens"] == 8 * 64 and math.isclose(heldout["perplexity"], math.exp(heldout["heldout_loss"]))
    assert 0 < heldout["heldout_loss"] < math.log(256) + 0.5  # near chance after 4 steps, never far above it
    predictions, _ = RunDir(tmp_path / "a").read_heldout_predictions()
    assert predictions.shape == (8, 64) and ((predictions >= 0) & (predictions < 256)).all()
    samples = json.loads((tmp_path / "a" / "continuations.json").read_text())["samples"]
    assert len(samples) == 2 and all(len(s["continuation"].encode("utf-8", "surrogatepass")) >= 8 for s in samples)
    tiling = record["attention_tiling"]["layers"]
    assert tiling[0]["causal"] and tiling[0]["n_keys"] == 64


def test_the_heldout_loss_is_the_mean_token_cross_entropy_in_fp64(tmp_path):
    from numdev.train.run import build_module

    cfg = lm_config()
    model = build_model(cfg, instantiate(cfg.attention))
    module = build_module(cfg, model)
    data = instantiate(cfg.data)
    windows = data.heldout_dataset(3)
    result = module.heldout(windows, seed=0, batch_size=2, forward_context=torch.no_grad, keep_predictions=True)
    tokens = torch.stack([windows[i]["tokens"] for i in range(3)])
    with torch.no_grad():
        logits = model.double()(tokens[:, :-1])
    expected = -torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None]).mean()
    assert math.isclose(result.loss, float(expected), rel_tol=1e-5)
    assert torch.equal(result.predictions, logits.argmax(-1).float())


def test_a_language_model_on_image_data_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="add data=text"):
        train_run(*SMALL, "data=shapes", run_dir=tmp_path / "x", smoke=False)
    with pytest.raises(ValueError, match="choose a language model"):
        train_run("model=dit_tiny", "data=text", run_dir=tmp_path / "y")


def test_the_language_model_goes_through_the_optimizations_study_unchanged(tmp_path):
    import subprocess
    import sys

    study = tmp_path / "study"
    command = [sys.executable, "-m", "numdev.train.app", "experiment=optimizations", *SMALL[:5], "data.batch_size=4",
               "trainer.max_steps=8", "callbacks.heldout.num_images=8", "callbacks.shadow.every_n_steps=4",
               "study=truth,reference,flash,opt_fp8_linear,ulp,eps_1e-4", "study.replicate=0", f"hydra.sweep.dir={study}", "hydra.launcher.n_jobs=1"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((study / "summary.json").read_text())
    rows = {row["role"]: row for row in summary["optimizations"]["rows"]}
    assert rows["flash"]["phase1"]["status"] == "measured" and rows["flash"]["phase1"]["shape"][2] == 64  # a causal 64-token call
    heldout = json.loads((study / "r0" / "flash" / "heldout.json").read_text())
    assert heldout["tokens"] == 8 * 64


def test_the_docs_numbers_of_the_language_model_are_what_the_code_gives():
    import re
    import sys

    from helpers import REPO

    text = (REPO / "docs" / "workloads.md").read_text()
    parameters = sum(p.numel() for p in build_model(lm_config("model.hidden=128", "model.depth=4", "model.heads=4",
                                                                  "model.context_length=256"), Baseline()).parameters())
    assert f"{parameters:,} parameters" in text
    if sys.version_info[:3] == (3, 11, 7):  # the corpus ships with the interpreter: the docs name 3.11.7's
        from pydoc_data.topics import topics

        found = re.search(r"(\d+) topics, ([\d,]+) bytes as numdev joins them \(CPython 3\.11\.7\)", text)
        assert found and int(found.group(1)) == len(topics)
        assert int(found.group(2).replace(",", "")) == len(corpus_bytes("python_topics"))


def test_the_speed_block_is_the_scripts_from_the_committed_benchmark():
    import importlib.util

    from helpers import REPO

    from numdev.report.docblocks import read_block

    spec = importlib.util.spec_from_file_location("bench_lm_step", REPO / "scripts" / "bench_lm_step.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    report = json.loads(script.RESULT.read_text())
    assert {r["variant"] for r in report["rows"]} >= {script.PLAIN, "sdpa_flash", "flash_emulated"}
    assert read_block(script.DOC, script.BLOCK) == script.block_text(report).strip()


def test_compile_compiles_what_each_model_calls_outside_its_forward():
    """optimization=compile's default (submodules: null) is the model's own outside_forward: the DiT's text
    tower, nothing for the language model, whose catalogue therefore runs the role unchanged; a list names them."""
    from numdev.optimizations.compile import Compile

    with torch.device("meta"):
        gpt = build_model(lm_config(), Baseline())
        dit = build_model(compose_train(run_dir="/tmp/unused"), Baseline())
    default = Compile("compile")
    default.check_model(gpt)
    default.check_model(dit)
    assert default._submodules(gpt) == () and default._submodules(dit) == ("text",)
    with pytest.raises(ValueError, match="the model has no submodule 'text': name some of blocks"):
        Compile("compile", submodules=["text"]).check_model(gpt)
