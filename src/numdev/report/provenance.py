"""The report's provenance header: which machine, software and commit the numbers describe.

Results differ between CPUs, so the report says where each result file was produced (the
`provenance` block of its summary, numdev.runs.provenance), and says so loudly when the bench sweeps and
the study came from different machines or commits. Files written before numdev recorded
provenance read "unknown".
"""

from __future__ import annotations

import html

from numdev.runs.provenance import machine_line_or_unknown, origin

ANCHOR = "provenance"  # the header's HTML id: a stable marker for readers and tests


def _threads(block: dict | None) -> str:
    return str(((block or {}).get("machine") or {}).get("torch_threads", "unknown"))


def _rows(block: dict) -> list[tuple[str, str]]:
    machine, versions, git = block.get("machine") or {}, block.get("versions") or {}, block.get("git") or {}
    commit = git.get("commit") or "not a git checkout"
    dirty = {True: "yes (uncommitted changes)", False: "no", None: "unknown"}[git.get("dirty")]
    seeds = block.get("seeds")
    return [
        ("CPU", f"{machine.get('cpu', 'unknown')} ({', '.join(machine.get('cpu_flags') or []) or 'no flags recorded'})"),
        ("threads", f"{machine.get('torch_threads', 'unknown')} torch thread(s) of {machine.get('logical_cpus', 'unknown')} logical CPUs"),
        ("GPU", str(machine.get("gpu") or "none")),
        ("platform", str(machine.get("platform", "unknown"))),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v) or "unknown"),
        ("git commit", commit),
        ("uncommitted changes", dirty),
        ("seeds", "unknown" if seeds is None else ", ".join(map(str, seeds))),
        ("date", str(block.get("date", "unknown"))),
    ]


def _labels(labels: list[str], out_dir) -> str:
    """The sources, each with the path in its label linked relative to the report (where it exists)."""
    from numdev.report.html import _text

    return _text(", ".join(labels), out_dir)


def header_html(sources: dict[str, dict | None], generated_by: dict, out_dir=None) -> str:
    """The <header id="provenance"> at the top of the report (a header, not a <section>: sections are figures).

    sources: what the report shows (e.g. "Fig. 3 sweep") -> the provenance block of its file (None: unknown).
    generated_by: the provenance of the process writing the report (the report's own date and commit).
    """
    groups: dict[tuple | None, list[str]] = {}
    for label, block in sources.items():
        groups.setdefault(origin(block), []).append(label)
    if len(groups) == 1:
        line = f"measured on {machine_line_or_unknown(sources[next(iter(sources))])}"
    else:
        line = f"{len(groups)} different origins: compare across them with care"
    # folded under its one-line summary: the answer and the sections come first (a reader opens it to check)
    parts = [f"<header id='{ANCHOR}'><details{' open' if len(groups) > 1 else ''}><summary><b>Provenance: where these "
             f"numbers come from</b> — {html.escape(line)}</summary>"]
    if len(groups) == 1:
        (key, labels), = groups.items()
        block = sources[labels[0]]
        parts.append(f"<p>Every result in this report was measured on: <b>{html.escape(machine_line_or_unknown(block))}</b></p>")
        threads = {}
        for label in labels:
            threads.setdefault(_threads(sources[label]), []).append(label)
        if len(threads) > 1:  # a run setting, said plainly: not a different origin
            parts.append("<p class='machine'>torch threads per result (a setting of each run, not another machine): " + "; ".join(
                f"{n}: {html.escape(', '.join(name.split(' (')[0] for name in names))}" for n, names in threads.items()) + "</p>")
        parts.append(f"<p class='machine'>Results: {_labels(labels, out_dir)}</p>")
        if key is not None:
            parts.append(_details("the full block", block, open_=False))
    else:
        machines = {key[:3] if key else None for key in groups}
        what = "different machines" if len(machines) > 1 else "one machine but different code (versions or commits)"
        parts.append(
            f"<p class='warn'>The results in this report come from {what} ({len(groups)} origins): compare numbers "
            "across them with care, results differ between CPUs and between versions.</p><ul>"
        )
        for key, labels in groups.items():
            block = sources[labels[0]]
            parts.append(
                f"<li><b>{html.escape(machine_line_or_unknown(block))}</b>: {_labels(labels, out_dir)}"
                + (_details("the full block", block, open_=False) if key is not None else "")
                + "</li>"
            )
        parts.append("</ul>")
    parts.append(f"<p class='machine'>Report written by: {html.escape(machine_line_or_unknown(generated_by))}</p></details></header>")
    return "".join(parts)


def _details(summary: str, block: dict, open_: bool = True) -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in _rows(block))
    return f"<details{' open' if open_ else ''}><summary>{html.escape(summary)}</summary><table>{rows}</table></details>"
