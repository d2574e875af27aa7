"""Data modules on generated data: shapes, a folder written here, WebDataset shards written here."""

from __future__ import annotations

import codecs
import contextlib
import gzip
import io
import json
import signal
import tarfile
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import png_bytes, tar_bytes
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


_png = png_bytes


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


# --- data that cannot be read (issue 23, class 1): every reader terminates, names the file ------


@contextlib.contextmanager
def _bounded(seconds: int = 60):
    """Fail (instead of hanging the suite) if the block runs longer than `seconds`: SIGALRM, no polling."""

    def expired(signum, frame):
        raise AssertionError(f"still running after {seconds} s: the reader does not terminate")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _encoded(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


GREY = 100  # an 8-bit grey level; every mode below encodes this grey (or a known colour)
_RAMP = np.arange(64, dtype=np.float64).reshape(8, 8) / 63  # 0..1


def _mode_cases():
    rgb = Image.new("RGB", (8, 8), (200, 100, 50))
    cases = {
        "I;16-png": (Image.fromarray((_RAMP * 65535).round().astype(np.uint16)), "PNG", _RAMP * 255),
        "I;16-tiff": (Image.fromarray((_RAMP * 65535).round().astype(np.uint16)), "TIFF", _RAMP * 255),
        "I;16-pgm": (Image.fromarray((_RAMP * 65535).round().astype(np.uint16)), "PPM", _RAMP * 255),
        "I;16-dark": (Image.fromarray(np.full((8, 8), 257 * GREY, np.uint16)), "PNG", np.full((8, 8), GREY)),
        "I-tiff": (Image.fromarray((_RAMP * 65535).round().astype(np.int32)), "TIFF", _RAMP * 255),
        "F-unit": (Image.fromarray(_RAMP.astype(np.float32)), "TIFF", _RAMP * 255),
        "F-255": (Image.fromarray((_RAMP * 255).astype(np.float32)), "TIFF", _RAMP * 255),
        "L-png": (Image.fromarray((_RAMP * 255).round().astype(np.uint8)), "PNG", _RAMP * 255),
        "1-png": (Image.new("1", (8, 8), 1), "PNG", np.full((8, 8), 255)),
        "P-png": (rgb.convert("P", palette=Image.Palette.ADAPTIVE), "PNG", None),
        "P-gif": (rgb.convert("P", palette=Image.Palette.ADAPTIVE), "GIF", None),
        "CMYK-jpeg": (rgb.convert("CMYK"), "JPEG", None),
        "CMYK-tiff": (rgb.convert("CMYK"), "TIFF", None),
        "RGBA-opaque": (rgb.convert("RGBA"), "PNG", None),
        "LA-opaque": (Image.new("LA", (8, 8), (GREY, 255)), "PNG", np.full((8, 8), GREY)),
        "RGB-16bit-png": (rgb, "PNG", None),
        "YCbCr-jpeg": (rgb, "JPEG", None),
    }
    return cases


MODE_CASES = _mode_cases()


@pytest.mark.parametrize("name", list(MODE_CASES))
def test_every_image_mode_is_converted_with_its_real_range(name):
    from numdev.data.images import decode

    image, fmt, grey = MODE_CASES[name]
    data = _encoded(image, fmt)
    decoded = np.asarray(decode(data), dtype=np.float64)
    assert decoded.shape == (8, 8, 3)
    if grey is None:  # a colour image: close to the colour it was made from
        assert np.abs(decoded - np.array([200, 100, 50])).max() <= 12, decoded[0, 0]
    else:
        for channel in range(3):
            assert np.abs(decoded[..., channel] - grey).max() <= 1.0, (decoded[..., 0], grey)
    assert decoded.min() < 255 or name == "1-png"  # never washed out to pure white


@pytest.mark.parametrize(
    ("mode", "alpha_pixel", "expected"),
    [("RGBA", (0, 0, 0, 0), (255, 255, 255)), ("RGBA", (10, 20, 30, 255), (10, 20, 30)),
     ("LA", (0, 0), (255, 255, 255)), ("LA", (40, 255), (40, 40, 40)), ("RGBA", (0, 0, 0, 128), (127, 127, 127))],
)
def test_transparency_is_composited_over_white(mode, alpha_pixel, expected):
    from numdev.data.images import decode

    decoded = np.asarray(decode(_encoded(Image.new(mode, (4, 4), alpha_pixel), "PNG")))
    assert np.abs(decoded[0, 0].astype(int) - np.array(expected)).max() <= 1, decoded[0, 0]


@pytest.mark.parametrize(
    ("array", "message"),
    [(np.full((4, 4), -1.0, np.float32), "negative values"), (np.full((4, 4), 1000.0, np.float32), "outside"),
     (np.full((4, 4), np.nan, np.float32), "NaN"), (np.full((4, 4), 2**20, np.int32), "beyond 16 bits")],
)
def test_wide_images_without_a_range_are_refused(array, message):
    from numdev.data.images import decode

    with pytest.raises(ValueError, match=message):
        decode(_encoded(Image.fromarray(array), "TIFF"))


def test_a_16_bit_png_trains_as_its_8_bit_equivalent(tmp_path):
    ramp16 = Image.fromarray((_RAMP * 65535).round().astype(np.uint16))
    ramp8 = Image.fromarray((_RAMP * 255).round().astype(np.uint8))
    for name, image in (("wide", ramp16), ("narrow", ramp8)):
        (tmp_path / name).mkdir()
        image.save(tmp_path / name / "0.png")
        (tmp_path / name / "0.txt").write_text("a ramp")
    items = [FolderDataModule(root=str(tmp_path / n), resolution=8, batch_size=1) for n in ("wide", "narrow")]
    for module in items:
        module.setup()
    wide, narrow = (m.dataset[0]["image"] for m in items)
    assert torch.allclose(wide, narrow, atol=1 / 127.5)
    assert float(wide.max()) < 1.0 or float(wide.min()) < 0.0  # not every pixel 1.0


_tar = tar_bytes


def _members_end(data: bytes, count: int) -> int:
    """The byte offset where member `count` (0-based) starts in tar `data`."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getmembers()[count].offset


def _good_shard(n: int = 8) -> bytes:
    return _tar([m for i in range(n) for m in ((f"{i:03d}.png", _png((i, 0, 0), size=(8, 8))), (f"{i:03d}.txt", f"sample {i}".encode()))])


GOOD = _png((1, 2, 3), size=(8, 8))
BAD_SHARDS = {  # name -> (shard bytes, what the error says)
    "zero-bytes": (b"", "is empty (0 bytes)"),
    "empty-archive": (_tar([]), "holds no samples"),
    "no-sample-names": (_tar([("README", b"no dot"), ("LICENSE", b"none")]), "holds no samples"),
    "only-directories-and-dotless": (_tar([("notes", b"x")]), "holds no samples"),
    "all-garbage-images": (_tar([m for i in range(3) for m in ((f"{i}.png", b"garbage"), (f"{i}.txt", b"c"))]),
                           "none of its 3 sample(s) has an image that can be decoded"),
    "all-empty-images": (_tar([m for i in range(2) for m in ((f"{i}.jpg", b""), (f"{i}.txt", b"c"))]),
                         "none of its 2 sample(s) has an image that can be decoded"),
    "all-half-images": (_tar([m for i in range(2) for m in ((f"{i}.png", GOOD[: len(GOOD) // 2]), (f"{i}.txt", b"c"))]),
                        "none of its 2 sample(s) has an image that can be decoded"),
    "truncated-at-a-member": (_good_shard()[: _members_end(_good_shard(), 10)], "is truncated"),
    "truncated-at-a-sample": (_good_shard()[: _members_end(_good_shard(), 12)], "is truncated"),
    "truncated-inside-a-member": (_good_shard()[: _members_end(_good_shard(), 10) + 700], "is truncated"),
    "truncated-inside-a-header": (_good_shard()[: _members_end(_good_shard(), 10) + 100], "is truncated"),
    "marker-cut-off": (_good_shard()[: _members_end(_good_shard(), 15) + 1024], "is truncated"),
    "gzip-compressed": (gzip.compress(_good_shard()), "is gzip-compressed"),
    "not-a-tar": (b"hello world\n" * 100, "truncated or not a tar file"),
    "latin1-caption": (_tar([("a.png", GOOD), ("a.txt", "café".encode("latin-1"))]), "sample 'a', .txt: not UTF-8 text (byte 0xe9"),
    "utf16-caption": (_tar([("a.png", GOOD), ("a.txt", "a cat".encode("utf-16"))]), "sample 'a', .txt: not UTF-8 text (byte 0xff"),
    "cp1252-caption": (_tar([("a.png", GOOD), ("a.txt", "a “cat”".encode("cp1252"))]), "sample 'a', .txt: not UTF-8 text (byte 0x93"),
    "no-caption": (_tar([("a.png", GOOD)]), "sample 'a': no .txt caption file"),
}


@pytest.mark.parametrize("name", list(BAD_SHARDS))
def test_a_shard_that_cannot_be_read_is_one_error_naming_it(name, tmp_path):
    data, message = BAD_SHARDS[name]
    good = tmp_path / "good.tar"
    good.write_bytes(_good_shard(4))
    bad = tmp_path / f"{name}.tar"
    bad.write_bytes(data)
    with _bounded(60), pytest.raises(ValueError) as raised:  # alone, or after a good shard: never a hang
        module = WebDataModule(shards=[str(good), str(bad)], resolution=8, batch_size=2, shuffle_buffer=0)
        for _, _ in zip(range(1000), module.train_dataloader()):
            pass
    assert str(bad) in str(raised.value) and message in str(raised.value), raised.value
    assert "\n" not in str(raised.value)


def test_a_bad_shard_in_a_worker_is_still_one_line(tmp_path):
    from numdev.cli.errors import one_line

    (tmp_path / "bad.tar").write_bytes(BAD_SHARDS["all-garbage-images"][0])
    module = WebDataModule(shards=str(tmp_path / "bad.tar"), resolution=8, batch_size=2, num_workers=1)
    with _bounded(120), pytest.raises(ValueError) as raised:
        next(iter(module.train_dataloader()))
    line = one_line(raised.value)
    assert line.startswith(f"shard {tmp_path / 'bad.tar'}: none of its 3") and "Traceback" not in line, line


def test_undecodable_images_are_warned_about_once_not_every_epoch(tmp_path, monkeypatch):
    import numdev.data.webdataset as webdataset

    warned = []  # the module's logger, whatever logging configuration an earlier test left behind
    monkeypatch.setattr(webdataset.log, "warning", lambda msg, *args: warned.append(msg % args))
    write_shard(tmp_path / "s.tar", [("a", b"garbage", "x"), ("b", GOOD, "kept")])
    module = WebDataModule(shards=str(tmp_path / "s.tar"), resolution=8, batch_size=1, shuffle_buffer=0)
    with _bounded(60):
        batches = _batches(module.train_dataloader(), 20)  # 20 epochs of one usable sample
    assert {c for b in batches for c in b["caption"]} == {"kept"}
    assert len([w for w in warned if "sample 'a'" in w]) == 1


@pytest.mark.parametrize(
    ("encoding", "text", "byte"),
    [("latin-1", "café au lait", "0xe9"), ("utf-16", "a cat", "0xff"), ("cp1252", "a “cat”", "0x93"), ("shift_jis", "猫", "0x94")],
)
def test_non_utf8_captions_name_their_file(folder, encoding, text, byte):
    (folder / "img0.txt").write_bytes(text.encode(encoding))
    with pytest.raises(ValueError, match=rf"img0\.txt: not UTF-8 text \(byte {byte}"):
        FolderDataModule(root=str(folder), resolution=8, batch_size=2).setup()
    manifest = folder / "latin.jsonl"
    manifest.write_bytes(json.dumps({"image": "img0.png", "caption": "x"}).encode() + b"\n" + text.encode(encoding) + b"\n")
    with pytest.raises(ValueError, match=rf"manifest .*latin\.jsonl: not UTF-8 text \(byte {byte}"):
        FolderDataModule(root=str(folder), manifest="latin.jsonl", resolution=8, batch_size=2).setup()
    (folder / "img0.txt").write_bytes(codecs.BOM_UTF8 + b"a cat")  # a BOM is UTF-8: dropped
    module = FolderDataModule(root=str(folder), resolution=8, batch_size=2)
    module.setup()
    assert "a cat" in module.dataset.captions


@pytest.mark.parametrize(("value", "message"), [(["a.png"], "'image' is list, not a path string"), (7, "'image' is int"),
                                                 ({"x": 1}, "'image' is dict")])
def test_manifest_image_fields_that_are_not_paths(folder, value, message):
    (folder / "m.jsonl").write_text(json.dumps({"image": value, "caption": "a"}) + "\n")
    with pytest.raises(ValueError, match=message):
        FolderDataModule(root=str(folder), manifest="m.jsonl", resolution=8, batch_size=2).setup()


@pytest.mark.parametrize("caption", [7, ["a"], {"a": 1}, True])
def test_manifest_captions_that_are_not_text(folder, caption):
    (folder / "m.jsonl").write_text(json.dumps({"image": "img0.png", "caption": caption}) + "\n")
    with pytest.raises(ValueError, match=r"m\.jsonl, line 1: the caption is .*not text"):
        FolderDataModule(root=str(folder), manifest="m.jsonl", resolution=8, batch_size=2).setup()
