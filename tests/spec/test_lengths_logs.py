"""Length distributions as RL training logs report them: lognormal, clip_ratio, empirical.

verl prints ``response_length/mean``, ``/max`` and ``/clip_ratio`` per step; these are the
numbers a ``lognormal`` length takes. The rows quoted are S12 (verl GRPO, Qwen2.5-7B, 1024
prompts x 5: response mean 232, max 1024) and S18 (verl GRPO, Llama-3.2-1B, 1024 prompts x 5:
mean 183.2, max 1024, clip_ratio 0.003).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import lognorm, norm

from hetrl.cost.lengths import length_stats
from hetrl.errors import SpecError
from hetrl.spec.lengths import MAX_QUANTILE, LengthDist
from hetrl.spec.workload import WorkloadSpec

S12 = {"kind": "lognormal", "mean": 232, "max": 1024}
S18 = {"kind": "lognormal", "mean": 183.2, "max": 1024, "clip_ratio": 0.003}
BATCH = 1024 * 5  # both rows: 1024 prompts x 5 responses


def _mean(d: LengthDist) -> float:
    return float(np.dot(d.support(), d.pmf()))


# --- an independent lognormal, from scipy.stats.lognorm alone ---
def _scipy_shape(mean: float, cap: int, q: float = MAX_QUANTILE) -> float:
    """The narrower lognormal shape of this mean whose q-quantile is the cap (scipy's ppf,
    which rises with the shape up to the standard normal's q point)."""
    return brentq(lambda s: lognorm.ppf(q, s, scale=mean * np.exp(-s * s / 2)) - cap, 1e-6,
                  norm.ppf(q))


def _scipy_pmf(shape: float, lo: int, hi: int, mean: float) -> tuple[np.ndarray, float]:
    """lognorm(shape, scale) rounded to integers and truncated to [lo, hi], scale solved so that
    the mean is ``mean``; and that scale."""
    lengths = np.arange(lo, hi + 1)
    edges = np.append(lengths - 0.5, hi + 0.5)

    def pmf(scale: float) -> np.ndarray:
        mass = np.diff(lognorm.cdf(edges, shape, scale=scale))
        return mass / mass.sum()

    scale = brentq(lambda sc: float(lengths @ pmf(sc)) - mean, mean / 20, mean * 20, xtol=1e-13)
    return pmf(scale), scale


def _monte_carlo_max(d: LengthDist, n: int, batches: int, seed: int = 0) -> tuple[float, float]:
    """Mean and standard error of the longest of n draws with ``LengthDist.sample``."""
    rng = np.random.default_rng(seed)
    longest = d.sample(rng, n * batches).reshape(batches, n).max(axis=1)
    return float(longest.mean()), float(longest.std(ddof=1) / np.sqrt(batches))


# --- lognormal: exact means ---
@pytest.mark.parametrize("data", [
    S12, S18,
    {"kind": "lognormal", "mean": 232, "max": 1024, "std": 150},
    {"kind": "lognormal", "mean": 183.2, "max": 1024, "std": 120, "clip_ratio": 0.003},
    {"kind": "lognormal", "mean": 900, "max": 1024, "min": 16, "clip_ratio": 0.3},
    {"kind": "lognormal", "mean": 20, "max": 1024, "min": 16, "std": 127},
    {"kind": "lognormal", "mean": 1023.9, "max": 1024, "std": 5},
    {"kind": "lognormal", "mean": 3000, "max": 32768},
])
def test_lognormal_mean_is_exact(data):
    d = LengthDist.from_dict(data)
    pmf = d.pmf()
    assert pmf.shape == (d.max - d.min + 1,) and (pmf >= 0).all()
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert _mean(d) == pytest.approx(data["mean"], abs=1e-6)
    assert d.expected_max(1) == pytest.approx(data["mean"], abs=1e-6)
    if "clip_ratio" in data:
        assert pmf[-1] == pytest.approx(data["clip_ratio"], abs=1e-15)


@settings(max_examples=60, deadline=None)
@given(frac=st.floats(1e-6, 1 - 1e-6), std=st.one_of(st.just(0.0), st.floats(0.5, 1e4)),
       lo=st.integers(1, 64), span=st.integers(2, 4096),
       clip=st.sampled_from([0.0, 0.003, 0.05]))
def test_lognormal_mean_is_the_requested_mean(frac, std, lo, span, clip):
    # Also a mean a hair from an end (the location then sits far outside the lengths).
    hi = lo + span
    body_lo, body_hi = lo, hi - 1 if clip else hi
    body = body_lo + frac * (body_hi - body_lo)
    mean = (1 - clip) * body + clip * hi
    if std == 0 and math.log(hi / body) >= norm.ppf(MAX_QUANTILE) ** 2 / 2:
        return  # no lognormal of that mean has max at its 0.999 quantile: an error, tested below
    d = LengthDist(kind="lognormal", mean=mean, max=hi, min=lo, std=std, clip_ratio=clip)
    assert d.pmf().sum() == pytest.approx(1.0, abs=1e-12)
    assert _mean(d) == pytest.approx(mean, abs=1e-6 * hi)
    assert d.pmf()[-1] >= clip


@pytest.mark.parametrize(("mean", "std"), [(232, 0.0), (183.2, 0.0), (232, 150.0), (60, 400.0)])
def test_lognormal_is_scipys_lognorm_rounded_and_truncated(mean, std):
    # Without std, max is the 0.999 quantile of the untruncated lognormal of that mean; with std,
    # the shape is that of the untruncated lognormal of that mean and std. The location is then
    # re-solved for the truncated mean: the pmf must be scipy's, built independently here.
    d = LengthDist(kind="lognormal", mean=mean, max=1024, std=std)
    shape = _scipy_shape(mean, 1024) if std == 0 else math.sqrt(math.log1p((std / mean) ** 2))
    if std == 0:
        untruncated = lognorm(shape, scale=mean * math.exp(-shape * shape / 2))
        assert untruncated.mean() == pytest.approx(mean, rel=1e-12)
        assert untruncated.ppf(MAX_QUANTILE) == pytest.approx(1024, rel=1e-9)
    else:
        assert lognorm(shape, scale=mean * math.exp(-shape * shape / 2)).std() == pytest.approx(std)
    np.testing.assert_allclose(d.pmf(), _scipy_pmf(shape, 1, 1024, mean)[0], rtol=1e-7,
                               atol=1e-13)


def test_lognormal_is_long_tailed_compared_with_truncnorm_of_the_same_mean_and_std():
    log = LengthDist.from_dict(S12)
    pmf, lengths = log.pmf(), log.support()
    std = float(np.sqrt(pmf @ (lengths - 232.0) ** 2))
    normal = LengthDist(mean=232, max=1024, std=std)
    assert log.quantile(0.5) < normal.quantile(0.5) - 20 < 232  # skewed right: median far below
    assert log.quantile(0.999) > normal.quantile(0.999)


# --- clip_ratio ---
@pytest.mark.parametrize(("kind", "std"), [("truncnorm", 256.0), ("lognormal", 150.0)])
def test_clip_ratio_is_the_mass_at_max_over_the_kinds_body_below_it(kind, std):
    c, mean, cap = 0.05, 512.0, 1024
    d = LengthDist(kind=kind, mean=mean, max=cap, min=16, std=std, clip_ratio=c)
    pmf = d.pmf()
    assert pmf[-1] == pytest.approx(c, abs=1e-15)
    assert _mean(d) == pytest.approx(mean, abs=1e-9)
    body_mean = (mean - c * cap) / (1 - c)
    body = LengthDist(kind=kind, mean=body_mean, max=cap - 1, min=16, std=std)
    np.testing.assert_allclose(pmf[:-1] / (1 - c), body.pmf(), rtol=1e-9, atol=1e-15)
    assert d.quantile(1 - c + 1e-9) == cap and d.quantile(1 - c - 1e-3) < cap


def test_clip_ratio_zero_is_the_old_distribution_and_the_old_dict():
    old = LengthDist(mean=512, max=1024, min=16, std=256)
    assert LengthDist(mean=512, max=1024, min=16, std=256, clip_ratio=0) == old
    assert LengthDist.from_dict({"mean": 512, "max": 1024, "min": 16, "std": 256,
                                 "clip_ratio": 0}) == old
    # files written before these keys existed are written the same way
    assert old.to_dict() == {"mean": 512, "max": 1024, "min": 16, "std": 256, "kind": "truncnorm"}
    assert LengthDist.fixed(64).to_dict() == {"mean": 64, "max": 64, "min": 64, "std": 0.0,
                                              "kind": "fixed"}


def test_clip_ratio_round_trips_through_yaml():
    d = LengthDist.from_dict(S18, field="response_length")
    assert d.to_dict()["clip_ratio"] == 0.003
    assert LengthDist.from_dict(yaml.safe_load(yaml.safe_dump(d.to_dict()))) == d
    assert LengthDist.from_dict(yaml.safe_load("{kind: lognormal, mean: 183.2, max: 1024, "
                                               "clip_ratio: 0.003}")) == d


# --- empirical ---
HIST = [[100, 0.5], [20, 0.25], [1024, 0.125], [400, 0.125]]  # unsorted; 1024 is the cap


def test_empirical_derives_min_max_mean_and_sorts():
    d = LengthDist.from_dict({"kind": "empirical", "histogram": HIST})
    assert d.histogram == ((20, 0.25), (100, 0.5), (400, 0.125), (1024, 0.125))
    assert (d.min, d.max) == (20, 1024)
    assert d.mean == pytest.approx(0.25 * 20 + 0.5 * 100 + 0.125 * 400 + 0.125 * 1024)
    pmf = d.pmf()
    assert pmf[0] == 0.25 and pmf[100 - 20] == 0.5 and pmf[-1] == 0.125
    assert np.count_nonzero(pmf) == 4 and pmf.sum() == pytest.approx(1.0, abs=1e-15)
    assert _mean(d) == pytest.approx(d.mean, abs=1e-12)
    assert LengthDist.empirical(HIST) == d


def test_empirical_round_trip_and_hashable():
    d = LengthDist.empirical(HIST)
    data = d.to_dict()
    assert data["histogram"] == [[20, 0.25], [100, 0.5], [400, 0.125], [1024, 0.125]]
    assert LengthDist.from_dict(data) == d
    assert LengthDist.from_dict(json.loads(json.dumps(data))) == d
    assert LengthDist.from_dict(yaml.safe_load(yaml.safe_dump(data))) == d
    assert hash(LengthDist.from_dict(data)) == hash(d) and len({d, LengthDist.from_dict(data)}) == 1
    assert d.pmf() is LengthDist.from_dict(data).pmf()  # the cached pmf is shared by equal dists


def test_empirical_given_min_max_mean_are_checked():
    given = {"kind": "empirical", "histogram": HIST}
    assert LengthDist.from_dict({**given, "min": 1, "max": 2048}).support().size == 2048
    assert LengthDist.from_dict({**given, "mean": 233}).mean == 233  # 5 + 50 + 50 + 128
    for key, value, problem in [("min", 21, "shortest length (20)"),
                                ("max", 1000, "longest length (1024)"),
                                ("mean", 233.5, "histogram's mean, 233.0"),
                                ("std", 10, "must be 0 for kind 'empirical'"),
                                ("clip_ratio", 0.1, "share at max")]:
        with pytest.raises(SpecError) as err:
            LengthDist.from_dict({**given, key: value}, field="response_length")
        assert err.value.field == f"response_length.{key}"
        assert problem in str(err.value)


def test_shares_summing_to_one_within_tolerance_are_normalised():
    d = LengthDist.empirical([[10, 0.3333333], [20, 0.6666667]])
    assert d.pmf().sum() == 1.0 and d.pmf()[0] == pytest.approx(0.3333333, abs=1e-12)


# --- workloads ---
WORKLOAD = {"algorithm": "grpo", "reward": "rule", "model": "Qwen3-4B", "batch_prompts": 1024,
            "responses_per_prompt": 5,
            "prompt_length": {"kind": "empirical", "histogram": [[64, 0.5], [173, 0.5]]},
            "response_length": {"kind": "lognormal", "mean": 183.2, "max": 1024,
                                "clip_ratio": 0.003}}


def test_workload_from_a_log_line_round_trips():
    w = WorkloadSpec.from_dict(WORKLOAD)
    assert w.response_length == LengthDist.from_dict(S18)
    assert w.prompt_length.mean == pytest.approx(118.5) and w.prompt_length.max == 173
    d = w.to_dict()
    assert WorkloadSpec.from_dict(d) == w
    assert WorkloadSpec.from_dict(json.loads(json.dumps(d))) == w
    assert WorkloadSpec.from_dict(yaml.safe_load(yaml.safe_dump(d))) == w
    # the cost model reads the pmf: survival at the last decode step is the clipped share
    stats = length_stats(w)
    assert stats.response_mean == pytest.approx(183.2, abs=1e-9)
    assert stats.survival[-1] == pytest.approx(0.003, abs=1e-12)
    assert stats.prompt_mean == pytest.approx(118.5)


@pytest.mark.parametrize(("change", "field", "problem"), [
    ({"clip_ratio": 1.5}, "response_length.clip_ratio", "must be in [0, 1)"),
    ({"clip_ratio": True}, "response_length.clip_ratio", "must be a number"),
    ({"histogram": [[1, 1.0]]}, "response_length.histogram", "only for kind 'empirical'"),
    ({"std": -1}, "response_length.std", "must be 0 (shape from max)"),
])
def test_workload_errors_name_the_length_field(change, field, problem):
    data = {**WORKLOAD, "response_length": {**WORKLOAD["response_length"], **change}}
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_dict(data)
    assert err.value.field == field and problem in str(err.value)


# --- expected_max ---
@pytest.mark.parametrize(("data", "n"), [
    (S12, 5), (S12, 64), (S18, 64), (S18, 1024),
    ({"kind": "lognormal", "mean": 300, "max": 2048, "std": 400, "clip_ratio": 0.01}, 16),
    ({"kind": "empirical", "histogram": HIST}, 3),
])
def test_expected_max_agrees_with_monte_carlo(data, n):
    d = LengthDist.from_dict(data)
    got, se = _monte_carlo_max(d, n, batches=4000 if n < 100 else 400)
    assert abs(d.expected_max(n) - got) < 4 * se + 1e-9
    assert d.expected_max(n) >= d.expected_max(n - 1)


def test_expected_max_is_scipys_order_statistic():
    # E[max of n] = min + sum over L in [min, max) of 1 - G(L)^n, G the cdf of scipy's rounded,
    # truncated lognorm; and a Monte Carlo over lognorm's own sampler (rounded, kept in range).
    d = LengthDist.from_dict(S12)
    pmf, scale = _scipy_pmf(_scipy_shape(232, 1024), 1, 1024, 232)
    cdf = np.cumsum(pmf)
    for n in (1, 5, 100, BATCH):
        assert d.expected_max(n) == pytest.approx(1 + float(np.sum(1 - cdf[:-1] ** n)), abs=1e-6)
    draws = np.rint(lognorm.rvs(_scipy_shape(232, 1024), scale=scale, size=1_100_000,
                                random_state=np.random.default_rng(1)))
    draws = draws[(draws >= 1) & (draws <= 1024)]  # truncation: about 0.1% fall above the cap
    n, batches = 1000, 1000
    longest = draws[: n * batches].reshape(batches, n).max(axis=1)
    se = longest.std(ddof=1) / np.sqrt(batches)
    assert abs(longest.mean() - d.expected_max(n)) < 4 * se
    assert draws.mean() == pytest.approx(232, abs=4 * draws.std() / np.sqrt(draws.size))


def test_worked_examples_from_verl_logs():
    # S12: response mean 232, max 1024; 5120 responses per step. A synchronous batch decodes
    # until its longest ends: about 999 steps, 4.3 x the mean.
    s12 = LengthDist.from_dict(S12, field="response_length")
    assert s12.expected_max(BATCH) == pytest.approx(998.6, abs=0.1)
    assert s12.expected_max(BATCH) > 4 * s12.mean
    assert s12.expected_max(5) == pytest.approx(394.4, abs=0.1)  # one prompt's group of 5
    assert s12.quantile(0.5) == 203  # the median, below the mean: long-tailed
    # S18: mean 183.2, max 1024, clip_ratio 0.003: 0.3% of 5120 (~15 responses) hit the cap, so
    # the batch's longest is the cap all but surely: 1 - 0.997^5120 = 1 - 2e-7.
    s18 = LengthDist.from_dict(S18, field="response_length")
    assert s18.expected_max(BATCH) == pytest.approx(1024, abs=1e-4)
    assert 1024 - s18.expected_max(BATCH) < 1024 * 0.997**BATCH
    assert s18.expected_max(BATCH) / s18.mean > 5.5
    assert s18.expected_max(5) == pytest.approx(344.3, abs=0.1)


# --- errors ---
@pytest.mark.parametrize(("data", "field", "problem"), [
    ({**S18, "clip_ratio": True}, "response_length.clip_ratio", "must be a number"),
    ({**S18, "clip_ratio": "0.003"}, "response_length.clip_ratio", "must be a number"),
    ({**S18, "clip_ratio": float("nan")}, "response_length.clip_ratio", "must be finite"),
    ({**S18, "clip_ratio": -0.1}, "response_length.clip_ratio", "must be in [0, 1)"),
    ({**S18, "clip_ratio": 1}, "response_length.clip_ratio", "must be in [0, 1)"),
    ({**S18, "clip_ratio": 0.5}, "response_length.clip_ratio", "lower clip_ratio or raise mean"),
    ({"kind": "truncnorm", "mean": 1023.5, "max": 1024, "std": 10, "clip_ratio": 0.1},
     "response_length.mean", "must be below max - 1 + clip_ratio = 1023.1"),
    ({"kind": "lognormal", "mean": 5.5, "max": 6, "min": 5, "clip_ratio": 0.5},
     "response_length.clip_ratio", "at least two lengths below max"),
    ({"kind": "fixed", "max": 64, "clip_ratio": 0.1}, "response_length.clip_ratio",
     "must be 0 for kind 'fixed'"),
    ({"kind": "uniform", "max": 64, "clip_ratio": 0.1}, "response_length.clip_ratio",
     "must be 0 for kind 'uniform'"),
    ({"kind": "lognormal", "mean": 5, "max": 1024}, "response_length.mean",
     "no lognormal of that mean has max=1024 at its 0.999 quantile; give std"),
    ({"kind": "lognormal", "mean": 232, "max": 1024, "std": -3}, "response_length.std",
     "must be 0 (shape from max) or in [1e-06, 1e+09]"),
    ({"kind": "lognormal", "mean": 1024, "max": 1024}, "response_length.mean", "strictly inside"),
    ({"kind": "lognormal", "mean": 232}, "response_length.max", "is required"),
    ({"kind": "lognormal", "mean": 232, "max": 1024, "p99": 900}, "response_length.p99",
     "unknown key"),
    ({"kind": "empirical"}, "response_length.histogram", "non-empty list of [length, share]"),
    ({"kind": "empirical", "histogram": []}, "response_length.histogram", "non-empty list"),
    ({"kind": "empirical", "histogram": {"100": 1.0}}, "response_length.histogram",
     "non-empty list"),
    ({"kind": "empirical", "histogram": [[100, 0.5, 3]]}, "response_length.histogram[0]",
     "[length, share] pair"),
    ({"kind": "empirical", "histogram": [100, 1.0]}, "response_length.histogram[0]",
     "[length, share] pair"),
    ({"kind": "empirical", "histogram": [[0, 1.0]]}, "response_length.histogram[0][0]",
     "integer length in [1, 1048576]"),
    ({"kind": "empirical", "histogram": [[10.0, 1.0]]}, "response_length.histogram[0][0]",
     "integer length"),
    ({"kind": "empirical", "histogram": [[True, 1.0]]}, "response_length.histogram[0][0]",
     "integer length"),
    ({"kind": "empirical", "histogram": [[10, 0.5], [20, 0]]}, "response_length.histogram[1][1]",
     "finite share > 0"),
    ({"kind": "empirical", "histogram": [[10, True]]}, "response_length.histogram[0][1]",
     "finite share > 0"),
    ({"kind": "empirical", "histogram": [[10, "1"]]}, "response_length.histogram[0][1]",
     "finite share > 0"),
    ({"kind": "empirical", "histogram": [[10, 0.5], [10, 0.5]]}, "response_length.histogram",
     "lists this length twice"),
    ({"kind": "empirical", "histogram": [[10, 0.5], [20, 0.4]]}, "response_length.histogram",
     "shares must sum to 1"),
    ({"kind": "empirical", "histogram": [[10, 50], [20, 50]]}, "response_length.histogram",
     "shares must sum to 1"),
    ({"kind": "lognormal", "mean": 232, "max": 1024, "histogram": [[10, 1.0]]},
     "response_length.histogram", "only for kind 'empirical'"),
])
def test_bad_values_are_rejected_with_the_field(data, field, problem):
    with pytest.raises(SpecError) as err:
        LengthDist.from_dict(data, field="response_length")
    assert err.value.field == field
    assert problem in str(err.value)
