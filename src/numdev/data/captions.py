"""Captions as read from user data: stripped, never empty, and bounded in length.

A caption longer than `max_chars` (data.max_caption_chars) is cut at load: the text tower reads
at most its context length of tokens anyway, and an unbounded caption (a 10 MB .txt file) would
cost seconds per batch to tokenise and minutes to draw into sample grids. The first cut caption is
named in one warning; the total is in `cut`.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

MAX_CAPTION_CHARS = 1000


def decode_caption(data: bytes, where: str) -> str:
    """A caption file's bytes as text: UTF-8 (a leading byte-order mark dropped). Anything else is a
    one-line error naming `where` and the encoding, never a silent replacement of the bad bytes."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{where}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}): "
            "re-encode it as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None


def read_caption_file(path) -> str:
    """The text of a caption file, decoded by decode_caption (the error names the file)."""
    return decode_caption(Path(path).read_bytes(), str(path))


class CaptionReader:
    def __init__(self, max_chars: int = MAX_CAPTION_CHARS):
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars <= 0:
            raise ValueError(f"data.max_caption_chars={max_chars!r} must be a positive integer")
        self.max_chars = max_chars
        self.cut = 0

    def __call__(self, text, where: str) -> str:
        """`text` stripped and bounded; `where` (the file, or shard and sample) names it in messages."""
        if text is not None and not isinstance(text, str):
            raise ValueError(f"{where}: the caption is {type(text).__name__} {str(text)[:40]!r}, not text: give every image a caption string")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}: empty caption: give every image a non-empty caption")
        text = text.strip()
        if len(text) > self.max_chars:
            if not self.cut:
                log.warning(
                    "%s: caption of %d characters cut to %d (data.max_caption_chars); further long captions are cut "
                    "without a warning", where, len(text), self.max_chars,
                )
            self.cut += 1
            text = text[: self.max_chars]
        return text
