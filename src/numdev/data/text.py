"""Real text, offline: the Python Language Reference's help topics, as bytes, for the language models.

The corpus is `pydoc_data.topics`, the text behind `help("if")` that ships inside every CPython
installation (the Python Software Foundation's documentation, PSF License Version 2; 79 topics,
466,273 bytes joined, UTF-8, in CPython 3.11.7): English prose with grammar rules and code examples,
written by nobody in this project and read without a download. Topics are joined in sorted order
with a blank line between; the last `heldout_fraction` of the bytes is held out, the rest trains.
Its sha256 goes into the run's record, so two runs on different interpreters (whose topics differ)
are told apart.

Tokens are the UTF-8 bytes (a vocabulary of 256, numdev.models.gpt). A training item is the window
of sequence_length + 1 bytes starting at item x stride: inputs are its first sequence_length
bytes, targets the next byte of each. Batches are {"tokens": (B, sequence_length + 1) int64}.
"""

from __future__ import annotations

import hashlib
from functools import cached_property

import torch
from torch.utils.data import Dataset

from numdev.data.datamodule import CaptionDataModule

CORPORA = ("python_topics",)
PROMPT_BYTES = 48  # the sample prompts' length: the opening bytes of held-out windows


def corpus_bytes(name: str) -> bytes:
    """The named corpus as bytes; a one-line error for an unknown name or an empty corpus."""
    if name not in CORPORA:
        raise ValueError(f"data.corpus={name!r}: use one of {', '.join(CORPORA)} (numdev.data.text)")
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise ValueError("data.corpus=python_topics: this Python has no pydoc_data (a stripped interpreter): install the full "
                         "standard library (Debian: python3-doc is not needed, libpython3-stdlib is)") from None
    text = "\n\n".join(topics[key] for key in sorted(topics)).encode("utf-8")
    if len(text) < 10_000:
        raise ValueError(f"data.corpus=python_topics holds only {len(text)} bytes in this interpreter: too little text to train on")
    return text


class Windows(Dataset):
    """Overlapping windows of length + 1 tokens over `tokens`, every `stride` tokens."""

    def __init__(self, tokens: torch.Tensor, length: int, stride: int):
        self.tokens, self.length, self.stride = tokens, length, stride
        self.count = (len(tokens) - length - 1) // stride + 1
        if self.count <= 0:
            raise ValueError(f"data.sequence_length={length} is longer than the text ({len(tokens)} bytes): shorten it")

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.count:
            raise IndexError(index)
        start = index * self.stride
        return {"tokens": self.tokens[start : start + self.length + 1]}


class TextDataModule(CaptionDataModule):
    def __init__(self, corpus: str = "python_topics", sequence_length: int = 256, stride: int = 64,
                 heldout_fraction: float = 0.1, batch_size: int = 16, num_workers: int = 0, seed: int = 0):
        super().__init__(batch_size, num_workers, seed)
        for key, value in (("sequence_length", sequence_length), ("stride", stride)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"data.{key}={value!r} must be a positive integer")
        if isinstance(heldout_fraction, bool) or not isinstance(heldout_fraction, (int, float)) or not 0 < heldout_fraction < 0.5:
            raise ValueError(f"data.heldout_fraction={heldout_fraction!r} must be a number between 0 and 0.5")
        if corpus not in CORPORA:  # refused now, not at setup
            raise ValueError(f"data.corpus={corpus!r}: use one of {', '.join(CORPORA)} (numdev.data.text)")
        self.corpus, self.sequence_length, self.stride = corpus, sequence_length, stride
        self.heldout_fraction = float(heldout_fraction)

    @cached_property
    def text(self) -> bytes:
        return corpus_bytes(self.corpus)

    @cached_property
    def split(self) -> int:
        return int(len(self.text) * (1 - self.heldout_fraction))

    def _tokens(self, part: slice) -> torch.Tensor:
        return torch.frombuffer(bytearray(self.text[part]), dtype=torch.uint8).long()

    def build_dataset(self) -> Windows:
        return Windows(self._tokens(slice(0, self.split)), self.sequence_length, self.stride)

    def heldout_dataset(self, n: int) -> Windows:
        """The first n non-overlapping windows of the held-out text (fewer if it is shorter): training never reads them."""
        windows = Windows(self._tokens(slice(self.split, None)), self.sequence_length, self.sequence_length)
        if n > len(windows):
            raise ValueError(f"callbacks.heldout.num_images={n}: the held-out text has {len(windows)} windows of "
                             f"data.sequence_length={self.sequence_length}: ask for at most that many")
        windows.count = n
        return windows

    def preview_captions(self, n: int) -> list[str]:
        """n prompts to continue (the same at every logging step): the opening bytes of held-out windows."""
        windows = Windows(self._tokens(slice(self.split, None)), PROMPT_BYTES, self.sequence_length)
        return [bytes(windows[i % len(windows)]["tokens"][:PROMPT_BYTES].tolist()).decode("utf-8", "ignore") for i in range(n)]

    def describe(self) -> dict:
        """What the run trained on: the corpus, its size and checksum, the split (run.json)."""
        return {"corpus": self.corpus, "bytes": len(self.text), "sha256": hashlib.sha256(self.text).hexdigest(),
                "heldout_from_byte": self.split}
