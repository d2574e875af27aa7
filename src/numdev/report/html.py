"""Render report sections into one self-contained HTML page (figures embedded as data URIs).

What a reader meets, top to bottom: the answer (when the report has a harm study: its sentence and a
small table, numdev.report.harm.answer_lead), what the symbols mean, the provenance header (folded),
a table of contents (each section with its verdict), then one section per claim: its title with the verdict (symbol and status, once), the
paper's claim beside our measurement, how the verdict was reached (folded), the tables (long ones
folded, the rows that decide shown), the figure, the command that reruns it and links to the files.
Figures are embedded downscaled for the page (PAGE_PX wide) and link to the full-size PNG beside it.
"""

from __future__ import annotations

import base64
import html
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from numdev.runs.provenance import machine_line_or_unknown

# Stable HTML ids of the report's study sections (Section.anchor): scripts/screenshot_report.py and
# tests/test_report.py look for them. The provenance header's id is numdev.report.provenance.ANCHOR.
LOSS_CURVES = "loss-curves"  # the study's training loss curves, side by side
SAMPLES = "samples"  # the study's sample grids with their captions
CONTENTS = "contents"  # the table of contents
ANSWER = "the-answer"  # the first screen: the study's answer in a sentence and a small table
LEGEND = "legend"  # what the verdict symbols mean

FOLD_ROWS = 15  # a table with more body rows than this is folded (<details>), its deciding rows shown
PAGE_PX = 1400  # figures are embedded at most this wide (the page is 1100 CSS px; a little more for zoom)
ARXIV = re.compile(r"arXiv:(\d{4}\.\d{4,5})")
VERDICT_PREFIX = re.compile(r"[✓✗◐–□] (holds|fails|partly|not measurable|by construction)")


@dataclass
class Section:
    title: str
    claim: str
    measured: str
    figure: Path | None = None
    command: str = ""
    config: str = ""
    table_markdown: str = ""
    holds: bool | None = None
    verdict: str = ""  # the verdict's detail (what the numbers say); a leading "✓ holds: " is dropped
    extra: list[str] = field(default_factory=list)
    status: str | None = None  # a numdev.stats.verdicts status (holds, fails, partly, not measurable); wins over `holds`
    images: list[tuple[Path, str]] = field(default_factory=list)  # more figures, each with its caption
    # The HTML id of the section: a stable marker for readers and tests (e.g. "loss-curves", "samples").
    anchor: str = ""
    provenance: dict | None = None  # numdev.runs.provenance block of the files the section shows (None: unknown)
    rule: str = ""  # how the verdict was decided (numdev.stats.verdicts)
    parts: dict = field(default_factory=dict)  # a combined verdict's parts: name -> {status, detail, rule}
    deciding_rows: list[int] = field(default_factory=list)  # body rows of a long table shown outside its fold
    files: list[tuple[str, Path]] = field(default_factory=list)  # (label, path): linked relative to the page
    tensorboard: str = ""  # the command that opens the runs in TensorBoard


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2em; } .sub { color: #666; margin-top: 0; }
section { border-top: 1px solid #ddd; padding: 1em 0; }
h2 .badge { font-size: 0.6em; font-weight: 600; padding: 0.15em 0.5em; border-radius: 1em; vertical-align: middle; margin-left: 0.4em; }
.holds { color: #0f5c37; background: #dcf2e6; } .fails { color: #8a3500; background: #fbe3d3; }
.partly { color: #6b4b00; background: #f8edc8; } .unmeasured { color: #444; background: #e8e8e8; }
.pair { display: grid; grid-template-columns: 2fr 3fr; gap: 1em; }
.box { background: #f6f6f6; border-radius: 6px; padding: 0.6em 0.9em; }
.box h3 { margin: 0 0 0.3em; font-size: 0.95em; color: #555; }
.grid { display: grid; grid-template-columns: 1fr; gap: 1.2em; } figure { margin: 0; }
figcaption { font-size: 0.95em; color: #333; margin-top: 0.3em; }
img { max-width: 100%; border: 1px solid #eee; margin-top: 0.8em; }
code, pre { background: #f0f0f0; border-radius: 4px; padding: 0.1em 0.3em; font-size: 0.9em; }
pre { padding: 0.6em; overflow-x: auto; } details { margin-top: 0.5em; } summary { cursor: pointer; color: #245; }
#provenance { background: #eef3fb; border: 1px solid #c9d6ea; border-radius: 6px; padding: 0.6em 0.9em; }
#provenance h2 { font-size: 1.05em; margin: 0 0 0.3em; } .warn { color: #b04a00; font-weight: 600; }
nav#contents ol { columns: 2; margin: 0.3em 0; } nav#contents li { margin: 0.15em 0; }
nav#contents .badge { font-size: 0.8em; padding: 0 0.4em; border-radius: 1em; }
.machine, .files { color: #666; font-size: 0.85em; }
table { border-collapse: collapse; margin-top: 0.6em; font-size: 0.92em; } td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; }
#the-answer { background: #fffbe8; border: 1px solid #e6d9a8; border-radius: 6px; padding: 0.7em 1em; margin: 0.8em 0; }
#the-answer h2 { font-size: 1.2em; margin: 0 0 0.4em; } #the-answer .said { font-size: 1.05em; }
.legend ul { margin: 0.3em 0; } .legend li { margin: 0.1em 0; }
"""


def _label(s: Section) -> tuple[str, str] | None:
    """(css class, 'symbol status') of a section's verdict, or None when it has none."""
    from numdev.stats.verdicts import SYMBOLS

    if s.status is not None:
        css = {"holds": "holds", "fails": "fails", "partly": "partly"}.get(s.status, "unmeasured")
        return css, f"{SYMBOLS[s.status]} {s.status}"
    if s.holds is not None:
        return ("holds", "✓ holds here") if s.holds else ("fails", "✗ differs here")
    return None


def slug(title: str, whole: bool = False) -> str:
    """The title's part before its dash ("Fig. 3 — precision sweep" -> fig-3); whole: all of it."""
    text = title.lower() if whole else title.lower().split("—")[0]
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "section"


def _text(text: str, out_dir: Path | None) -> str:
    """Escaped text with links: arXiv ids, and absolute paths of files that exist (relative to the page); the
    Markdown the summaries' texts use, `code` and **bold**, as HTML (never shown literally)."""
    escaped = html.escape(text)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    escaped = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", escaped)
    escaped = ARXIV.sub(lambda m: f"<a href='https://arxiv.org/abs/{m.group(1)}'>{m.group(0)}</a>", escaped)
    if out_dir is None:
        return escaped

    def link(match: re.Match) -> str:
        path = Path(html.unescape(match.group(0)))
        return f"<a href='{html.escape(_relative(path, out_dir))}'>{match.group(0)}</a>" if path.exists() else match.group(0)

    return re.sub(r"(?<![\w/.])/[\w.\-/]+[\w\-]", link, escaped)


def _relative(path: Path, out_dir: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), Path(out_dir).resolve())).as_posix()


def _plain_verdict(text: str) -> str:
    """A verdict's detail without its symbols and statuses (the heading shows the section's once)."""
    text = VERDICT_PREFIX.sub(lambda m: m.group(1), text).strip()
    for status in ("holds", "fails", "partly", "not measurable", "by construction"):
        if text.startswith(status + ": "):
            return text[len(status) + 2:]
    return text


def _markdown_tables(text: str, deciding: list[int], out_dir: Path | None) -> str:
    """Tables separated by blank lines; a block that is not a table is a paragraph. A table of more
    than FOLD_ROWS rows is folded, with its deciding rows (or none) shown above the fold."""
    blocks = [b for b in text.strip().split("\n\n") if b.strip()]
    parts = []
    for block in blocks:
        if not block.lstrip().startswith("|"):
            parts.append(f"<p>{_text(block.strip(), out_dir)}</p>")
            continue
        lines = [_cells(line) for line in block.strip().splitlines() if line.strip()]
        if len(lines) < 2:
            continue
        head, body = lines[0], lines[2:]
        if len(body) <= FOLD_ROWS:
            parts.append(_table(head, body))
            continue
        shown = [body[i] for i in deciding if 0 <= i < len(body)]
        if shown:
            parts.append(f"<p>The rows the verdict rests on ({len(shown)} of {len(body)}):</p>" + _table(head, shown))
        parts.append(f"<details><summary>All {len(body)} rows</summary>{_table(head, body)}</details>")
    return "".join(parts)


def _cells(line: str) -> list[str]:
    """A Markdown table row's cells: split at | but not at an escaped \\| (as in "max \\|d\\|"), which becomes |."""
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") and not line.endswith("\\|") else line
    return [cell.replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line)]


def _table(head: list[str], body: list[list[str]]) -> str:
    cells = "".join(f"<th>{html.escape(c.strip())}</th>" for c in head)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><tr>{cells}</tr>{rows}</table>"


def page_png(path: Path) -> bytes:
    """The PNG sized for the page: at most PAGE_PX wide, 256 colours (plots have few), optimised."""
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
        if image.width > PAGE_PX:
            image = image.resize((PAGE_PX, round(image.height * PAGE_PX / image.width)), Image.LANCZOS)
        image = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def _image(path: Path, out_dir: Path | None) -> str:
    data = base64.b64encode(page_png(path)).decode("ascii")
    img = f'<img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">'
    if out_dir is not None and (Path(out_dir) / path.name).is_file():
        return f"<a href='{html.escape(path.name)}' title='full size'>{img}</a>"
    return img


def _why(s: Section, out_dir: Path | None) -> str:
    """How the verdict was reached, folded: each part's status and numbers, then the rule."""
    if not (s.verdict or s.rule or s.parts):
        return ""
    inside = []
    if s.parts:
        items = "".join(f"<li><b>{html.escape(name)}</b>: {html.escape(part.get('status', ''))}"
                        + (f" — {_text(_plain_verdict(part.get('detail', '')), out_dir)}" if part.get("detail") else "") + "</li>"
                        for name, part in s.parts.items())
        inside.append(f"<ul>{items}</ul>")
    elif s.verdict:
        inside.append(f"<p>{_text(_plain_verdict(s.verdict), out_dir)}</p>")
    if s.rule:
        inside.append(f"<p>Rule: {_text(s.rule, out_dir)}</p>")
    summary = "How the verdict was reached"
    if s.parts:
        summary += ": " + ", ".join(f"{name} {part.get('status', '')}" for name, part in s.parts.items())
    elif s.verdict and len(_plain_verdict(s.verdict)) <= 160:  # short enough to be the line itself
        summary = "Why: " + _plain_verdict(s.verdict)
    return f"<details class='why'><summary>{html.escape(summary)}</summary>{''.join(inside)}</details>"


def _contents(sections: list[Section], ids: list[str]) -> str:
    items = []
    for s, anchor in zip(sections, ids):
        label = _label(s)
        badge = f" <span class='badge {label[0]}'>{html.escape(label[1])}</span>" if label else ""
        items.append(f"<li><a href='#{html.escape(anchor)}'>{html.escape(s.title)}</a>{badge}</li>")
    return f"<nav id='{CONTENTS}'><h2>Contents</h2><ol>{''.join(items)}</ol></nav>"


def legend() -> str:
    """What every verdict symbol means, and that a range carries none (numdev.stats.verdicts.MEANINGS)."""
    from numdev.stats.verdicts import MEANINGS, RANGE_NO_VERDICT, SYMBOLS

    items = "".join(f"<li><b>{SYMBOLS[status]} {html.escape(status)}</b>: {html.escape(meaning)}</li>"
                    for status, meaning in MEANINGS.items())
    return (f"<details id='{LEGEND}' class='legend'><summary>What the symbols mean</summary><ul>{items}"
            f"<li>no symbol: {html.escape(RANGE_NO_VERDICT)} (it is shown as a range)</li></ul></details>")


def render(title: str, subtitle: str, sections: list[Section], intro: str = "", header: str = "",
           out_dir: Path | None = None, lead: str = "") -> str:
    """The page; `lead` is trusted HTML shown first (the answer, ANSWER), then the symbols' legend, the
    intro, `header` (trusted HTML: the provenance, folded) and the contents before the sections.
    `out_dir`: where the page is written, so that file links are relative to it (None: no file links)."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1><p class='sub'>{html.escape(subtitle)}</p>"]
    if lead:
        parts.append(f"<div id='{ANSWER}' class='answer'>{lead}</div>")
    parts.append(legend())
    if intro:
        parts.append(f"<p>{_text(intro, out_dir)}</p>")
    parts.append(header)
    ids, seen = [], set()
    for s in sections:
        anchor = s.anchor or slug(s.title)
        if anchor in seen:  # "GEMM — by format", "GEMM — by K": the whole title tells them apart
            anchor = slug(s.title, whole=True)
        base, n = anchor, 2
        while anchor in seen:
            anchor, n = f"{base}-{n}", n + 1
        seen.add(anchor)
        ids.append(anchor)
    parts.append(_contents(sections, ids))
    for s, anchor in zip(sections, ids):
        label = _label(s)
        badge = f" <span class='badge {label[0]}'>{html.escape(label[1])}</span>" if label else ""
        parts.append(f"<section id='{html.escape(anchor)}'><h2>{html.escape(s.title)}{badge}</h2><div class='pair'>")
        parts.append(f"<div class='box'><h3>Paper</h3>{_text(s.claim, out_dir)}</div>")
        parts.append(f"<div class='box'><h3>Measured</h3>{_text(s.measured, out_dir)}</div></div>")
        parts.append(_why(s, out_dir))
        for line in s.extra:
            parts.append(f"<p>{_text(line, out_dir)}</p>")
        if s.table_markdown:
            parts.append(_markdown_tables(s.table_markdown, s.deciding_rows, out_dir))
        if s.figure is not None and s.figure.exists():
            parts.append(_image(s.figure, out_dir))
        if s.images:
            parts.append("<div class='grid'>")
            for path, caption in s.images:
                if path.exists():
                    parts.append(f"<figure>{_image(path, out_dir)}<figcaption>{_text(caption, out_dir)}</figcaption></figure>")
            parts.append("</div>")
        if s.command:
            parts.append(f"<p>Rerun: <code>{html.escape(s.command)}</code></p>")
        if s.tensorboard:
            parts.append(f"<p>Training curves in TensorBoard: <code>{html.escape(s.tensorboard)}</code>, then open "
                         "<a href='http://localhost:6006/'>http://localhost:6006/</a></p>")
        if s.files and out_dir is not None:
            links = ", ".join(f"<a href='{html.escape(_relative(path, out_dir))}'>{html.escape(name)}</a>"
                              for name, path in s.files if Path(path).exists())
            if links:
                parts.append(f"<p class='files'>Files: {links}</p>")
        parts.append(f"<p class='machine'>Measured on: {html.escape(machine_line_or_unknown(s.provenance))}</p>")
        if s.config:
            parts.append(f"<details><summary>Configuration</summary><pre>{html.escape(s.config)}</pre></details>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)
