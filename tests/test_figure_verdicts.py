"""Each figure's verdict rule on synthetic per-seed rows: where the claim holds, where it fails,
and where it is not measurable (one seed, too few points, or non-finite outputs left out)."""

import math

import pytest

from numdev.figures import BENCH_FIGURES, FIGURES, fa3_table3, fig3, fig4, fig5, fig6
from numdev.stats.verdicts import BY_CONSTRUCTION, FAILS, HOLDS, NOT_MEASURABLE, PARTLY, RANGE_NO_VERDICT

SEEDS = (0, 1, 2, 3, 4)  # a verdict needs 5 seeds (numdev.stats.verdicts: a range from fewer carries none)
FEW = (0, 1, 2)


def _row(kind, method, seed, metrics, **fields):
    row = {"kind": kind, "method": method, "seed": seed, "job": "0", **{k.replace("__", "."): v for k, v in fields.items()}}
    row.update({f"metrics.{k}": v for k, v in {"nonfinite": 0, **metrics}.items()})
    return row


def _jitter(value, seed):
    return value * (1 + 0.02 * (seed - 1))


# --- Fig. 3: falls with mantissa bits (per-seed log slopes, t-test) --------------------------------


def _fig3_rows(values_by_precision, seeds=SEEDS, nonfinite=0):
    return [_row("pair", "flash-baseline", s, {"max_abs": _jitter(v, s), "mean_abs": v / 10, "std": v / 5, "nonfinite": nonfinite},
                 numerics__precision=p) for p, v in values_by_precision.items() for s in seeds]


@pytest.mark.parametrize("values, status", [
    ({"bf16": 4e-3, "fp16": 4e-4, "fp32": 7e-8, "fp64": 7e-16}, BY_CONSTRUCTION),  # a check that passes: neutral, not green
    ({"bf16": 7e-16, "fp16": 7e-8, "fp32": 4e-4, "fp64": 4e-3}, FAILS),  # a check that fails: a bug
    ({"bf16": 4e-3, "fp16": 4e-4}, NOT_MEASURABLE),  # two formats: no trend to test
])
def test_fig3_verdict(tmp_path, values, status):
    assert fig3.summarise(_fig3_rows(values), tmp_path)["status"] == status


def test_fig3_non_finite_records_are_never_judged(tmp_path):
    rows = _fig3_rows({"bf16": 4e-3, "fp16": 4e-4, "fp32": 7e-8, "fp64": 7e-16}, nonfinite=5)
    summary = fig3.summarise(rows, tmp_path)
    assert summary["status"] == NOT_MEASURABLE and "NaN/Inf" in summary["caption"]


# --- Fig. 4: "about 10x" per setting, combined --------------------------------------------------


def _fig4_rows(ratio_by_setting, seeds=SEEDS):
    rows = []
    for setting, ratio in ratio_by_setting.items():
        for s in seeds:
            base = _jitter(3e-3, s)
            for method, value in (("baseline", base), ("flash", base * ratio)):
                rows.append(_row("vs_golden", method, s, {"max_abs": value, "mean_abs": value / 5}, setting=setting,
                                 numerics__precision="bf16", numerics__preset="paper"))
    return rows


@pytest.mark.parametrize("ratios, seeds, status", [
    ({"paper_like": 10.0, "real_kernel": 9.0}, SEEDS, HOLDS),
    ({"paper_like": 10.0, "real_kernel": 0.7}, SEEDS, PARTLY),  # never green on half the claim
    ({"paper_like": 6.5, "real_kernel": 9.0}, SEEDS, PARTLY),  # above 1 but below the 7-14 band: partly
    ({"paper_like": 20.0, "real_kernel": 9.0}, SEEDS, PARTLY),  # above the band
    ({"paper_like": 0.5, "real_kernel": 0.7}, SEEDS, FAILS),
    ({"paper_like": 10.0, "real_kernel": 0.7}, (0,), NOT_MEASURABLE),  # one seed: no interval
])
def test_fig4_verdict(tmp_path, ratios, seeds, status):
    summary = fig4.summarise(_fig4_rows(ratios, seeds), tmp_path)
    assert summary["status"] == status, summary["verdict"]
    assert summary["claim_holds"] == (status == HOLDS)
    if ratios["paper_like"] == 6.5:  # the number is in the verdict, with its interval
        assert "flash/baseline max |Δ| 6.5 [6." in summary["parts"]["paper_like"]["detail"]


def test_fig4_names_the_baseline_each_setting_divides_by(tmp_path):
    rows = _fig4_rows({"paper_like": 10.0, "real_kernel": 0.9})
    for r in rows:
        if r["method"] == "baseline":
            r["knobs.formats.preset"] = "paper" if r["setting"] == "paper_like" else "eager"
    caption = fig4.summarise(rows, tmp_path)["caption"]
    assert "paper_like: the paper's Baseline" in caption and "real_kernel: eager PyTorch's Baseline" in caption


# --- Fig. 5: growth with N, every metric and setting --------------------------------------------


def _fig5_rows(growth, lengths=(256, 1024, 4096), seeds=SEEDS):
    rows = []
    for setting in ("paper_like", "real_kernel"):
        for n in lengths:
            value = 1e-3 * (n / 256) ** growth
            for s in seeds:
                rows.append(_row("pair", "flash-baseline", s, {"max_abs": _jitter(value, s), "mean_abs": _jitter(value, s) / 10,
                                                               "std": _jitter(value, s) / 5}, setting=setting, shape__seq_q=n, numerics__precision="bf16"))
                rows.append(_row("vs_golden", "flash", s, {"max_abs": value, "mean_signed": value / 100, "rel_rmse": value},
                                 setting=setting, shape__seq_q=n, numerics__precision="bf16"))
    return rows


@pytest.mark.parametrize("growth, lengths, status", [
    (0.5, (256, 1024, 4096), HOLDS),
    (-0.5, (256, 1024, 4096), FAILS),
    (0.0, (256, 1024, 4096), FAILS),  # flat: evidence against growth, not "not measurable"
    (0.5, (256, 1024), NOT_MEASURABLE),
])
def test_fig5_verdict(tmp_path, growth, lengths, status):
    assert fig5.summarise(_fig5_rows(growth, lengths), tmp_path)["status"] == status


# --- Fig. 6: (a) swap ratio interval, (b) square change below 5%, (c) monotone in area ----------


def _fig6_rows(slope, seeds=SEEDS, causal=False, row_effect=0.0):
    """Error set by B_c (as in the emulator): err ∝ B_c ** slope; B_r moves it only with row_effect."""
    return [_row("vs_golden", "flash", s, {"max_abs": _jitter(1e-2 * (c / 16) ** slope * (1 + row_effect * r / 64), s)},
                 numerics__precision=p, tiles__block_r=r, tiles__block_c=c, causal=causal)
            for p in ("bf16", "fp16") for r in (16, 32, 64) for c in (16, 32, 64) for s in seeds]


@pytest.mark.parametrize("slope, seeds, status", [
    (-0.5, SEEDS, PARTLY),  # (a) and (c) hold, (b) by construction: no evidence, so never green
    (0.5, SEEDS, FAILS),  # (a) and (c) fail, (b) by construction
    (-0.5, (0,), NOT_MEASURABLE),
])
def test_fig6_verdict(tmp_path, slope, seeds, status):
    summary = fig6.summarise(_fig6_rows(slope, seeds), tmp_path)
    assert summary["status"] == status, summary["verdict"]
    if len(seeds) > 1:
        assert summary["parts"]["(b) bf16"]["status"] == BY_CONSTRUCTION
        assert summary["parts"]["(a) bf16"]["status"] == (HOLDS if slope < 0 else FAILS)


def test_fig6_square_tiles_are_measured_where_b_r_can_matter(tmp_path):
    """With causal masking B_r decides which tiles are skipped: (b) is then a measurement, and fails
    when squaring the tile moves the error by more than the tolerance."""
    moved = fig6.summarise(_fig6_rows(-0.5, causal=True, row_effect=0.5), tmp_path)["parts"]["(b) bf16"]
    assert moved["status"] == FAILS, moved
    still = fig6.summarise(_fig6_rows(-0.5, causal=True), tmp_path)["parts"]["(b) bf16"]
    assert still["status"] == HOLDS, still


# --- FA3 Table 3: flash RMSE below baseline at each format --------------------------------------


def _fa3_rows(ratio, seeds=SEEDS, fa3=None):
    rows = [_row("vs_golden", m, s, {"rmse": _jitter(base * (ratio if m == "flash" else 1), s)}, numerics__precision=p)
            for p, base in (("fp16", 3e-4), ("fp8_e4m3", 2e-2)) for m in ("baseline", "flash") for s in seeds]
    if fa3 is not None:
        rows += [_row("vs_golden", "fa3", s, {"rmse": _jitter(2e-2 * fa3, s)}, numerics__precision="fp8_e4m3") for s in seeds]
    return rows


@pytest.mark.parametrize("ratio, seeds, status", [(0.6, SEEDS, HOLDS), (1.5, SEEDS, FAILS), (0.6, (0,), NOT_MEASURABLE)])
def test_fa3_verdict(tmp_path, ratio, seeds, status):
    summary = fa3_table3.summarise(_fa3_rows(ratio, seeds), tmp_path)
    assert summary["status"] == status and "| fp16 | flash |" in summary["table"]


@pytest.mark.parametrize("fa3, status", [(0.38, HOLDS), (0.5, HOLDS), (0.9, FAILS), (0.1, FAILS)])
def test_fa3_size_is_judged_against_the_papers_ratio(tmp_path, fa3, status):
    """FA3 (block quantisation + incoherent processing) at 0.38x the baseline's RMSE is the paper's size;
    and so is 0.5x (the band: 1.5x the paper's ratio either side); 0.9x is an improvement in the right
    direction but not FA3's (a positive control for the size rule), 0.1x too good to be FA3's."""
    part = fa3_table3.summarise(_fa3_rows(0.6, fa3=fa3), tmp_path)["parts"]["fp8_e4m3 fa3: FA3's size"]
    assert part["status"] == status, part


def test_registry_lists_every_figure_once_with_its_module():
    assert BENCH_FIGURES == ("fig3", "fig4", "fig5", "fig6", "fa3_table3", "reconcile", "bias", "gemm_formats", "gemm_k", "gemm_scaling")
    assert {"fig7", "fig8"} <= set(FIGURES) and FIGURES["fig8"].phase == "study"
    for name in BENCH_FIGURES:
        assert FIGURES[name].module == f"numdev.figures.{name}" and FIGURES[name].claim
    assert not math.isnan(len(FIGURES))


def test_a_flat_curve_is_not_measurable_not_nan():
    from numdev.stats.verdicts import monotone_verdict

    verdict = monotone_verdict([1, 2, 3], {seed: [0.5, 0.5, 0.5] for seed in range(3)}, "increasing")
    assert verdict.status == NOT_MEASURABLE and "flat" in verdict.detail


# --- Bias: |flash bias| beyond the Baseline's (can fail), growth with N, signs in the caption ------


def _bias_rows(whole, baseline, stages, lengths=(256, 512, 1024), seeds=SEEDS, growth=1.0):
    from numdev.figures import bias

    rows = []
    for n in lengths:
        scale = (n / lengths[0]) ** growth
        values = {"whole": whole, "baseline": baseline, **stages}
        values.update({s: 0.0 for s in bias.STAGES if s not in values})
        for s in seeds:
            for label, v in values.items():
                rows.append(_row("vs_golden", label, s, {"mean_signed": _jitter(v * scale, s)}, shape__seq_q=n,
                                 inputs="uniform", variant="fa1", precision="bf16"))
    return rows


def test_bias_verdict_holds_and_names_the_interaction(tmp_path):
    from numdev.figures import bias

    rows = _bias_rows(1e-3, 1e-5, {"stats": -9e-4, "accum": -2e-4, "stats+accum": 1.03e-3})
    summary = bias.summarise(rows, tmp_path)
    assert summary["status"] == HOLDS, summary["verdict"]
    assert "opposite: stats, accum" in summary["caption"] and "an interaction" in summary["caption"]
    assert "stats contributes most" not in summary["caption"]


def test_bias_verdict_can_fail(tmp_path):
    from numdev.figures import bias

    # Flash's bias smaller than the Baseline's, and shrinking with N: both parts contradicted.
    summary = bias.summarise(_bias_rows(1e-5, 1e-3, {"accum": 1e-5}, growth=-1.0), tmp_path)
    assert summary["parts"]["bias beyond the Baseline's at largest N"]["status"] == FAILS
    assert summary["parts"]["|bias| grows with N"]["status"] == FAILS and summary["status"] == FAILS
    # One stage with the whole's sign and size explains it alone: said so.
    alone = bias.summarise(_bias_rows(1e-3, 1e-5, {"accum": 0.98e-3}), tmp_path)["caption"]
    assert "accum alone gives 98% of the whole" in alone


# --- Reconciliation: its verdict parts can fail ---------------------------------------------------


def test_reconcile_verdict_can_fail():
    from numdev.figures import reconcile
    from numdev.stats.intervals import replicate_spread

    def cell(*values):
        e = replicate_spread(list(values))
        return {"max_abs": e, "mean_abs": e}

    key = reconcile._key
    by_tile = (("16", (3.0, 3.1, 3.2, 3.05, 3.15)), ("64", (2.0, 2.1, 2.2, 2.05, 2.15)), ("256", (1.2, 1.3, 1.4, 1.25, 1.35)))
    r = {key(inputs="uniform", variant="fa1", formats="paper", tiles=t): cell(*v) for t, v in by_tile}
    kernel = ("sdpa_flash", "uniform", "None", "None", "None")
    r[kernel] = cell(0.5, 0.5, 0.5, 0.5, 0.5)
    eager = {kernel: cell(1.2, 1.3, 1.25, 1.22, 1.28)}  # above eager PyTorch's Baseline: contradicts "below"
    seed_ratios = {key(inputs="uniform", variant="fa1", formats="paper", tiles=t): dict(enumerate(v)) for t, v in by_tile}
    parts = reconcile.sentences(r, "64", {"16": 16, "64": 64, "256": 256}, seed_ratios, eager)[0]
    assert parts["paper-like cell ~10x"].status == PARTLY and "2.1" in parts["paper-like cell ~10x"].detail
    assert parts["paper-like ratio grows with key/value blocks"].status == FAILS  # falls with more blocks
    assert parts["PyTorch's CPU flash kernel below eager PyTorch's Baseline"].status == FAILS


# --- from 3 seeds: ranges, shown, and no verdict ---------------------------------------------------


def _few_seed_summaries(tmp_path):
    """Each figure on data whose verdict holds or fails from 5 seeds, run on 3 (the demo's)."""
    from numdev.figures import bias

    return {
        "fig3": fig3.summarise(_fig3_rows({"bf16": 4e-3, "fp16": 4e-4, "fp32": 7e-8, "fp64": 7e-16}, FEW), tmp_path),
        "fig4": fig4.summarise(_fig4_rows({"paper_like": 10.0, "real_kernel": 0.7}, FEW), tmp_path),
        "fig5": fig5.summarise(_fig5_rows(0.0, seeds=FEW), tmp_path),  # flat: fails from 5 seeds
        "fig6": fig6.summarise(_fig6_rows(-0.5, FEW), tmp_path),
        "fa3_table3": fa3_table3.summarise(_fa3_rows(1.5, FEW), tmp_path),
        "bias": bias.summarise(_bias_rows(1e-3, 1e-5, {"stats": -9e-4, "accum": -2e-4, "stats+accum": 1.03e-3}, seeds=FEW), tmp_path),
    }


def test_from_3_seeds_no_figure_gives_a_verdict_and_each_says_why(tmp_path):
    """Where 5 seeds hold or fail (the tests above), 3 seeds give 'not measurable': every part that
    rests on the seeds shows its range of 3 and RANGE_NO_VERDICT; a part true by construction stays so."""
    for name, summary in _few_seed_summaries(tmp_path).items():
        assert summary["status"] == NOT_MEASURABLE and summary["verdict"].startswith("– not measurable"), (name, summary["verdict"])
        assert not summary["claim_holds"] and summary["provenance"]["seeds"] == list(FEW)
        parts = summary["parts"] or {"": {"status": summary["status"], "detail": summary["verdict"]}}
        for part, verdict in parts.items():
            if verdict["status"] == BY_CONSTRUCTION:
                continue
            assert verdict["status"] == NOT_MEASURABLE and "[range of 3: " in verdict["detail"], (name, part, verdict)
            assert RANGE_NO_VERDICT in verdict["detail"], (name, part, verdict)


def test_a_stored_figure_summary_is_rejudged_under_the_house_rule(tmp_path):
    """docs/results keeps figure summaries without their records: numdev.figures.common.rejudged gives
    them the verdict the rule gives, the parts quoted in the caption included, and leaves every number."""
    from numdev.figures.common import rejudged
    from numdev.stats.verdicts import Verdict, combine

    five = fig6.summarise(_fig6_rows(-0.5), tmp_path)
    assert rejudged(five) == five  # made under the rule: its own rejudge
    # A 3-seed summary as the code before the rule wrote it: (a) and (c) holding on a range of 3.
    old_parts = {
        "(a) bf16": Verdict(HOLDS, "ra", "bf16 geometric-mean error ratio swapped/original 1.47 [range of 3: 1.16, 1.69]"),
        "(b) bf16": Verdict(BY_CONSTRUCTION, "rb", "0 at every seed and tile: bit-identical, as built"),
        "(c) bf16": Verdict(HOLDS, "rc", "log-log slope -0.134 [range of 3: -0.189, -0.0622]; 3 of 3 seeds' slopes decreasing; t-test p = 0.035 (df 2)"),
    }
    old_verdict = combine(old_parts)
    old = {**five, "status": old_verdict.status, "verdict": old_verdict.text(), "verdict_rule": old_verdict.rule,
           "claim_holds": False, "parts": {k: v.as_dict() for k, v in old_parts.items()},
           "caption": "Judged at bf16: " + "; ".join(f"{k}: {v.text()}" for k, v in old_parts.items()) + ". 3 seed(s)."}
    assert old["status"] == PARTLY
    new = rejudged(old)
    assert new["status"] == NOT_MEASURABLE and new["verdict"].startswith("– not measurable: (a) bf16: – not measurable: ")
    assert {k: v["status"] for k, v in new["parts"].items()} == {"(a) bf16": NOT_MEASURABLE, "(b) bf16": BY_CONSTRUCTION,
                                                                 "(c) bf16": NOT_MEASURABLE}
    assert new["caption"] == ("Judged at bf16: " + "; ".join(f"{k}: {Verdict(**v).text()}" for k, v in new["parts"].items())
                              + ". 3 seed(s).")
    assert "✓" not in new["caption"] + new["verdict"] and new["caption"].count(RANGE_NO_VERDICT) == 2
    assert {k: v for k, v in new.items() if k not in ("status", "verdict", "parts", "caption")} == \
        {k: v for k, v in old.items() if k not in ("status", "verdict", "parts", "caption")}
    assert rejudged(new) == new


def test_fig5_a_max_quantised_to_the_outputs_ulp_is_not_judged_for_growth(tmp_path):
    """A real kernel's max |flash − baseline| on a 16-bit output is one ulp at every N: that part is not
    measurable (the metric cannot move), not a failure of the claim; mean and std still judge growth, and
    a max that does move (two seeds' values apart) is still judged."""
    rows = _fig5_rows(0.5)
    for r in rows:
        if r["kind"] == "pair" and r["setting"] == "real_kernel":
            r["metrics.max_abs"] = 2.0**-8
    parts = fig5.summarise(rows, tmp_path)["parts"]
    assert parts["real_kernel max |Δ|"]["status"] == NOT_MEASURABLE and "ulps" in parts["real_kernel max |Δ|"]["detail"]
    assert parts["real_kernel mean |Δ|"]["status"] == HOLDS and parts["paper_like max |Δ|"]["status"] == HOLDS
    flat = fig5.summarise(_fig5_rows(0.0), tmp_path)["parts"]
    assert flat["real_kernel max |Δ|"]["status"] == FAILS  # flat but not quantised: evidence against growth


def test_reconcile_counts_two_names_for_the_same_numbers_once():
    """The cpu_sdpa model gives PyTorch's CPU kernel's bits: its ratio to eager PyTorch's Baseline is the
    kernel's, and the two are one part (one piece of evidence), not two that hold together; a kernel whose
    numbers differ is its own part."""
    from numdev.figures import reconcile
    from numdev.stats.intervals import replicate_spread

    def cell(*values):
        e = replicate_spread(list(values))
        return {"max_abs": e, "mean_abs": e}

    key = reconcile._key
    r = {key(inputs="uniform", variant="fa1", formats="paper", tiles=t): cell(*v)
         for t, v in (("16", (3.0, 3.1, 3.2, 3.05, 3.15)), ("64", (2.0, 2.1, 2.2, 2.05, 2.15)))}
    kernel, model = ("sdpa_flash", "uniform", "None", "None", "None"), ("cpu_sdpa", "uniform", "None", "None", "None")
    r[kernel] = r[model] = cell(0.5, 0.5, 0.5, 0.5, 0.5)
    eager = {kernel: cell(0.8, 0.85, 0.9, 0.82, 0.88), model: cell(0.8, 0.85, 0.9, 0.82, 0.8801)}  # 1e-6 of outputs apart
    parts = reconcile.sentences(r, "64", {"16": 16, "64": 64}, {}, eager)[0]
    merged = [name for name in parts if "below eager" in name]
    assert merged == ["cpu_sdpa emulation = PyTorch's CPU flash kernel (the same numbers to 1e-3: one piece of evidence) below eager "
                      "PyTorch's Baseline"] and parts[merged[0]].status == HOLDS
    eager[model] = cell(0.7, 0.75, 0.72, 0.74, 0.71)
    parts = reconcile.sentences(r, "64", {"16": 16, "64": 64}, {}, eager)[0]
    assert sorted(name for name in parts if "below eager" in name) == [
        "PyTorch's CPU flash kernel below eager PyTorch's Baseline", "cpu_sdpa emulation below eager PyTorch's Baseline"]
