"""The report's harm-study sections (experiment=harm): the answer first, then why.

1. "Does it matter?": the headline sentence, or why it is withheld (which pre-registered claim did
   not hold), and the table of every measure side by side;
2. the controls: every role's downstream effect against the margin and the verdict on each claim;
3. where training is harmed: the attention-noise ladder's effects and delta_harm;
4. the calibration over steps: every role's delta* against the step and whether it is stable.
All numbers come from the study's summary.json (numdev.runs.harm_summary), read and checked.
"""

from __future__ import annotations

from pathlib import Path

from numdev.analysis.harm.headline import short_why
from numdev.cli.commands import script
from numdev.figures.harm import FILES
from numdev.report.html import Section
from numdev.runs.harm_summary import HarmSummary, read_harm_summary
from numdev.runs.layout import SUMMARY
from numdev.stats import verdicts

NOISE = "attention_noise"


def headline_table(summary: HarmSummary) -> str:
    """The table of every measure (rows) for the roles under test and the low-precision proxy (columns)."""
    if not summary.table:
        return ""
    columns = list(summary.table[0]["cells"])
    head = ["measure", *(summary.roles[c].label for c in columns), "bf16-vs-fp32 / Flash (paper: 2-5x)"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for row in summary.table:
        cells = [(row["cells"].get(c) or {}).get("text", "–") for c in columns]
        ratio = row.get("ratio") or {}
        verdict = ratio.get("verdict")
        judged = f"{ratio.get('text', '–')} {verdicts.SYMBOLS[verdict['status']]}" if verdict else ratio.get("text", "–")
        lines.append("| " + " | ".join([row["label"], *cells, judged]) + " |")
    return "\n".join(lines)


def controls_table(summary: HarmSummary) -> str:
    """Every role's held-out effect by both tests (the t interval and the sign test's counts) and the verdict on its
    claim by the registered test (summary.margin["test"])."""
    lines = ["| role | what it changes | claim | held-out loss effect (relative): mean, 95% t | sign test: replicates above / "
             "inside / below the margin | the held-out set's own error of each paired effect (se, range over replicates) | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, role in summary.roles.items():
        effect = role.effects.get("heldout_loss")
        if effect is None:
            continue
        claim = role.claim or "–"
        if role.claim_than:
            claim += f" {role.claim_than}"
        verdict = f"{role.control['symbol']} {role.control['status']} ({role.control.get('test', 't')})" if role.control else "–"
        sign = effect.get("sign")
        counts = f"{sign['counts']['above']} / {sign['counts']['inside']} / {sign['counts']['below']} of {sign['n']}" if sign else "–"
        own = sorted(((role.function_level.get("evaluation_error") or {}).get("per_replicate") or {}).values())
        own_text = f"{own[0]:.2g}-{own[-1]:.2g}" if own else "–"
        lines.append(f"| {name} | {role.label} | {claim} | {effect['text'].split(';')[0]} | {counts} | {own_text} | {verdict} |")
    return "\n".join(lines)


def _in_words(effect: dict | None, test: str) -> str:
    """A role's held-out effect said in words, by the registered test (no symbol below 5 replicates)."""
    if not effect:
        return "no held-out loss"
    block = effect.get("sign") if test == "sign" else effect
    margin = effect.get("margin", 0.0)
    if block is None:
        return "not judged"
    harm, same = block["harm"]["status"], block["equivalence"]["status"]
    if harm == verdicts.HOLDS:
        return f"harms: held-out loss worse by more than {margin:.0%}"
    if same == verdicts.HOLDS:
        return f"no harm beyond ±{margin:.0%} (shown by the {test} test)"
    if block.get("n", effect.get("n", 0)) < 5:
        return "a range from fewer than 5 replicates: not judged"
    counts = block.get("counts")
    outside = f": {counts['above'] + counts['below']} of {block['n']} replicates outside ±{margin:.0%}" if counts else ""
    return f"undecided{outside}"


def answer_lead(summary: HarmSummary) -> str:
    """The report's first screen (numdev.report.html.ANSWER): the answer in one sentence, or why it is withheld,
    and one small table: each role under test and the low-precision proxy, its per-call deviation, its margins to
    harm, its held-out effect in words and what it costs (its median step time over the reference's)."""
    import html

    from numdev.report.html import _markdown_tables

    said = (summary.headline["text"] if summary.headline.get("shown")
            else f"No answer: the study withholds it ({short_why(summary.headline.get('gate') or {})}: why, below).")
    reference = next((r for r in summary.roles.values() if r.kind == "reference"), None)
    rows = ["| role | per-call deviation (relative RMS) | margin to harm: by the weights | per call | held-out loss effect "
            "(mean, 95% t) | in words | step time vs the reference |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for role in summary.roles.values():
        if role.kind not in ("under_test", "proxy"):
            continue
        effect = role.effects.get("heldout_loss")
        per_call = ((role.per_call or {}).get("rel_rms") or {}).get("text", "–")
        cost = "–"
        mine, theirs = role.outcomes.get("step_seconds") or {}, (reference.outcomes.get("step_seconds") or {}) if reference else {}
        ratios = sorted(mine[r] / theirs[r] for r in mine if mine.get(r) and theirs.get(r))
        if ratios:
            cost = f"{ratios[len(ratios) // 2]:.2g}x (median of {len(ratios)}; an emulation's cost is not the kernel's)"
        rows.append(f"| {role.label} | {per_call} | {(role.margin_to_harm or {}).get('text', '–')} | "
                    f"{(role.margin_per_call or {}).get('text', '–')} | {effect['text'].split(';')[0] if effect else '–'} | "
                    f"{_in_words(effect, summary.margin.get('test', 't'))} | {cost} |")
    w = summary.workload
    setting = (f"{w.get('model')} at {w.get('resolution')}x{w.get('resolution')}, {w.get('steps')} steps, {w.get('precision')}, "
               f"{len(summary.replicates)} replicates; harm: held-out loss worse by more than {summary.margin['margin']:.0%}, "
               f"stated before the runs")
    return (f"<h2>Does the numeric deviation matter? The answer</h2><p class='said'><b>{html.escape(said)}</b></p>"
            f"<p class='machine'>{html.escape(setting)}; what the answer needs and every measure: "
            f"<a href='#answer'>below</a>.</p>" + _markdown_tables("\n".join(rows), [], None))


def gate_list(summary: HarmSummary) -> str:
    """What the answer needs, one line each with its state: learning finished, then every pre-registered claim."""
    gate = summary.headline.get("gate") or {}
    lines = []
    learned = gate.get("learned")
    if learned:
        state = f"{verdicts.SYMBOLS[verdicts.HOLDS]} yes" if learned["ok"] else f"{verdicts.SYMBOLS[verdicts.FAILS]} {learned['why']}"
        lines.append(f"- the reference learned colour and position (>= {learned['threshold']:.0%} in every replicate): {state}")
    for name, claim in (gate.get("claims") or {}).items():
        role = summary.roles[name]
        what = claim["claim"] + (f" {claim['than']}" if claim.get("than") else "")
        sign = (role.effects.get("heldout_loss") or {}).get("sign")
        counts = (f"; {sign['counts']['above']} of {sign['n']} replicates above +{sign['margin']:.0%}, {sign['counts']['inside']} "
                  f"inside ±{sign['margin']:.0%}") if sign and claim["claim"] != "more_harm_than" else ""
        shown = f"- {name} ({role.label}) {what}: {claim['symbol']} {claim['status']} by the {claim.get('test', 't')} test{counts}"
        if claim.get("resolution"):
            shown += f" ({claim['resolution']['text']})"
        lines.append(shown)
    return "\n".join(lines)


def replicates_table(summary: HarmSummary) -> str:
    """Every run's held-out loss and position agreement, role by replicate: what the effects are made of
    (a paired effect is a difference along a column; a role learns position or not within one)."""
    reps = [str(r) for r in summary.replicates]
    lines = ["| role | " + " | ".join(f"r{r}: held-out loss / position" for r in reps) + " |",
             "| --- | " + " | ".join("---" for _ in reps) + " |"]
    for name, role in summary.roles.items():
        loss, position = role.outcomes.get("heldout_loss") or {}, role.outcomes.get("position_accuracy") or {}
        cells = [(f"{loss[r]:.3g}" if loss.get(r) is not None else "–") + " / "
                 + (f"{position[r]:.0%}" if position.get(r) is not None else "–") for r in reps]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def calibration_table(summary: HarmSummary) -> str:
    lines = ["| role | delta* over the stable window | stable from step | margin to harm (delta_harm / delta*) "
             "| per-call deviation (the shadow) | margin to harm per call |", "| --- | --- | --- | --- | --- | --- |"]
    for name, role in summary.roles.items():
        entry = role.calibration.get(NOISE)
        if not entry or role.kind in ("ladder", "reference", "truth"):
            continue
        window = entry.get("stability") or {}
        value = (entry.get("value") or {}).get("text") or "not stable"
        since = str(window.get("from_step")) if window.get("stable") else window.get("why", "–")
        margin = (role.margin_to_harm or {}).get("text", "–")
        per_call = ((role.per_call or {}).get("rel_rms") or {}).get("text", "–")
        margin_per_call = (role.margin_per_call or {}).get("text", "–")
        lines.append(f"| {name} | {value} | {since} | {margin} | {per_call} | {margin_per_call} |")
    return "\n".join(lines)


def harm_sections(study_dir: Path) -> list[Section]:
    study_dir = Path(study_dir)
    summary = read_harm_summary(study_dir / SUMMARY)
    command = " ".join([script("numdev-train"), summary.command.split(" ", 1)[1]])
    files = [("the study", study_dir), ("summary.json", study_dir / SUMMARY)]
    origin = summary.provenance
    gate = summary.headline.get("gate") or {}
    w = summary.workload
    setting = (f"{w.get('model')} at {w.get('resolution')}x{w.get('resolution')}, {w.get('steps')} steps, {w.get('precision')}, "
               f"lr {w.get('learning_rate')}, {len(summary.replicates)} replicate(s); margin: held-out loss worse by more than "
               f"{summary.margin['margin']:.0%}, stated before the runs")
    answer = summary.headline.get("text") if summary.headline.get("shown") else "No answer: the study withholds it (below: what did not hold)"
    sections = [
        Section(
            title="Does it matter? The answer",
            claim="How far each optimization's per-call deviation is from the smallest that measurably harms this training, "
                  "shown only when the positive controls harm and the negative controls do not.",
            measured=f"{answer} ({setting}).",
            table_markdown="What the answer needs:\n\n" + gate_list(summary) + "\n\nEvery measure, side by side:\n\n" + headline_table(summary),
            status=verdicts.HOLDS if gate.get("open") else verdicts.NOT_MEASURABLE,
            rule=summary.headline.get("rule", ""), command=command, provenance=origin, files=files, anchor="answer",
        ),
        Section(
            title="The controls: can this study say 'it matters'?",
            claim="Positive controls must harm (their effect's interval above the margin), negative controls must not "
                  "(equivalent to zero within it); each claim was stated in its role file before the study ran.",
            measured="; ".join(f"{n}: {c['symbol']} {c['claim']}" for n, c in (gate.get("claims") or {}).items()) or "no claims",
            figure=study_dir / FILES[2], table_markdown=controls_table(summary), command=command, provenance=origin, files=files,
        ),
        Section(
            title="Where training is harmed: the noise ladder and delta_harm",
            claim="The per-call relative noise that measurably harms this training, read from the attention-noise ladder.",
            measured=f"delta_harm = {summary.harm.get('text', 'not measured')} ({summary.harm.get('rule', '')}).",
            figure=study_dir / FILES[1], command=command, provenance=origin, files=files,
        ),
        Section(
            title="Calibration over steps: delta* at every snapshot",
            claim="Each role's equivalent per-call noise, read at every comparison step, with a stated rule for when it is stable.",
            measured=summary.rules.get("stability", ""), figure=study_dir / FILES[0],
            table_markdown=calibration_table(summary), command=command, provenance=origin, files=files,
        ),
    ]
    return sections
