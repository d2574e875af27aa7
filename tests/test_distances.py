"""Weight distances: Wasserstein-1 equals SciPy's, max |Δ|, and architecture checks."""

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from numdev.analysis.distances import max_abs_difference, wasserstein_1d, weight_distances

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
    assert same["model"] == {"max_abs": 0.0, "wasserstein": 0.0}
    assert all(m == {"max_abs": 0.0, "wasserstein": 0.0} for m in same["per_tensor"].values())
    perturbed = {k: v.clone() for k, v in state.items()}
    perturbed["w"][3, 4] += 1e-3
    moved = weight_distances(state, perturbed)
    assert moved["per_tensor"]["w"]["max_abs"] == pytest.approx(1e-3, rel=1e-3)
    assert moved["per_tensor"]["b"] == {"max_abs": 0.0, "wasserstein": 0.0}
    assert moved["model"]["wasserstein"] > 0


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
