"""The harm studies' generated blocks in README.md and docs/harm.md, from their committed summaries.

    python scripts/harm_table.py                                # prints the blocks of both studies
    python scripts/harm_table.py --which harm --summary outputs/train/harm/multirun_<time>/summary.json --write-docs
    python scripts/harm_table.py --which harm_confirm --summary <its study>/summary.json --write-docs
    python scripts/harm_table.py --which harm_confirm_zen5 --summary <its study>/summary.json --write-docs

Two studies: `harm` (experiment=harm, the first: it measured the one-ulp control's spread) and
`harm_confirm` (experiment=harm_confirm: the same design on fresh replicates, its margin set from the
first's before it ran), and `harm_extensions` (the confirmation's directory with the extension roles added:
the positive controls (a)-(c) and (b)'s fix; the reference rerun there, bit for bit the same). --write-docs copies the summary to docs/results/ (harm_summary.json,
harm_confirm_summary.json) and writes its blocks: docs/harm.md's `harm-results` / `harm-confirm-results`
(the controls, every run, delta_harm, every role's calibration and margins), and for the confirmation,
whose margin was registered before its runs, README.md's `harm-answer` (the answer and the table of
every measure), each naming the command and the machine. tests/test_generated_docs.py rebuilds
every block from the committed JSON. `harm_confirm_zen5` is the confirmation's command run again on a
second CPU kind (docs/harm.md#second-cpu): its block adds the registered claims S1-S3 judged against the
first machine's committed summary and each run beside its sibling there; README.md's `harm-second-cpu`
gives S1-S3.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import functools
import math
from pathlib import Path

from numdev.cli.script_args import ScriptParser, output_file_problem, run_script
from numdev.report.docblocks import check_blocks, replace_block
from numdev.report.harm import calibration_table, controls_table, gate_list, headline_table, replicates_table
from numdev.runs.atomic import write_bytes
from numdev.runs.harm_summary import read_harm_summary
from numdev.runs.provenance import UNKNOWN_CPU, cpu_kind, machine_line
from numdev.stats.intervals import MIN_CI
from numdev.stats.verdicts import FAILS, HOLDS, SYMBOLS

ROOT = Path(__file__).resolve().parents[1]
README, DOC = ROOT / "README.md", ROOT / "docs" / "harm.md"
EXTENSION = ("numdev-train experiment=harm_confirm study=reference,biased_1e-1,bf16_true,bf16_kahan,acc_e5m2 "
             "hydra.sweep.dir=<a copy of the confirmation's study without its reference runs>, then "
             "numdev-train experiment=harm_confirm study=acc_e5m0 hydra.sweep.dir=<the same copy>, then "
             "numdev-train experiment=harm_confirm study=flash_paper,flash_kernel study.replicate=5,6,7,8,9 "
             "hydra.sweep.dir=<the same copy> hydra.launcher.n_jobs=1, then "
             "numdev-train experiment=harm_confirm study=opt_compile,bf16_sr study.replicate=5,6,7,8,9 "
             "hydra.sweep.dir=<the same copy> hydra.launcher.n_jobs=1, then "
             "numdev-train experiment=harm_confirm study=delta_3e-1,data,acc_e4m3 study.replicate=5,6,7,8,9 "
             "hydra.sweep.dir=<the same copy> hydra.launcher.n_jobs=2 (stopped by SIGINT after acc_e4m3's replicates 5 and 6, "
             "whose runs were moved out of the study), then numdev-study --partial <the same copy>")
STUDIES = {  # --which -> its committed summary, docs/harm.md's block, README.md's block (None: not in README), its experiment, the command
    "harm": (ROOT / "docs" / "results" / "harm_summary.json", "harm-results", None, "harm", None),
    "harm_confirm": (ROOT / "docs" / "results" / "harm_confirm_summary.json", "harm-confirm-results", "harm-answer", "harm_confirm", None),
    "harm_extensions": (ROOT / "docs" / "results" / "harm_extensions_summary.json", "harm-extension-results", None, "harm_confirm",
                        EXTENSION),
    "harm_confirm_zen5": (ROOT / "docs" / "results" / "harm_confirm_zen5_summary.json", "harm-confirm-zen5-results", "harm-second-cpu",
                          "harm_confirm", None),
}
RESULT = STUDIES["harm"][0]
ANSWERS = ("harm_confirm", "harm_confirm_zen5")  # the studies whose margin was registered before their runs: their answer is shown
REPLICATIONS = {"harm_confirm_zen5": "harm_confirm"}  # --which -> the study whose command it ran again on another CPU kind
FIGURES = {"harm_confirm_zen5": ROOT / "docs" / "results" / "harm_confirm_zen5_machines.png"}  # machines_figure, by --write-docs
UNDER_TEST = "flash_fa2"
STRIP_LIMIT = 0.5  # machines_figure's right panel: relative differences beyond ±50% are drawn at its edge
OFF_SCALE = 1.0  # machines_figure's left panel: runs with a held-out loss above this (diverged) are counted, not drawn
PER_CALL_MARGIN = 10.0  # S2 (docs/harm.md#second-cpu, registered before the runs): Flash's per-call margin's lower end above it


def _origin(summary, which: str) -> str:
    result, command = STUDIES[which][0].relative_to(ROOT), STUDIES[which][4] or summary.command
    return (f"From [{result}]({result}) (`.venv/bin/{command}` on "
            f"{machine_line(summary.provenance)}; {len(summary.replicates)} replicates ({', '.join(map(str, summary.replicates))}); "
            f"generated by `.venv/bin/python scripts/harm_table.py --which {which} --write-docs`)")


def answer_block(summary, which: str = "harm_confirm") -> str:
    w = summary.workload
    if summary.headline.get("shown"):
        answer = f"**{summary.headline['text']}**"
    else:
        answer = "**No answer: the study withholds it, because not everything it needs holds.**"
    setting = (f"{w.get('model')} at {w.get('resolution')}x{w.get('resolution')}, {w.get('steps')} steps, {w.get('precision')}; "
               f"harm: held-out loss worse than the reference's by more than {summary.margin['margin']:.0%} (stated before the runs)")
    return "\n\n".join([answer + f" ({setting}.)", "What the answer needs:\n\n" + gate_list(summary), _origin(summary, which) + ".",
                        "Every measure side by side (ratio judged against the paper's 2-5x only from 5 replicates; a range carries no symbol):",
                        headline_table(summary)])


@functools.cache
def _first(which: str):
    """The committed summary of the study that `which` ran again on another CPU kind (read and checked once)."""
    return read_harm_summary(STUDIES[REPLICATIONS[which]][0])


def _verdict(ok: bool | None, n: int) -> str:
    """A registered claim's verdict; none from fewer than MIN_CI replicates, or where the summary lacks its measure (ok None)."""
    if n < MIN_CI:
        return f"– (range of {n}: no verdict)"
    if ok is None:
        return "– (not measured: no verdict)"
    return f"{SYMBOLS[HOLDS]} holds" if ok else f"{SYMBOLS[FAILS]} fails"


def replication_problem(summary, which: str) -> str | None:
    """Why `summary` is not the first study's design run again on another CPU kind (None when it is): the same workload,
    margin and test, replicates among the first's, and a different CPU kind."""
    first = _first(which)
    for what, here, there in (("workload", summary.workload, first.workload),
                              ("margin", summary.margin.get("margin"), first.margin.get("margin")),
                              ("test", summary.margin.get("test"), first.margin.get("test"))):
        if here != there:
            return f"its {what} is {here!r}, the first study's {there!r}: not the same design run again"
    if UNDER_TEST not in summary.roles:
        return f"it has no role {UNDER_TEST}, whose claims S2 and S3 are: run the whole experiment"
    if cpu_kind(summary.provenance).startswith(UNKNOWN_CPU):
        return "its provenance names no CPU (provenance.machine.cpu): it cannot be told a second CPU kind"
    if not set(summary.replicates) <= set(first.replicates):
        return f"its replicates {summary.replicates} are not among the first study's {first.replicates}: no run has a sibling"
    if cpu_kind(summary.provenance) == cpu_kind(first.provenance):
        return f"it ran on {cpu_kind(summary.provenance)}, the first study's CPU kind: not a second one"
    return None


def replication_claims(summary, which: str) -> str:
    """The registered claims S1-S3 of a study run again on another CPU kind, judged on its summary; the first machine's
    numbers beside them (docs/harm.md#second-cpu)."""
    first = _first(which)
    n, here, there = len(summary.replicates), cpu_kind(summary.provenance), cpu_kind(first.provenance)
    on_here, on_there = (f"on the {(s.provenance.get('machine') or {}).get('cpu')}" for s in (summary, first))
    flash, flash_first = summary.roles.get(UNDER_TEST), first.roles[UNDER_TEST]
    margin = (flash.margin_per_call or {}) if flash else {}
    low = (margin.get("estimate") or {}).get("low")
    sign = (flash.effects.get("heldout_loss") or {}).get("sign") if flash else None
    width = f"±{summary.margin['margin']:.0%}"

    def counts(s) -> str:
        c = (((s.roles.get(UNDER_TEST) and s.roles[UNDER_TEST].effects.get("heldout_loss")) or {}).get("sign") or {}).get("counts")
        return f"{c['inside']} inside, {c['above']} above, {c['below']} below" if c else "not measured"
    return "\n".join([
        f"The confirmation's command run again on {here}, registered before its runs (docs/harm.md#second-cpu), "
        f"against the same replicates on {there}:",
        f"- S1, the answer is given again: {_verdict(bool(summary.headline.get('shown')), n)} "
        f"(delta_harm = {summary.harm.get('text', 'not measured')} {on_here}, {first.harm.get('text', 'not measured')} {on_there})",
        f"- S2, Flash's per-call margin to harm has its lower end above {PER_CALL_MARGIN:g}: "
        f"{_verdict(None if low is None else low > PER_CALL_MARGIN, n)} ({margin.get('text', 'not measured')} {on_here}, "
        f"{(flash_first.margin_per_call or {}).get('text', 'not measured')} {on_there})",
        f"- S3, Flash's held-out effect inside {width} in every replicate: "
        f"{_verdict(None if sign is None else sign['counts']['inside'] == sign['n'], n)} ({counts(summary)} {on_here}; "
        f"{counts(first)} {on_there}; above is worse)",
    ])


def machines_table(summary, which: str) -> str:
    """Each run's held-out loss on both CPU kinds (same role, same seeds) and their relative difference: the machine as a
    perturbation, beside the one-ulp control's own effects on each."""
    first = _first(which)
    here, there = cpu_kind(summary.provenance), cpu_kind(first.provenance)
    reps = [str(r) for r in summary.replicates if r in first.replicates]  # outcomes are keyed by the replicate's name
    lines = ["| role | " + " | ".join(f"r{r}" for r in reps) + " | largest \\|difference\\| |",
             "| --- | " + " | ".join("---" for _ in reps) + " | --- |"]
    for name, role in summary.roles.items():
        if name not in first.roles:
            continue
        a, b = first.roles[name].outcomes.get("heldout_loss") or {}, role.outcomes.get("heldout_loss") or {}
        cells, largest = [], None
        for r in reps:
            if a.get(r) is None or b.get(r) is None:
                cells.append("–")
                continue
            if not (math.isfinite(a[r]) and math.isfinite(b[r]) and a[r] > 0):  # a run that ended non-finite: no ratio
                cells.append(f"{a[r]:.3g} → {b[r]:.3g}")
                continue
            change = b[r] / a[r] - 1
            largest = abs(change) if largest is None else max(largest, abs(change))
            cells.append(f"{a[r]:.3g} → {b[r]:.3g} ({change:+.1%})")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'–' if largest is None else f'{largest:.1%}'} |")

    def ulp_spread(s) -> str:
        effects = sorted(((s.roles.get("ulp") and s.roles["ulp"].effects.get("heldout_loss")) or {}).get("per_replicate", {}).values())
        return f"{effects[0]:+.1%} to {effects[-1]:+.1%}" if effects else "not measured"
    return (f"**Every run on both CPU kinds** (held-out loss, {there} → {here}, and the relative difference; the one-ulp "
            f"control's own effects for scale: {ulp_spread(first)} there, {ulp_spread(summary)} here):\n\n" + "\n".join(lines))


def machines_figure(summary, which: str, path: Path) -> None:
    """Each run's held-out loss on both CPU kinds (left, log-log, the diagonal and the margin's band) and, per role, the
    relative differences beside the one-ulp control's own effects on each machine (right): what machines_table shows."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter, PercentFormatter

    first = _first(which)
    here, there = cpu_kind(summary.provenance), cpu_kind(first.provenance)
    margin = summary.margin["margin"]
    fig, (ax, strip) = plt.subplots(1, 2, figsize=(12, 4.6), dpi=110, gridspec_kw={"width_ratios": [1, 1.2]})
    rows, seen, off_scale = [], [], 0
    for name, role in summary.roles.items():
        if name not in first.roles:
            continue
        a, b = first.roles[name].outcomes.get("heldout_loss") or {}, role.outcomes.get("heldout_loss") or {}
        pairs = [(a[r], b[r]) for r in map(str, summary.replicates)
                 if a.get(r) is not None and b.get(r) is not None and math.isfinite(a[r] + b[r]) and min(a[r], b[r]) > 0]
        if not pairs:
            continue
        shown = [pair for pair in pairs if max(pair) <= OFF_SCALE]  # a diverged run (lr x10: up to 1e4) would flatten the rest
        off_scale += len(pairs) - len(shown)
        (dots,) = ax.plot(*zip(*shown), "o", label=name, alpha=0.8) if shown else ax.plot([], [], "o", label=name)
        seen += [v for pair in shown for v in pair]
        rows.append((f"{name}: this CPU vs the first", [y / x - 1 for x, y in pairs], dots.get_color()))
    for label, s in ((there, first), (here, summary)):
        ulp = s.roles.get("ulp") and (s.roles["ulp"].effects.get("heldout_loss") or {}).get("per_replicate")
        if ulp:
            rows.append((f"one ulp vs reference, {label}", list(ulp.values()), "grey"))
    if seen:
        low, high = min(seen) / 1.3, max(seen) * 1.3
        grid = [low, high]
        ax.plot(grid, grid, color="black", linewidth=0.8, label="the same on both")
        ax.fill_between(grid, [g * (1 - margin) for g in grid], [g * (1 + margin) for g in grid], color="grey", alpha=0.2,
                        label=f"±{margin:.0%} (the study's margin)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # a span of about a decade: label 1, 2 and 5 of each, in plain numbers
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FormatStrFormatter("%g"))
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"held-out loss on {there}")
    ax.set_ylabel(f"held-out loss on {here}")
    ax.set_title("Every run on both CPU kinds (same role, same seeds)" + (f"; {off_scale} above {OFF_SCALE:g} not shown"
                                                                          if off_scale else ""), fontsize=9)
    ax.legend(fontsize=7)
    labels = []
    for index, (label, values, colour) in enumerate(rows):
        inside = [v for v in values if abs(v) <= STRIP_LIMIT]
        beyond = [v for v in values if abs(v) > STRIP_LIMIT]  # a diverged run (+1e7%) drawn at the edge, counted in its label
        strip.plot(inside, [index] * len(inside), "o", color=colour, alpha=0.8)
        for v in beyond:
            strip.plot(math.copysign(STRIP_LIMIT, v), index, ">" if v > 0 else "<", color=colour, markersize=9)
        labels.append(label + (f" ({len(beyond)} beyond ±{STRIP_LIMIT:.0%})" if beyond else ""))
    strip.axvspan(-margin, margin, color="grey", alpha=0.2)
    strip.axvline(0, color="black", linewidth=0.8)
    strip.set_xlim(-STRIP_LIMIT * 1.08, STRIP_LIMIT * 1.08)
    strip.xaxis.set_major_formatter(PercentFormatter(1.0))
    strip.set_yticks(range(len(rows)), labels, fontsize=7)
    strip.set_xlabel(f"relative difference of held-out loss (grey: ±{margin:.0%}, the study's margin)", fontsize=9)
    strip.set_title("The machine as a perturbation, beside one ulp's", fontsize=9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    write_bytes(path, buffer.getvalue())


def readme_text(summary, which: str) -> str:
    """README.md's block of a study: the answer (harm_confirm) or the replication's claims (harm_confirm_zen5)."""
    if which in REPLICATIONS:
        return (f"**On a second CPU kind.** {replication_claims(summary, which)}\n\n"
                f"{_origin(summary, which)}; every run beside its sibling: [docs/harm.md](docs/harm.md#second-cpu).")
    return answer_block(summary, which)


def results_block(summary, which: str = "harm") -> str:
    replication = [replication_claims(summary, which), machines_table(summary, which),
                   f"![Every run on both CPU kinds](results/{FIGURES[which].name})"] if which in REPLICATIONS else []
    answer = [] if which not in ANSWERS else [  # the answer is README's; shown here beside its numbers
        "**The answer** " + answer_block(summary, which).split("\n\n", 1)[0], "What the answer needs:", gate_list(summary),
        "Every measure side by side:", headline_table(summary)]
    return "\n\n".join([
        _origin(summary, which).replace("docs/results/", "results/") + ".",
        *replication,
        *answer,
        "**The pre-registered claims** (held-out loss effect relative to the reference, paired by replicate; both tests shown, "
        f"the verdict by the registered one, the {summary.margin.get('test', 't')} test; harms {summary.rules['claims']['harms']}):",
        controls_table(summary),
        "**Every run** (held-out loss; the share of final samples whose position matches the caption, chance 11%): "
        "a paired effect is the difference of two cells in one column.",
        replicates_table(summary),
        f"**delta_harm** = {summary.harm.get('text', 'not measured')} ({summary.harm.get('rule', '')}).",
        f"**Calibration over steps** ({summary.rules['stability']}):",
        calibration_table(summary),
    ]).replace("](docs/", "](")


def main() -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--which", choices=sorted(STUDIES), help="the study (default: print both committed ones)")
    parser.add_argument("--summary", type=Path, help="its summary.json (default: the committed one)")
    parser.add_argument("--write-docs", action="store_true", help="commit the summary and write its blocks in README.md and docs/harm.md")
    args = parser.parse_args()
    if (args.summary or args.write_docs) and args.which is None:
        parser.error(f"--summary and --write-docs need --which ({', '.join(sorted(STUDIES))}): the study they are of")
    if args.write_docs:
        _, doc_block, readme_block, _, _ = STUDIES[args.which]
        check_blocks((DOC, doc_block), *([(README, readme_block)] if readme_block is not None else []))
        if args.which in FIGURES and (problem := output_file_problem(FIGURES[args.which])):  # before any block is written
            parser.error(problem)
    for which in [args.which] if args.which else sorted(STUDIES):
        result, doc_block, readme_block, experiment, _ = STUDIES[which]
        source = args.summary or result
        try:
            summary = read_harm_summary(source)  # checked whole (schema, version, every field's type) before anything is written
        except ValueError as error:
            parser.error(str(error))
        if summary.command != f"numdev-train experiment={experiment}":
            parser.error(f"{source}: is the summary of `{summary.command}`, not of experiment={experiment}: give --which to match")
        if which in REPLICATIONS and (problem := replication_problem(summary, which)):
            parser.error(f"{source}: {problem} (--which {which} is experiment={experiment} on a second CPU kind)")
        if args.write_docs and source.resolve() != result.resolve():
            write_bytes(result, source.read_bytes())  # whole or not at all (numdev.runs.atomic)
        results = results_block(summary, which)
        print(results, "\n")
        if args.write_docs:
            replace_block(DOC, doc_block, results)
            if readme_block is not None:
                replace_block(README, readme_block, readme_text(summary, which))
            if which in FIGURES:
                machines_figure(summary, which, FIGURES[which])


if __name__ == "__main__":
    run_script(main)
