"""Weight distances: every metric equals its direct formula or SciPy, the unindexed embedding rows are
their own set, two initialisations are told apart, and architecture checks."""

import numpy as np
import pytest
import scipy.stats
import torch
from helpers import compose_train
from hydra.utils import instantiate
from hypothesis import given, settings
from hypothesis import strategies as st

from numdev.runs.layout import MODEL_ROW
from numdev.train.run import build_model
from numdev.weights.distances import (
    compare,
    distance_rows,
    max_abs_difference,
    prepare,
    wasserstein_1d,
    weight_distances,
)
from numdev.weights.metrics import DISTANCE_COLUMNS

DISTRIBUTIONS = {
    "normal": lambda rng, n: rng.standard_normal(n),
    "uniform": lambda rng, n: rng.uniform(-3, 1, n),
    "heavy": lambda rng, n: rng.standard_t(2, n),
    "discrete": lambda rng, n: rng.integers(-3, 4, n).astype(float),  # many ties
    "weights": lambda rng, n: rng.standard_normal(n) * 0.02 + rng.binomial(1, 0.01, n) * 0.5,
}


@settings(max_examples=60, deadline=None)
@given(
    n_u=st.integers(1, 3000),
    n_v=st.integers(1, 3000),
    dist_u=st.sampled_from(sorted(DISTRIBUTIONS)),
    dist_v=st.sampled_from(sorted(DISTRIBUTIONS)),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_wasserstein_equals_scipy(n_u, n_v, dist_u, dist_v, seed, dtype):
    rng = np.random.default_rng(seed)
    u = torch.from_numpy(DISTRIBUTIONS[dist_u](rng, n_u)).to(dtype)
    v = torch.from_numpy(DISTRIBUTIONS[dist_v](rng, n_v) * rng.uniform(0.5, 2)).to(dtype)
    expected = scipy.stats.wasserstein_distance(u.double().numpy(), v.double().numpy())
    assert wasserstein_1d(u, v) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_wasserstein_on_real_weights_of_different_sizes():
    torch.manual_seed(0)
    a = torch.nn.Linear(300, 200).weight.detach()
    b = torch.nn.Linear(300, 170).weight.detach() + 0.001
    expected = scipy.stats.wasserstein_distance(a.double().flatten().numpy(), b.double().flatten().numpy())
    assert wasserstein_1d(a, b) == pytest.approx(expected, rel=1e-9)
    assert wasserstein_1d(a.bfloat16(), a.bfloat16()) == 0.0


def test_identical_weights_read_exactly_zero_and_perturbed_read_positive():
    torch.manual_seed(0)
    state = {"w": torch.randn(64, 32), "b": torch.randn(32)}
    same = weight_distances(state, {k: v.clone() for k, v in state.items()})
    zero = {"max_abs": 0.0, "mean_abs": 0.0, "rel_frobenius": 0.0, "wasserstein": 0.0, "w1_over_std": 0.0, "pooled_wasserstein": 0.0}
    assert {k: v for k, v in same["model"].items() if k != "numel"} == zero
    assert all({k: v for k, v in m.items() if k != "numel"} == zero for m in same["per_tensor"].values())
    perturbed = {k: v.clone() for k, v in state.items()}
    perturbed["w"][3, 4] += 1e-3
    moved = weight_distances(perturbed, state)
    assert moved["per_tensor"]["w"]["max_abs"] == pytest.approx(1e-3, rel=1e-3)
    assert moved["per_tensor"]["b"]["max_abs"] == 0.0 and moved["per_tensor"]["b"]["wasserstein"] == 0.0
    assert moved["model"]["wasserstein"] > 0 and moved["model"]["pooled_wasserstein"] > 0


def _hand_built(seed=0):
    """Two runs' state dicts: an embedding (only rows 1, 4, 7 indexed), a weight, a zero-initialised bias."""
    g = torch.Generator().manual_seed(seed)
    b = {"emb": torch.randn(10, 3, generator=g) * 0.02, "w": torch.randn(20, 7, generator=g), "bias": torch.zeros(5)}
    a = {k: v + torch.randn(v.shape, generator=g) * 1e-2 for k, v in b.items()}
    a["emb"][[0, 2, 3, 5, 6, 8, 9]] = torch.randn(7, 3, generator=g) * 0.02  # another draw of the unindexed rows
    return a, b, {"emb": np.array([1, 4, 7])}


def test_every_metric_equals_its_direct_formula_and_scipy():
    a, b, rows = _hand_built()
    got = compare(prepare(a, rows), prepare(b, rows))
    f64 = lambda t: t.double().numpy().reshape(-1)  # noqa: E731
    unindexed = [0, 2, 3, 5, 6, 8, 9]
    sets = {
        "bias": (f64(a["bias"]), f64(b["bias"])),
        "emb": (f64(a["emb"][[1, 4, 7]]), f64(b["emb"][[1, 4, 7]])),
        "emb[unindexed]": (f64(a["emb"][unindexed]), f64(b["emb"][unindexed])),
        "w": (f64(a["w"]), f64(b["w"])),
    }
    assert list(got["per_tensor"]) == sorted(sets)
    for name, (x, y) in sets.items():
        m = got["per_tensor"][name]
        w1 = scipy.stats.wasserstein_distance(x, y)
        assert m["numel"] == x.size
        assert m["max_abs"] == np.abs(x - y).max()  # exact
        assert m["mean_abs"] == pytest.approx(np.abs(x - y).mean(), rel=1e-6)
        assert m["wasserstein"] == pytest.approx(w1, rel=1e-6) and m["pooled_wasserstein"] == m["wasserstein"]
        if np.std(y) > 0:
            assert m["rel_frobenius"] == pytest.approx(np.linalg.norm(x - y) / np.linalg.norm(y), rel=1e-6)
            assert m["w1_over_std"] == pytest.approx(w1 / np.std(y), rel=1e-6)
        else:  # the zero-initialised bias: a difference over a zero reference
            assert m["rel_frobenius"] == np.inf and m["w1_over_std"] == np.inf
    trained = ["bias", "emb", "w"]
    x = np.concatenate([sets[n][0] for n in trained])
    y = np.concatenate([sets[n][1] for n in trained])
    model = got["model"]
    assert model["numel"] == x.size == 5 + 9 + 140
    assert model["max_abs"] == np.abs(x - y).max()
    assert model["mean_abs"] == pytest.approx(np.abs(x - y).mean(), rel=1e-6)
    assert model["rel_frobenius"] == pytest.approx(np.linalg.norm(x - y) / np.linalg.norm(y), rel=1e-6)
    per = {n: scipy.stats.wasserstein_distance(*sets[n]) for n in trained}
    assert model["wasserstein"] == pytest.approx(sum(per[n] * sets[n][0].size for n in trained) / x.size, rel=1e-6)
    scaled = [n for n in trained if np.std(sets[n][1]) > 0]  # the bias has no scale: left out, as documented
    expected = sum(per[n] / np.std(sets[n][1]) * sets[n][0].size for n in scaled) / sum(sets[n][0].size for n in scaled)
    assert model["w1_over_std"] == pytest.approx(expected, rel=1e-6)
    whole_a = np.concatenate([f64(a[k]) for k in a])  # the paper's: every value, unindexed rows included
    whole_b = np.concatenate([f64(b[k]) for k in b])
    assert model["pooled_wasserstein"] == pytest.approx(scipy.stats.wasserstein_distance(whole_a, whole_b), rel=1e-6)
    rows_out = distance_rows(7, got)
    assert rows_out[0]["tensor"] == MODEL_ROW and all(set(r) == set(DISTANCE_COLUMNS) for r in rows_out)


def test_max_abs_is_exact_where_float32_differences_round_to_a_tie():
    # 1 - (-2^-30) rounds to 1.0 in float32, as does 1 - 0: the exact maximum is still found.
    a = {"w": torch.tensor([1.0, 1.0, 0.5])}
    b = {"w": torch.tensor([-(2.0**-30), 0.0, 0.5])}
    got = weight_distances(a, b)
    assert got["per_tensor"]["w"]["max_abs"] == 1.0 + 2.0**-30 == got["model"]["max_abs"]


def test_two_initialisations_are_told_apart_by_the_position_aware_metrics():
    """Two independent draws of one initialisation share one histogram: pooled W1 is tiny, while
    mean |d| and ||d||/||W|| see two different models (||d||/||W|| ~ sqrt(2) for independent draws)."""
    models = [build_model(cfg, instantiate(cfg.attention)) for cfg in (compose_train(f"seed.init={s}") for s in (0, 1))]
    a, b = ({n: p.detach() for n, p in m.named_parameters()} for m in models)
    embedding = "text.encoder.token_embedding.weight"
    rows = {embedding: np.arange(0, 400)}
    model = weight_distances(a, b, rows)["model"]
    assert model["rel_frobenius"] > 1.2
    assert model["mean_abs"] > 1e-2
    assert model["pooled_wasserstein"] < model["mean_abs"] / 100
    assert model["w1_over_std"] < 0.2  # each set's histogram is the same too
    unindexed = weight_distances(a, b, rows)["per_tensor"][embedding + "[unindexed]"]
    assert unindexed["numel"] == (49408 - 400) * a[embedding].shape[1]


def test_max_abs_difference():
    a = torch.tensor([1.0, -2.0, 3.0])
    assert max_abs_difference(a, torch.tensor([1.0, -2.5, 3.25])) == 0.5
    with pytest.raises(ValueError, match="shapes"):
        max_abs_difference(a, torch.zeros(4))


def test_mismatched_architectures_name_the_tensor():
    a = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    with pytest.raises(ValueError, match="'w' has shape \\(2, 3\\).*\\(3, 2\\)"):
        weight_distances(a, {"w": torch.zeros(3, 2), "b": torch.zeros(3)})
    with pytest.raises(ValueError, match="only in the first: \\['b'\\]"):
        weight_distances(a, {"w": torch.zeros(2, 3)})


def test_nonfinite_weights_are_an_error():
    with pytest.raises(ValueError, match="NaN"):
        wasserstein_1d(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0]))


def test_the_pooled_sort_in_value_ranges_and_the_reused_sorts_equal_a_fresh_sort():
    g = torch.Generator().manual_seed(3)
    state = {"emb": torch.randn(3000, 64, generator=g) * 0.02, "w": torch.randn(300, 200, generator=g), "z": torch.zeros(7)}
    rows = {"emb": np.arange(0, 3000, 7)}
    fresh = prepare(state, rows, threads=1)
    ranged = prepare(state, rows, threads=3)
    whole = np.sort(np.concatenate([t.numpy().reshape(-1) for t in state.values()]))
    assert np.array_equal(fresh.pooled_sorted, whole) and np.array_equal(ranged.pooled_sorted, whole)
    moved = {k: v.clone() for k, v in state.items()}
    moved["w"] += 1e-3  # the unindexed embedding rows stay as they were, as in training
    again = prepare(moved, rows, threads=2, previous=ranged)
    assert again.sorted["emb[unindexed]"] is ranged.sorted["emb[unindexed]"]  # reused, not sorted again
    reference = prepare(moved, rows, threads=1)
    assert all(np.array_equal(again.sorted[n], reference.sorted[n]) for n in reference.sorted)
    assert np.array_equal(again.pooled_sorted, reference.pooled_sorted)
    assert again.std == reference.std and again.sum_squares == reference.sum_squares


# -- sorted values from disk (snapshot.sorted_values): used only after their checks, the same bits --------


class _Stored:
    """A stand-in for snapshot_store.SortedFile: the sets it holds, their split, and read()."""

    path = "stored.safetensors"

    def __init__(self, arrays: dict, rows=None):
        from numdev.runs.layout import POOLED, rows_digest

        self.arrays, self.sets, self.rows = arrays, [n for n in arrays if n != POOLED], rows_digest(rows)

    def read(self, name):
        return self.arrays[name].copy()


def _stored_of(state, rows):
    from numdev.runs.layout import POOLED

    fresh = prepare(state, rows)
    return _Stored({**fresh.sorted, POOLED: fresh.pooled_sorted}, rows)


def test_fingerprint_is_order_free_and_sees_one_ulp():
    from numdev.weights.distances import fingerprint

    rng = np.random.default_rng(0)
    v = np.concatenate([rng.standard_normal(5000), [0.0, -0.0, -0.0, 1e-45, -3.0e38]]).astype(np.float32)
    assert fingerprint(np.sort(v)) == fingerprint(v) == fingerprint(v[::-1].copy())
    assert fingerprint(np.float32([0.0, -0.0])) == fingerprint(np.float32([0.0, 0.0]))  # NumPy's sort may turn -0 into +0
    flipped = v.copy()
    flipped[5] = -flipped[5]  # a sign: 2^31 apart in the patterns
    assert fingerprint(flipped) != fingerprint(v)
    moved = v.copy()
    moved[7] = np.nextafter(moved[7], np.float32(np.inf))
    assert fingerprint(moved) != fingerprint(v)
    both = v.copy()  # one value up one ulp and another down one ulp: the sum of patterns stays, the squares do not
    both.view(np.int32)[[3, 9]] += np.array([1, -1], np.int32)
    assert fingerprint(both)[1] == fingerprint(v)[1] and fingerprint(both) != fingerprint(v)


def test_stored_sorts_are_used_after_their_checks_and_give_the_same_bits():
    from numdev.runs.layout import POOLED

    a, b, rows = _hand_built()
    stored = _stored_of(b, rows)
    loaded = prepare(b, rows, stored=stored)
    assert loaded.stored_problem is None and set(loaded.stored) == {*stored.sets, POOLED}
    fresh = prepare(b, rows)
    assert all(np.array_equal(loaded.sorted[n], fresh.sorted[n]) for n in fresh.sorted)
    assert np.array_equal(loaded.pooled_sorted, fresh.pooled_sorted) and loaded.sum_squares == fresh.sum_squares
    assert compare(prepare(a, rows), loaded) == compare(prepare(a, rows), fresh)


def _swap_in_neighbour(arrays, name):  # still sorted, one value replaced by its neighbour: another multiset
    arrays[name][3] = arrays[name][4]


def _unsort(arrays, name):
    arrays[name][[0, -1]] = arrays[name][[-1, 0]]


def _nan(arrays, name):
    arrays[name][-1] = np.nan


def _shorten(arrays, name):
    arrays[name] = arrays[name][:-1]


@pytest.mark.parametrize("target", ["w", "__pooled__"])
@pytest.mark.parametrize("damage", [_swap_in_neighbour, _unsort, _nan, _shorten])
def test_stored_sorts_that_fail_a_check_are_sorted_here(damage, target):
    a, b, rows = _hand_built()
    stored = _stored_of(b, rows)
    damage(stored.arrays, target)
    loaded = prepare(b, rows, stored=stored)
    assert target not in loaded.stored and "stored.safetensors" in loaded.stored_problem
    assert compare(prepare(a, rows), loaded) == compare(prepare(a, rows), prepare(b, rows))


def test_stored_sorts_of_another_split_are_not_used_for_that_tensor():
    a, b, rows = _hand_built()
    stored = _stored_of(b, {"emb": np.array([1, 4])})  # written with other indexed rows
    loaded = prepare(b, rows, stored=stored)
    assert loaded.stored_problem is None
    assert "emb" not in loaded.stored and "emb[unindexed]" not in loaded.stored and "w" in loaded.stored
    assert compare(prepare(a, rows), loaded) == compare(prepare(a, rows), prepare(b, rows))


def test_a_set_unchanged_on_both_sides_is_not_compared_again_and_gives_the_same_bits():
    from numdev.weights.distances import CompareCache

    a, b, rows = _hand_built()
    cache = CompareCache()
    pa, pb = prepare(a, rows), prepare(b, rows)
    first = compare(pa, pb, cache=cache)
    a2 = {k: v.clone() for k, v in a.items()}
    a2["w"] += 1e-3
    pa2 = prepare(a2, rows, previous=pa)
    pb2 = prepare({k: v.clone() for k, v in b.items()}, rows, previous=pb)
    assert pa2.versions["bias"] == pa.versions["bias"] and pa2.versions["w"] != pa.versions["w"]
    assert pb2.pooled_sorted is pb.pooled_sorted  # nothing changed: not even the pooled values are sorted again
    again = compare(pa2, pb2, cache=cache)
    assert again == compare(prepare(a2, rows), prepare(b, rows)) and again != first
