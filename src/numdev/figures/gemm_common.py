"""What the matrix-product figures (gemm_formats, gemm_k, gemm_scaling) share: each method's
per-seed numbers, its recorded model (stage formats), and the bit-for-bit rule for real kernels."""

from __future__ import annotations

from numdev.figures.common import per_seed, select, split_finite
from numdev.stats.verdicts import FAILS, HOLDS, NOT_MEASURABLE, Verdict


def records(rows):
    """(the finite vs_golden records, a note on those left out)."""
    return split_finite(select(rows, "vs_golden"))


def labels(rows) -> list[str]:
    """Method labels in the order the records hold them."""
    return list(dict.fromkeys(r["method"] for r in rows))


def model_of(rows, label: str) -> dict:
    """The stage formats recorded for a method (`model.*` fields, without the prefix)."""
    row = next(r for r in rows if r["method"] == label)
    return {key[len("model."):]: value for key, value in row.items() if key.startswith("model.")}


def kind_of(rows, label: str) -> str:
    return str(next(r for r in rows if r["method"] == label)["knobs.method"])


def by_label(rows, metric: str, k: int | None = None) -> dict:
    """{label: {seed: value}} of one metric (at one K, if given)."""
    chosen = [r for r in rows if k is None or int(r["shape.k"]) == k]
    return per_seed(chosen, lambda r: r["method"], metric)


def bit_identity_verdict(rows, label: str) -> Verdict:
    """A real kernel gives its emulation's bits: every output of every seed and K identical."""
    rule = f"{label}: every output bit-identical to its emulation (numdev.gemm.kernels model), on every seed and K"
    shares = [float(r["metrics.bit_identical_to_model"]) for r in rows if r["method"] == label]
    if not shares:
        return Verdict(NOT_MEASURABLE, rule, "no records")
    detail = f"bit-identical share min {min(shares):.6g} over {len(shares)} record(s)"
    return Verdict(HOLDS if min(shares) == 1.0 else FAILS, rule, detail)
