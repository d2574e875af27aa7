"""Render report sections into one self-contained HTML page (figures embedded as data URIs)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

from numdev.report.provenance import machine_line_or_unknown

# Stable HTML ids of the report's study sections (Section.anchor): scripts/screenshot_report.py and
# tests/test_report.py look for them. The provenance header's id is numdev.report.provenance.ANCHOR.
LOSS_CURVES = "loss-curves"  # the study's training loss curves, side by side
SAMPLES = "samples"  # the study's sample grids with their captions


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
    verdict: str = ""  # overrides the plain holds/differs label
    extra: list[str] = field(default_factory=list)
    status: str | None = None  # a numdev.verdicts status (holds, fails, partly, not measurable); wins over `holds`
    images: list[tuple[Path, str]] = field(default_factory=list)  # more figures, each with its caption
    # The HTML id of the section: a stable marker for readers and tests (e.g. "loss-curves", "samples").
    anchor: str = ""
    provenance: dict | None = None  # numdev.provenance block of the files the section shows (None: unknown)


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } .sub { color: #666; margin-top: 0; }
section { border-top: 1px solid #ddd; padding: 1em 0; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
.box { background: #f6f6f6; border-radius: 6px; padding: 0.6em 0.9em; }
.box h3 { margin: 0 0 0.3em; font-size: 0.95em; color: #555; }
.holds { color: #16794a; font-weight: 600; font-size: 0.7em; } .differs { color: #b04a00; font-weight: 600; font-size: 0.7em; }
.unmeasured { color: #666; font-weight: 600; font-size: 0.7em; } .partly { color: #a07000; font-weight: 600; font-size: 0.7em; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 0.8em; } figure { margin: 0; } figcaption { font-size: 0.85em; color: #555; }
img { max-width: 100%; border: 1px solid #eee; margin-top: 0.8em; }
code, pre { background: #f0f0f0; border-radius: 4px; padding: 0.1em 0.3em; font-size: 0.9em; }
pre { padding: 0.6em; overflow-x: auto; } details { margin-top: 0.5em; }
#provenance { background: #eef3fb; border: 1px solid #c9d6ea; border-radius: 6px; padding: 0.6em 0.9em; }
#provenance h2 { font-size: 1.05em; margin: 0 0 0.3em; } .warn { color: #b04a00; font-weight: 600; }
.machine { color: #666; font-size: 0.85em; }
table { border-collapse: collapse; margin-top: 0.6em; } td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; }
"""


def _markdown_tables(text: str) -> str:
    """Tables separated by blank lines; a block that is not a table is a paragraph."""
    blocks = [b for b in text.strip().split("\n\n") if b.strip()]
    return "".join(_markdown_table(b) if b.lstrip().startswith("|") else f"<p>{html.escape(b.strip())}</p>" for b in blocks)


def _markdown_table(text: str) -> str:
    lines = [line.strip().strip("|").split("|") for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2:
        return ""
    head, body = lines[0], [row for row in lines[2:]]
    cells = "".join(f"<th>{html.escape(c.strip())}</th>" for c in head)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><tr>{cells}</tr>{rows}</table>"


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">'


def render(title: str, subtitle: str, sections: list[Section], intro: str = "", header: str = "") -> str:
    """The page; `header` is trusted HTML placed before the sections (the provenance header)."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1><p class='sub'>{html.escape(subtitle)}</p>"]
    if intro:
        parts.append(f"<p>{html.escape(intro)}</p>")
    parts.append(header)
    for s in sections:
        verdict = ""
        if s.status is not None:
            from numdev.verdicts import SYMBOLS

            css = {"holds": "holds", "fails": "differs", "partly": "partly"}.get(s.status, "unmeasured")
            verdict = f"<span class='{css}'>{SYMBOLS[s.status]} {html.escape(s.verdict or s.status)}</span>"
        elif s.holds is not None:
            label = html.escape(s.verdict or ("holds here" if s.holds else "differs here"))
            verdict = f"<span class='holds'>✓ {label}</span>" if s.holds else f"<span class='differs'>✗ {label}</span>"
        anchor = f" id='{html.escape(s.anchor)}'" if s.anchor else ""
        parts.append(f"<section{anchor}><h2>{html.escape(s.title)} {verdict}</h2><div class='pair'>")
        parts.append(f"<div class='box'><h3>Paper</h3>{html.escape(s.claim)}</div>")
        parts.append(f"<div class='box'><h3>Measured</h3>{html.escape(s.measured)}</div></div>")
        if s.table_markdown:
            parts.append(_markdown_tables(s.table_markdown))
        for line in s.extra:
            parts.append(f"<p>{html.escape(line)}</p>")
        if s.figure is not None and s.figure.exists():
            parts.append(_image(s.figure))
        if s.images:
            parts.append("<div class='grid'>")
            for path, caption in s.images:
                if path.exists():
                    parts.append(f"<figure>{_image(path)}<figcaption>{html.escape(caption)}</figcaption></figure>")
            parts.append("</div>")
        if s.command:
            parts.append(f"<p>Rerun: <code>{html.escape(s.command)}</code></p>")
        parts.append(f"<p class='machine'>Measured on: {html.escape(machine_line_or_unknown(s.provenance))}</p>")
        if s.config:
            parts.append(f"<details><summary>Configuration</summary><pre>{html.escape(s.config)}</pre></details>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)
