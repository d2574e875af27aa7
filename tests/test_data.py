"""Data modules on generated data: shapes, a folder written here, WebDataset shards written here."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from numdev.data import FolderDataModule, ShapesDataModule, ShapesDataset, StepBatchSampler, WebDataModule
from numdev.data.shapes import COLOURS, SHAPES, ShapeSpec, caption, draw, parse_caption
from numdev.data.webdataset import expand_shards, write_shard
from numdev.train.evaluation import score_shapes


def _batches(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def _same(batches_a, batches_b):
    return all(
        torch.equal(a["image"], b["image"]) and a["caption"] == b["caption"] for a, b in zip(batches_a, batches_b)
    )


# --- shapes -------------------------------------------------------------------------------


def test_shapes_are_deterministic_by_seed_at_any_resolution():
    a, b = ShapesDataset(size=50, resolution=24), ShapesDataset(size=50, resolution=24)
    other = ShapesDataset(size=50, resolution=24, content_seed=1)
    assert all(torch.equal(a[i]["image"], b[i]["image"]) and a[i]["caption"] == b[i]["caption"] for i in range(50))
    assert any(a[i]["caption"] != other[i]["caption"] for i in range(50))
    item = a[3]
    assert item["image"].shape == (3, 24, 24) and item["image"].dtype == torch.float32
    assert -1.0 <= float(item["image"].min()) and float(item["image"].max()) <= 1.0
    assert ShapesDataset(size=5, resolution=64)[0]["image"].shape == (3, 64, 64)


def test_shapes_captions_follow_the_grammar_with_several_objects():
    dataset = ShapesDataset(size=40, resolution=32, min_objects=2, max_objects=3)
    for i in range(40):
        objects = parse_caption(dataset[i]["caption"])
        assert objects is not None and 2 <= len(objects) <= 3
        assert len({o.position for o in objects}) == len(objects)  # one object per cell
    spec = ShapeSpec("red", "circle", "large", "top left")
    assert parse_caption(caption([spec])) == [spec]
    assert parse_caption("a photo of a dog") is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"size": 0}, "data.size"), ({"resolution": 4}, "too small"), ({"min_objects": 2, "max_objects": 1}, "min_objects")],
)
def test_shapes_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ShapesDataModule(**kwargs)


def test_the_evaluation_recognises_the_datasets_own_images_and_not_noise():
    dataset = ShapesDataset(size=300, resolution=32)
    images = torch.stack([dataset[i]["image"] for i in range(300)])
    captions = [dataset[i]["caption"] for i in range(300)]
    scores = score_shapes(images, captions)
    assert scores["scored"] == 300
    assert scores["colour_accuracy"] >= 0.99 and scores["shape_accuracy"] >= 0.97 and scores["position_accuracy"] >= 0.99
    noise = score_shapes(torch.rand(300, 3, 32, 32) * 2 - 1, captions)
    assert noise["colour_accuracy"] < 0.35 and noise["shape_accuracy"] < 0.5 and noise["position_accuracy"] < 0.35
    blank = score_shapes(-torch.ones(4, 3, 32, 32), captions[:4])
    assert blank["colour_accuracy"] == 0.0 and blank["samples"][0]["colour"] is None
    wrong = [caption([ShapeSpec(c, s, "large", "center")]) for c in COLOURS for s in SHAPES]
    right = score_shapes(torch.stack([dataset[0]["image"]] * len(wrong)), wrong)
    assert right["colour_accuracy"] == pytest.approx(1 / len(COLOURS))
    assert score_shapes(images[:2], ["a cat", "two dogs"])["scored"] == 0


# --- the order of batches -------------------------------------------------------------------


def test_batch_order_is_seeded_endless_and_resumable():
    sampler = StepBatchSampler(size=10, batch_size=4, seed=3)
    stream = [i for _, batch in zip(range(5), sampler) for i in batch]  # 20 indices = 2 epochs
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))
    assert stream[:10] != stream[10:]  # each epoch reshuffled
    assert [next(iter(StepBatchSampler(10, 4, seed=3, start_batch=3)))] == [stream[12:16]]
    assert StepBatchSampler(10, 4, seed=4).batch(0) != sampler.batch(0)
    halves = [StepBatchSampler(10, 2, seed=3, rank=r, world_size=2).batch(1) for r in (0, 1)]
    assert halves[0] + halves[1] == sampler.batch(1)  # ranks split each global batch


def test_loader_starts_where_a_resumed_trainer_left_off():
    module = ShapesDataModule(resolution=16, size=30, batch_size=4, seed=1)
    full = _batches(module.train_dataloader(), 6)
    module.trainer = SimpleNamespace(global_step=2, accumulate_grad_batches=2, global_rank=0, world_size=1)
    assert _same(_batches(module.train_dataloader(), 2), full[4:6])


def test_workers_change_nothing():
    single = ShapesDataModule(resolution=16, size=30, batch_size=4, seed=1)
    workers = ShapesDataModule(resolution=16, size=30, batch_size=4, seed=1, num_workers=2)
    assert _same(_batches(single.train_dataloader(), 5), _batches(workers.train_dataloader(), 5))


# --- a folder of images --------------------------------------------------------------------


def _png(colour, size=(20, 12)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def folder(tmp_path):
    """Four images in a nested folder, each with a .txt, plus manifests of them."""
    (tmp_path / "sub").mkdir()
    rows = []
    for i, colour in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]):
        name = f"sub/img{i}.png" if i % 2 else f"img{i}.png"
        (tmp_path / name).write_bytes(_png(colour))
        (tmp_path / name).with_suffix(".txt").write_text(f"caption {i}\n")
        rows.append({"image": name, "caption": f"caption {i}"})
    (tmp_path / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "captions.csv").write_text("image,caption\n" + "".join(f"{r['image']},{r['caption']}\n" for r in rows))
    return tmp_path


@pytest.mark.parametrize("manifest", [None, "captions.jsonl", "captions.csv"])
def test_folder_reads_manifests_and_pairs(folder, manifest):
    module = FolderDataModule(root=str(folder), manifest=manifest, resolution=8, batch_size=2)
    module.setup()
    assert sorted(module.dataset.captions) == [f"caption {i}" for i in range(4)]
    batch = next(iter(module.train_dataloader()))
    assert batch["image"].shape == (2, 3, 8, 8) and len(batch["caption"]) == 2
    item = module.dataset[module.dataset.captions.index("caption 0")]
    assert torch.allclose(item["image"][0], torch.ones(8, 8)) and torch.allclose(item["image"][1], -torch.ones(8, 8))
    assert module.preview_captions(6)[4] == module.dataset.captions[0]


def test_folder_skips_and_counts_undecodable_images_or_refuses_them(folder):
    (folder / "broken.png").write_bytes(b"\x89PNG not really")
    (folder / "broken.txt").write_text("a broken image")
    truncated = _png((9, 9, 9), size=(64, 64))
    (folder / "truncated.png").write_bytes(truncated[: len(truncated) // 2])
    (folder / "truncated.txt").write_text("half an image")
    module = FolderDataModule(root=str(folder), resolution=8, batch_size=2)
    module.setup()
    assert len(module.dataset) == 4 and sorted(p.rsplit("/", 1)[-1] for p in module.dataset.skipped) == ["broken.png", "truncated.png"]
    with pytest.raises(ValueError, match=r"cannot decode image .*broken\.png.*on_bad_image=skip"):
        FolderDataModule(root=str(folder), resolution=8, batch_size=2, on_bad_image="error").setup()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: (d / "img0.txt").write_text("  \n"), r"img0\.txt: empty caption"),
        (lambda d: (d / "img0.txt").unlink(), r"img0\.png has no caption file img0\.txt"),
    ],
)
def test_folder_pairs_with_bad_captions(folder, mutate, message):
    mutate(folder)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        FolderDataModule(root=str(folder), resolution=8, batch_size=2).setup()


def test_folder_manifest_errors_name_file_and_line(folder):
    (folder / "sub" / "img1.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"captions\.jsonl, line 2: image .*img1\.png does not exist"):
        FolderDataModule(root=str(folder), manifest="captions.jsonl", batch_size=2).setup()
    (folder / "empty.jsonl").write_text(json.dumps({"image": "img0.png", "caption": ""}) + "\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl, line 1: empty caption"):
        FolderDataModule(root=str(folder), manifest="empty.jsonl", batch_size=2).setup()
    with pytest.raises(FileNotFoundError, match="manifest .*nope.jsonl does not exist"):
        FolderDataModule(root=str(folder), manifest="nope.jsonl", batch_size=2).setup()
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        FolderDataModule(root=str(folder / "nowhere"), batch_size=2).setup()
    with pytest.raises(ValueError, match="data.root is not set"):
        FolderDataModule(root=None)


# --- WebDataset shards ----------------------------------------------------------------------


@pytest.fixture
def shards(tmp_path):
    """Three shards of five 8x8 images whose red channel encodes the sample number."""
    for s in range(3):
        samples = [(f"{s:02d}{i:03d}", _png((s * 5 + i, 0, 0), size=(8, 8)), f"sample {s * 5 + i}") for i in range(5)]
        write_shard(tmp_path / f"shard-{s:03d}.tar", samples)
    return str(tmp_path / "shard-{000..002}.tar")


def test_shards_expand_from_braces_globs_and_lists(shards, tmp_path):
    assert len(expand_shards(shards)) == 3
    assert expand_shards(str(tmp_path / "*.tar")) == expand_shards(shards)
    with pytest.raises(FileNotFoundError, match=r"shard-003\.tar does not exist"):
        expand_shards(str(tmp_path / "shard-{000..003}.tar"))


def _numbers(batches):
    return [int(c.split()[1]) for b in batches for c in b["caption"]]


def test_webdataset_stream_is_seeded_endless_and_resumable(shards):
    def module(**kwargs):
        return WebDataModule(shards=shards, resolution=8, batch_size=4, shuffle_buffer=4, seed=0, **kwargs)

    full = _batches(module().train_dataloader(), 8)  # 32 samples: more than the 15 there are
    numbers = _numbers(full)
    assert sorted(numbers[:15]) == list(range(15))  # every sample once per epoch
    assert numbers == _numbers(_batches(module().train_dataloader(), 8))
    assert numbers != _numbers(_batches(WebDataModule(shards=shards, resolution=8, batch_size=4, seed=1).train_dataloader(), 8))
    resumed = module()
    resumed.trainer = SimpleNamespace(global_step=5, accumulate_grad_batches=1, global_rank=0, world_size=1)
    assert _same(_batches(resumed.train_dataloader(), 3), full[5:8])
    batch = full[0]
    assert batch["image"].shape == (4, 3, 8, 8)
    assert module().preview_captions(2) == ["sample 0", "sample 1"]


def test_webdataset_resume_holds_with_workers(shards):
    def module():
        return WebDataModule(shards=shards, resolution=8, batch_size=2, shuffle_buffer=3, seed=0, num_workers=2)

    full = _batches(module().train_dataloader(), 7)
    resumed = module()
    resumed.trainer = SimpleNamespace(global_step=3, accumulate_grad_batches=1, global_rank=0, world_size=1)
    assert _same(_batches(resumed.train_dataloader(), 4), full[3:7])


def test_webdataset_bad_samples(tmp_path):
    good = _png((1, 2, 3), size=(8, 8))
    write_shard(tmp_path / "bad-image.tar", [("a", b"garbage", "x"), ("b", good, "kept")])
    module = WebDataModule(shards=str(tmp_path / "bad-image.tar"), resolution=8, batch_size=2, shuffle_buffer=0)
    assert next(iter(module.train_dataloader()))["caption"] == ["kept", "kept"]  # the bad one skipped
    strict = WebDataModule(shards=str(tmp_path / "bad-image.tar"), resolution=8, batch_size=2, on_bad_image="error")
    with pytest.raises(ValueError, match=r"sample 'a': cannot decode the image"):
        next(iter(strict.train_dataloader()))
    write_shard(tmp_path / "empty-caption.tar", [("a", good, "  ")])
    with pytest.raises(ValueError, match=r"empty-caption\.tar, sample 'a': empty caption"):
        next(iter(WebDataModule(shards=str(tmp_path / "empty-caption.tar"), batch_size=1).train_dataloader()))
    with pytest.raises(ValueError, match="data.shards is not set"):
        WebDataModule(shards=None)


def test_drawing_is_antialiased_and_centred():
    image = np.asarray(draw([ShapeSpec("red", "square", "large", "center")], 32))
    assert image[16, 16].tolist() == list(COLOURS["red"]) and image[0, 0].tolist() == [0, 0, 0]
    assert len(np.unique(image[:, :, 0])) > 2  # box-filtered edges
