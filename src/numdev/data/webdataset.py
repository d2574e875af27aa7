"""Image + caption pairs streamed from tar shards in the WebDataset layout, for data at scale.

A shard is a plain tar file; the files of one sample share a key (the path up to the first dot
of the file name) and sit next to each other: 000001.jpg + 000001.txt. Shards are given as a
list, a glob, or brace notation: data.shards='/data/shard-{000000..000099}.tar'.

Reading is done here with the standard library (no extra dependency) so the order is exactly
reproducible: every "consumer" (one per loader worker and device) owns a fixed share of the
shards, reshuffled per epoch from (seed, epoch), and passes its samples through a seeded shuffle
buffer; the stream is endless and training length is trainer.max_steps. The loader takes
batches from its workers in turn, so batch b comes from worker b mod W; a resumed run makes each
worker skip its share of the batches already trained on, so it continues the same stream (by
reading past them: resuming late into a big epoch costs a re-read). The order depends on the
number of workers and devices: keep them when resuming.

Bad input: a sample without a caption file, with an empty caption or one that is not UTF-8 is an
error naming shard and key; an undecodable image is skipped with a warning naming it
(on_bad_image=skip; warned in the first epoch only) or an error (on_bad_image=error). Reading
always terminates: a shard that yields no usable sample (no samples at all, or only undecodable
images) is an error naming it, and a shard without the tar end-of-archive marker (truncated,
e.g. by a copy that did not finish) is an error naming it, whatever it held before the cut.
"""

from __future__ import annotations

import glob
import io
import logging
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from numdev.data.captions import MAX_CAPTION_CHARS, CaptionReader, decode_caption
from numdev.data.datamodule import CaptionDataModule, consumed_batches, rank_and_world
from numdev.data.images import DECODE_ERRORS, check_on_bad_image, decode, to_tensor
from numdev.runs.atomic import write_bytes

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "gif", "pgm", "ppm")
_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_shards(spec) -> list[str]:
    """Shard paths from a list, a glob ('*.tar') or brace ranges ('shard-{000..009}.tar')."""
    specs = [spec] if isinstance(spec, str) else list(spec or [])
    paths = []
    for item in specs:
        for name in _expand_braces(str(item)):
            matches = sorted(glob.glob(name)) if glob.has_magic(name) else [name]
            paths.extend(matches)
    if not paths:
        raise ValueError(f"data.shards={spec!r} names no shard files: give tar paths, a glob or a {{000..009}} range")
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise FileNotFoundError(f"shard {missing[0]} does not exist{more}: fix data.shards")
    for path in paths:
        check_shard_file(path)
    return paths


COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def check_shard_file(path: str) -> None:
    """A cheap check of a whole shard (two reads): not empty, not compressed, a whole number of tar
    blocks ending in a zero block. A shard cut short fails here, before training, in almost every
    case; read_shard checks the end-of-archive marker exactly when it reaches it."""
    size = Path(path).stat().st_size
    if size == 0:
        raise ValueError(f"shard {path} is empty (0 bytes): replace it or leave it out")
    with open(path, "rb") as handle:
        head = handle.read(TAR_BLOCK)
        handle.seek(max(0, size - TAR_BLOCK))
        tail = handle.read(TAR_BLOCK)
    kind = next((name for magic, name in COMPRESSED.items() if head.startswith(magic)), None)
    if kind is not None:
        raise ValueError(f"shard {path} is {kind}-compressed: numdev reads plain tar shards; decompress it")
    if size % TAR_BLOCK or tail.count(0) != TAR_BLOCK:
        raise ValueError(
            f"shard {path} is truncated or not a tar file ({size} bytes, not ending in the tar end-of-archive "
            "marker): it was cut short, e.g. by a copy that did not finish; copy it again or leave it out"
        )
    if head.count(0) == TAR_BLOCK:  # the end-of-archive marker comes first
        raise ValueError(f"shard {path} holds no samples (an empty tar archive): replace it or leave it out")


def _expand_braces(name: str) -> list[str]:
    match = _BRACE.search(name)
    if match is None:
        return [name]
    first, last = match[1], match[2]
    width = len(first)
    out = []
    for number in range(int(first), int(last) + 1):
        out.extend(_expand_braces(name[: match.start()] + str(number).zfill(width) + name[match.end() :]))
    return out


def read_shard(path: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {extension: bytes}) per sample, in the tar's order. A shard that is not a tar, or is
    truncated (cut inside a file, or without the end-of-archive marker), is a ValueError naming it;
    the samples before the cut are yielded first (a stream fails at the cut, not before)."""
    try:
        with tarfile.open(path, "r:") as tar:
            key, files = None, {}
            for member in tar:
                if not member.isfile():
                    continue
                directory, _, base = member.name.rpartition("/")
                stem, dot, extension = base.partition(".")
                if not dot:
                    continue
                member_key = f"{directory}/{stem}" if directory else stem
                if member_key != key:
                    if key is not None:
                        yield key, files
                    key, files = member_key, {}
                files[extension.lower()] = tar.extractfile(member).read()
            if key is not None:
                _check_end_marker(path, tar.offset)
                yield key, files
            else:
                _check_end_marker(path, tar.offset)
    except tarfile.TarError as error:
        raise ValueError(f"shard {path} is not a readable tar file ({error}): replace it or leave it out") from None


TAR_BLOCK = 512


def _check_end_marker(path: str, offset: int) -> None:
    """A whole tar ends with zero blocks where tarfile stopped reading; a shard cut at a file boundary
    (or inside a header) just stops, and tarfile takes that for the end."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        tail = handle.read(TAR_BLOCK)
    if len(tail) < TAR_BLOCK or tail.count(0) != TAR_BLOCK:
        raise ValueError(
            f"shard {path} is truncated (no tar end-of-archive marker after byte {offset}): "
            "it was cut short, e.g. by a copy that did not finish; copy it again or leave it out"
        )


class ShardStream(IterableDataset):
    """Endless {"image", "caption"} samples of this worker's share of the shards."""

    def __init__(
        self,
        shards: list[str],
        resolution: int,
        seed: int,
        batch_size: int,
        start_batch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shuffle_buffer: int = 1000,
        caption_extension: str = "txt",
        on_bad_image: str = "skip",
        max_caption_chars: int = MAX_CAPTION_CHARS,
    ):
        self.shards, self.resolution, self.seed = shards, resolution, seed
        self.captions = CaptionReader(max_caption_chars)
        self.batch_size, self.start_batch = batch_size, start_batch
        self.rank, self.world_size = rank, world_size
        self.shuffle_buffer, self.caption_extension = shuffle_buffer, caption_extension
        self.on_bad_image = check_on_bad_image(on_bad_image)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # The loader asks worker 0 first; in the uninterrupted stream, batch start_batch came from
        # worker start_batch mod W. So this worker plays the part of that "logical" worker.
        logical = (worker + self.start_batch) % workers
        consumer, consumers = self.rank * workers + logical, self.world_size * workers
        if len(self.shards) < consumers:
            raise ValueError(
                f"{len(self.shards)} shard(s) for {consumers} readers (workers x devices): "
                "give at least as many shards, or lower data.num_workers"
            )
        skip = len(range(logical, self.start_batch, workers)) * self.batch_size  # its batches already trained on
        stream = self._samples(consumer, consumers)
        for _ in range(skip):
            next(stream)
        yield from stream

    def _samples(self, consumer: int, consumers: int):
        epoch = 0
        while True:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.shards))
            mine = [self.shards[i] for i in order[consumer::consumers]]
            rng = np.random.default_rng([self.seed, epoch, consumer])
            yield from _shuffled(self._decoded(mine, epoch), self.shuffle_buffer, rng)
            epoch += 1

    def _decoded(self, shards: list[str], epoch: int = 0):
        for shard in shards:
            seen = usable = 0
            for key, files in read_shard(shard):
                seen += 1
                sample = self._sample(shard, key, files, warn=epoch == 0)
                if sample is not None:
                    usable += 1
                    yield sample
            if not usable:  # without this, an endless stream over such shards would never yield
                if not seen:
                    raise ValueError(f"shard {shard} holds no samples (no files named <key>.<extension>): replace it or leave it out")
                raise ValueError(
                    f"shard {shard}: none of its {seen} sample(s) has an image that can be decoded: replace it or leave it out"
                )

    def _sample(self, shard: str, key: str, files: dict[str, bytes], warn: bool = True) -> dict | None:
        where = f"shard {shard}, sample {key!r}"
        if self.caption_extension not in files:
            raise ValueError(f"{where}: no .{self.caption_extension} caption file: add one to every sample")
        text = self.captions(decode_caption(files[self.caption_extension], f"{where}, .{self.caption_extension}"), where)
        extension = next((e for e in IMAGE_EXTENSIONS if e in files), None)
        if extension is None:
            raise ValueError(f"{where}: no image ({', '.join(IMAGE_EXTENSIONS)})")
        try:
            image = decode(files[extension])
        except DECODE_ERRORS as error:
            if self.on_bad_image == "error":
                raise ValueError(f"{where}: cannot decode the image ({type(error).__name__}); set data.on_bad_image=skip to skip it") from None
            if warn:  # once per sample, not once per epoch
                log.warning("%s: skipped, the image cannot be decoded (%s)", where, type(error).__name__)
            return None
        return {"image": to_tensor(image, self.resolution), "caption": text}


def _shuffled(samples, buffer_size: int, rng: np.random.Generator):
    """Reservoir-style shuffle buffer: emit a random element once the buffer is full."""
    if buffer_size <= 1:
        yield from samples
        return
    buffer = []
    for sample in samples:
        buffer.append(sample)
        if len(buffer) >= buffer_size:
            yield buffer.pop(int(rng.integers(len(buffer))))
    while buffer:
        yield buffer.pop(int(rng.integers(len(buffer))))


class WebDataModule(CaptionDataModule):
    def __init__(
        self,
        shards,
        resolution: int = 32,
        shuffle_buffer: int = 1000,
        caption_extension: str = "txt",
        on_bad_image: str = "skip",
        max_caption_chars: int = MAX_CAPTION_CHARS,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__(batch_size=batch_size, num_workers=num_workers, seed=seed)
        if shards is None:
            raise ValueError("data.shards is not set: give tar shards, e.g. data.shards='/data/shard-{000..009}.tar'")
        if resolution <= 0:
            raise ValueError(f"data.resolution={resolution} must be a positive integer")
        check_on_bad_image(on_bad_image)
        self.shards_spec, self.resolution, self.shuffle_buffer = shards, resolution, shuffle_buffer
        self.caption_extension, self.on_bad_image = caption_extension, on_bad_image
        self.max_caption_chars = CaptionReader(max_caption_chars).max_chars  # checked here, before any shard is read
        self.shards: list[str] | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.shards is None:
            self.shards = expand_shards(self.shards_spec)

    def stream(self, start_batch: int = 0, rank: int = 0, world_size: int = 1) -> ShardStream:
        self.setup()
        return ShardStream(
            self.shards, self.resolution, self.seed, self.batch_size, start_batch, rank, world_size,
            self.shuffle_buffer, self.caption_extension, self.on_bad_image, self.max_caption_chars,
        )

    def train_dataloader(self) -> DataLoader:
        rank, world = rank_and_world(self.trainer)
        stream = self.stream(consumed_batches(self.trainer), rank, world)
        return DataLoader(stream, batch_size=self.batch_size, num_workers=self.num_workers)

    def preview_captions(self, n: int) -> list[str]:
        """The first n captions of the first shard, in file order (cycled if it has fewer)."""
        self.setup()
        captions = []
        for key, files in read_shard(self.shards[0]):
            where = f"shard {self.shards[0]}, sample {key!r}, .{self.caption_extension}"
            text = decode_caption(files.get(self.caption_extension, b""), where).strip()
            if text:
                captions.append(text[: self.max_caption_chars])
            if len(captions) == n:
                break
        if not captions:
            raise ValueError(f"shard {self.shards[0]} has no captions")
        return [captions[i % len(captions)] for i in range(n)]


def write_shard(path: str | Path, samples: list[tuple[str, bytes, str]], image_extension: str = "png") -> None:
    """Write (key, image bytes, caption) samples as a WebDataset tar shard, atomically."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for key, image, text in samples:
            for extension, data in ((image_extension, image), ("txt", text.encode("utf-8"))):
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    write_bytes(path, buffer.getvalue())
