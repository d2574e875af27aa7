"""Images with captions from a folder: a manifest (jsonl or csv), or image + .txt pairs.

    root/manifest.jsonl   {"image": "a/1.png", "caption": "a red circle"} per line
    root/manifest.csv     header with image,caption columns
    root/a/1.png + root/a/1.txt   (no manifest: every image beside a caption file)

Paths in a manifest are relative to root (or absolute). Everything is checked when the data
module is set up, before training starts:
  - a missing image file, a missing .txt, an empty caption: an error naming the file (and line);
  - an image that cannot be decoded: with on_bad_image=skip (default) it is left out and counted
    (a warning names them; `skipped` lists them), with on_bad_image=error it is an error.
Each image is decoded once for that check, so setting up a large folder takes a while; for
scale use the webdataset module. Images are resized (shorter side) and centre-cropped.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from pathlib import Path

from torch.utils.data import Dataset

from numdev.data.captions import MAX_CAPTION_CHARS, CaptionReader, decode_caption, read_caption_file
from numdev.data.datamodule import CaptionDataModule
from numdev.data.images import DECODE_ERRORS, IMAGE_SUFFIXES, check_on_bad_image, decode, to_tensor

log = logging.getLogger(__name__)


class FolderDataset(Dataset):
    def __init__(
        self,
        root: str | Path,
        manifest: str | None = None,
        resolution: int = 32,
        on_bad_image: str = "skip",
        image_key: str = "image",
        caption_key: str = "caption",
        max_caption_chars: int = MAX_CAPTION_CHARS,
    ):
        self.root = Path(root).expanduser()
        if not self.root.is_dir():
            raise FileNotFoundError(f"data.root={str(root)!r} is not a directory: point it at the image folder")
        if resolution <= 0:
            raise ValueError(f"data.resolution={resolution} must be a positive integer")
        self.resolution = resolution
        self.on_bad_image = check_on_bad_image(on_bad_image)
        captions = CaptionReader(max_caption_chars)
        if manifest is not None:
            entries = read_manifest(self._resolve(manifest), image_key, caption_key, captions)
        else:
            entries = read_pairs(self.root, captions)
        entries = [(self._resolve(path), text, where) for path, text, where in entries]
        _check_files(entries)
        self.items, self.skipped = self._decodable(entries)
        if not self.items:
            raise ValueError(f"{self.root}: none of the {len(entries)} images could be decoded")
        self.captions = [text for _, text in self.items]

    def _resolve(self, path: str | Path) -> Path:
        path = Path(path).expanduser()
        return path if path.is_absolute() else self.root / path

    def _decodable(self, entries):
        items, skipped = [], []
        for path, text, where in entries:
            try:
                decode(path)
            except DECODE_ERRORS as error:
                if self.on_bad_image == "error":
                    raise ValueError(
                        f"{where}: cannot decode image {path} ({type(error).__name__}); remove or replace it, "
                        "or set data.on_bad_image=skip"
                    ) from None
                skipped.append(str(path))
                continue
            items.append((path, text))
        if skipped:
            log.warning(
                "skipped %d of %d images that could not be decoded: %s%s",
                len(skipped), len(entries), ", ".join(skipped[:5]), " ..." if len(skipped) > 5 else "",
            )
        return items, skipped

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        path, text = self.items[index]
        try:
            image = decode(path)
        except DECODE_ERRORS as error:  # it decoded at setup: the file changed since
            raise ValueError(f"cannot decode image {path} ({type(error).__name__}); it changed after setup") from None
        return {"image": to_tensor(image, self.resolution), "caption": text}


def read_manifest(path: Path, image_key: str, caption_key: str, captions: CaptionReader | None = None) -> list[tuple[str, str, str]]:
    """(image path, caption, where) per entry of a .jsonl or .csv manifest."""
    captions = captions or CaptionReader()
    if not path.is_file():
        raise FileNotFoundError(f"manifest {path} does not exist: fix data.manifest (relative to data.root)")
    if path.suffix not in (".jsonl", ".csv"):
        raise ValueError(f"manifest {path}: use a .jsonl or .csv file")
    text = decode_caption(path.read_bytes(), f"manifest {path}")  # UTF-8, or an error naming the manifest
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}, line {number}: expected a JSON object with {image_key!r} and {caption_key!r}")
            rows.append((number, row))
    else:
        with io.StringIO(text, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = {image_key, caption_key} - set(reader.fieldnames or [])
            if missing:
                raise ValueError(f"{path}: the header lacks column(s) {', '.join(sorted(missing))}")
            try:
                rows = [(number, row) for number, row in enumerate(reader, start=2)]
            except csv.Error as error:  # e.g. a field over csv's size limit (a huge caption)
                raise ValueError(f"{path}, line {reader.line_num + 1}: not valid CSV ({error})") from None
    entries = []
    for number, row in rows:
        where = f"{path}, line {number}"
        if not row.get(image_key):
            raise ValueError(f"{where}: no {image_key!r} field: give each entry an image path")
        if not isinstance(row[image_key], str):
            raise ValueError(f"{where}: {image_key!r} is {type(row[image_key]).__name__}, not a path string")
        entries.append((row[image_key], captions(row.get(caption_key), where), where))
    if not entries:
        raise ValueError(f"manifest {path} has no entries")
    return entries


def read_pairs(root: Path, captions: CaptionReader | None = None) -> list[tuple[Path, str, str]]:
    """(image, caption, where) for every image under root with a .txt of the same name beside it."""
    captions = captions or CaptionReader()
    images = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not images:
        raise ValueError(
            f"no images ({', '.join(IMAGE_SUFFIXES)}) under {root}: point data.root at them, or give data.manifest"
        )
    entries = []
    for image in images:
        text_file = image.with_suffix(".txt")
        if not text_file.is_file():
            raise FileNotFoundError(f"{image} has no caption file {text_file.name} beside it: add one, or use data.manifest")
        entries.append((image, captions(read_caption_file(text_file), str(text_file)), str(text_file)))
    return entries


def _check_files(entries) -> None:
    missing = [(path, where) for path, _, where in entries if not path.is_file()]
    if missing:
        path, where = missing[0]
        more = f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else ""
        raise FileNotFoundError(f"{where}: image {path} does not exist{more}: fix the manifest or data.root")


class FolderDataModule(CaptionDataModule):
    def __init__(
        self,
        root: str,
        manifest: str | None = None,
        resolution: int = 32,
        on_bad_image: str = "skip",
        image_key: str = "image",
        caption_key: str = "caption",
        max_caption_chars: int = MAX_CAPTION_CHARS,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__(batch_size=batch_size, num_workers=num_workers, seed=seed)
        if root is None:
            raise ValueError("data.root is not set: give the image folder, e.g. data.root=/path/to/images")
        check_on_bad_image(on_bad_image)
        self.dataset_args = dict(
            root=root, manifest=manifest, resolution=resolution, on_bad_image=on_bad_image,
            image_key=image_key, caption_key=caption_key, max_caption_chars=max_caption_chars,
        )

    def build_dataset(self) -> FolderDataset:
        return FolderDataset(**self.dataset_args)

    def caption_vocabulary(self) -> tuple[list[str], str]:
        self.setup()
        return self.dataset.captions, f"the {len(self.dataset.captions)} captions of {self.dataset.root}"

    def preview_captions(self, n: int) -> list[str]:
        self.setup()
        return [self.dataset.captions[i % len(self.dataset)] for i in range(n)]
