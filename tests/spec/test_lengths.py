"""Length distributions: pmf, exact truncated mean, expected max, sampling, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetrl.errors import SpecError
from hetrl.spec.lengths import LengthDist
from hetrl.spec.presets import PAPER_PROMPT_LENGTH, PAPER_RESPONSE_LENGTH


def test_paper_lengths_are_mean_256_and_512_max_1024():
    assert (PAPER_PROMPT_LENGTH.mean, PAPER_PROMPT_LENGTH.max) == (256, 1024)
    assert (PAPER_RESPONSE_LENGTH.mean, PAPER_RESPONSE_LENGTH.max) == (512, 1024)


@pytest.mark.parametrize("dist", [PAPER_PROMPT_LENGTH, PAPER_RESPONSE_LENGTH])
def test_pmf_sums_to_one_and_truncated_mean_is_exact(dist):
    pmf = dist.pmf()
    assert pmf.shape == (dist.max - dist.min + 1,)
    assert (pmf >= 0).all()
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert float(np.dot(dist.support(), pmf)) == pytest.approx(dist.mean, abs=1e-6)
    assert dist.cdf()[-1] == 1.0


@given(frac=st.floats(1e-9, 1 - 1e-9), std=st.floats(0.5, 1e4), lo=st.integers(1, 64),
       span=st.integers(1, 2048))
def test_truncnorm_mean_is_the_requested_mean(frac, std, lo, span):
    # Also when the latent normal must sit far outside [min, max] (mean near an end, large std).
    mean = lo + frac * span
    dist = LengthDist(mean=mean, max=lo + span, min=lo, std=std)
    pmf = dist.pmf()
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert float(np.dot(dist.support(), pmf)) == pytest.approx(mean, abs=1e-6)


@pytest.mark.parametrize("mean,std", [(1023.9999, 0.001), (1023.999999999, 1e-6), (16.0000001, 1e-6)])
def test_truncnorm_mean_a_hair_from_an_end_with_a_tiny_std(mean, std):
    # Regression: the hand-normalised weights went 0/0 (NaN) while the location was solved and
    # the pmf ended on the wrong token count; estimate then priced ~0 s per iteration.
    dist = LengthDist(mean=mean, max=1024, min=16, std=std)
    pmf = dist.pmf()
    assert np.isfinite(pmf).all() and pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert float(np.dot(dist.support(), pmf)) == pytest.approx(mean, abs=1e-3)


def test_truncnorm_mean_near_the_minimum_with_wide_std():
    # Regression: the latent location's search bracket used to be too narrow here (20.03).
    dist = LengthDist(mean=20, max=1024, min=16, std=127)
    assert float(np.dot(dist.support(), dist.pmf())) == pytest.approx(20, abs=1e-6)


def test_expected_max_of_one_draw_is_the_mean():
    assert PAPER_RESPONSE_LENGTH.expected_max(1) == pytest.approx(512, abs=1e-6)
    assert PAPER_RESPONSE_LENGTH.expected_max(0) == 0.0


def test_expected_max_increases_with_n_and_stays_below_max():
    d = PAPER_RESPONSE_LENGTH
    values = [d.expected_max(n) for n in (1, 2, 8, 64, 384, 3072)]
    assert all(a < b for a, b in zip(values, values[1:], strict=False))
    assert values[-1] <= d.max
    assert values[-1] > 1000  # 3072 responses almost surely reach close to the 1024 cap


def test_expected_max_hand_checked_on_two_point_uniform():
    # Uniform on {1, 2}: max of two draws is 1 with prob 1/4, else 2 -> 1.75.
    d = LengthDist(mean=1.5, max=2, min=1, kind="uniform")
    assert d.expected_max(2) == pytest.approx(1.75)
    assert d.quantile(0.5) == 1 and d.quantile(0.51) == 2


def test_fixed_kind():
    d = LengthDist.fixed(128)
    assert (d.mean, d.min, d.max, d.kind) == (128, 128, 128, "fixed")
    assert d.pmf().tolist() == [1.0]
    assert d.expected_max(1000) == 128
    assert LengthDist.from_dict(128) == d
    assert LengthDist.from_dict({"kind": "fixed", "max": 128}) == d


def test_uniform_kind():
    d = LengthDist.from_dict({"kind": "uniform", "min": 1, "max": 100})
    assert d.mean == 50.5
    assert np.allclose(d.pmf(), 0.01)
    assert d.quantile(0.25) == 25


def test_sampling_is_deterministic_by_seed_and_in_range():
    d = PAPER_RESPONSE_LENGTH
    a = d.sample(np.random.default_rng(7), 5000)
    b = d.sample(np.random.default_rng(7), 5000)
    c = d.sample(np.random.default_rng(8), 5000)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.min() >= d.min and a.max() <= d.max
    assert abs(a.mean() - d.mean) < 15  # std 256/sqrt(5000) ~ 3.6 tokens


def test_round_trip():
    for d in (PAPER_PROMPT_LENGTH, PAPER_RESPONSE_LENGTH, LengthDist.fixed(64),
              LengthDist(mean=5.5, max=10, kind="uniform")):
        assert LengthDist.from_dict(d.to_dict()) == d


@pytest.mark.parametrize(("data", "field", "problem"), [
    ({"mean": 2000, "max": 1024, "std": 100}, "response_length.mean", "must be in [min=1, max=1024]"),
    ({"mean": 512, "max": 1024, "std": 0}, "response_length.std", "must be > 0"),
    ({"mean": 512, "max": 1024, "std": -5}, "response_length.std", "must be > 0"),
    ({"mean": 512, "max": 1024}, "response_length.std", "must be > 0"),
    ({"mean": 512, "max": 1024, "std": 5, "min": 0}, "response_length.min", "[1, max=1024]"),
    ({"mean": 512, "max": 1024.5, "std": 5}, "response_length.max", "integer"),
    ({"mean": "long", "max": 1024, "std": 5}, "response_length.mean", "must be a number"),
    ({"mean": 512, "max": 1024, "std": 5, "kind": "zipf"}, "response_length.kind", "must be one of"),
    ({"mean": 10, "max": 100, "kind": "uniform"}, "response_length.mean", "(min+max)/2"),
    ({"mean": 10, "max": 100, "min": 10, "kind": "fixed"}, "response_length.mean", "must equal max"),
    ({"mean": 1024, "max": 1024, "std": 5}, "response_length.mean", "strictly inside"),
    ({"mean": 512}, "response_length.max", "is required"),
    ({"mean": 512, "max": 1024, "std": 5, "p99": 900}, "response_length.p99", "unknown key"),
    ({"mean": 512, "max": 1024, "std": 1e-300}, "response_length.std", "must be in [1e-06, 1e+09]"),
    ({"mean": 512, "max": 1024, "std": 1e300}, "response_length.std", "must be in [1e-06, 1e+09]"),
    ({"mean": 500.5, "max": 1024, "std": 1e-6}, "response_length.mean", "cannot be reached"),
])
def test_bad_values_are_rejected_with_the_field(data, field, problem):
    with pytest.raises(SpecError) as err:
        LengthDist.from_dict(data, field="response_length")
    assert err.value.field == field
    assert problem in str(err.value)
