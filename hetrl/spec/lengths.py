"""Token-length distributions (prompt and response lengths), discrete over [min, max].

A distribution is described by plain numbers (kind, mean, max, min, std, clip_ratio) or, for
``empirical``, a histogram; its probability mass function over integer token counts is derived
once and cached. For ``truncnorm`` and ``lognormal`` the underlying distribution's location is
solved so that the *truncated* distribution has exactly the requested mean: users state what
they observe (mean and max response length, and the share of responses cut at the cap, as RL
training logs print them: verl's ``response_length/mean``, ``/max``, ``/clip_ratio``), not a
latent parameter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr, softmax
from scipy.stats import norm

from hetrl.errors import SpecError, is_int, is_number, require, why_not_number
from hetrl.limits import MAX_SEQUENCE_TOKENS

KINDS = ("fixed", "uniform", "truncnorm", "lognormal", "empirical")
#: kinds that take a ``clip_ratio`` (a point mass at ``max`` beside a shaped body); an empirical
#: histogram states its share at the cap itself
CLIP_KINDS = ("truncnorm", "lognormal")
#: Longest prompt or response, tokens (hetrl.limits.MAX_SEQUENCE_TOKENS)
MAX_TOKENS = MAX_SEQUENCE_TOKENS
#: truncnorm's (and lognormal's) std, tokens: below, the mean is a step function of the
#: location; above, the variance overflows (a std of 1e9 is already uniform over any supported
#: range)
STD_RANGE = (1e-6, 1e9)
#: lognormal without ``std``: the shape puts ``max`` at this quantile of the untruncated
#: lognormal of the mean (of the lengths below the cap, with a clip_ratio). The longest of N
#: draws lies near the 1 - 1/N quantile, and an RL log's ``response_length/max`` is the longest
#: of a batch of 10^3 to 10^4 responses (0.999 to 0.9999); where it is the generation cap, it
#: bounds the batch's longest from above, so the lower end is taken (a higher quantile gives a
#: narrower shape: the same max reached farther out in the tail)
MAX_QUANTILE = 0.999
#: the standard normal's MAX_QUANTILE point (3.09)
_MAX_Z = float(norm.ppf(MAX_QUANTILE))
#: an empirical histogram's shares must sum to 1 within this (they are then divided by their sum)
SHARE_SUM_TOL = 1e-6
#: a derived pmf's mean may miss the stated mean by this share of max (tokens / tokens)
MEAN_TOL = 1e-6


@dataclass(frozen=True)
class LengthDist:
    """Integer token lengths in [min, max] with the given mean (tokens).

    kinds: ``fixed`` (every sequence has ``mean`` = ``max`` tokens), ``uniform`` over [min, max]
    (mean implied), ``truncnorm`` (normal with std ``std``, truncated to [min, max], mean exact),
    ``lognormal`` (long-tailed: the lognormal of std ``std`` at the mean, or without ``std`` the
    one whose :data:`MAX_QUANTILE` quantile is ``max``, rounded to integers and truncated to
    [min, max], mean exact), ``empirical`` (``histogram``: ((length, share), ...), sorted by
    length; shares sum to 1).

    ``clip_ratio`` (truncnorm, lognormal): the share of lengths at exactly ``max`` (responses cut
    at the generation cap); the kind then shapes the rest over [min, max - 1], with the mean that
    keeps the overall mean at ``mean``.
    """

    mean: float
    max: int
    min: int = 1
    std: float = 0.0
    kind: str = "truncnorm"
    clip_ratio: float = 0.0
    histogram: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        require(self.kind in KINDS, "length.kind", self.kind, f"must be one of {list(KINDS)}")
        for key in ("mean", "std", "clip_ratio"):
            value = getattr(self, key)
            unit = "a share in [0, 1)" if key == "clip_ratio" else "tokens"
            require(is_number(value), f"length.{key}", value,
                    f"must be a number ({unit}){why_not_number(value)}")
            require(math.isfinite(value), f"length.{key}", value, f"must be finite ({unit})")
        require(0 <= self.clip_ratio < 1, "length.clip_ratio", self.clip_ratio,
                "must be in [0, 1) (the share of lengths at max)")
        if self.kind == "empirical":
            require(not _empty(self.histogram), "length.histogram", self.histogram,
                    "is required for kind 'empirical': a list of [length, share] pairs")
            object.__setattr__(self, "histogram", _histogram(self.histogram, "length.histogram"))
        else:
            require(_empty(self.histogram), "length.histogram", self.histogram,
                    "is only for kind 'empirical' (set kind: empirical)")
            object.__setattr__(self, "histogram", ())
        require(is_int(self.max), "length.max", self.max, "must be an integer")
        require(1 <= self.max <= MAX_TOKENS, "length.max", self.max,
                f"must be in [1, {MAX_TOKENS}] tokens")
        require(is_int(self.min) and 1 <= self.min <= self.max, "length.min", self.min,
                f"must be an integer in [1, max={self.max}]")
        require(self.min <= self.mean <= self.max, "length.mean", self.mean,
                f"must be in [min={self.min}, max={self.max}]")
        if self.kind == "fixed":
            require(self.mean == self.max, "length.mean", self.mean,
                    f"must equal max ({self.max}) for kind 'fixed'")
        if self.kind == "uniform":
            require(abs(self.mean - (self.min + self.max) / 2) < 1e-9, "length.mean", self.mean,
                    f"must be (min+max)/2 = {(self.min + self.max) / 2} for kind 'uniform'")
        if self.clip_ratio > 0:
            self._check_clip()
        if self.kind == "truncnorm":
            require(self.std > 0, "length.std", self.std, "must be > 0 for kind 'truncnorm'")
            require(STD_RANGE[0] <= self.std <= STD_RANGE[1], "length.std", self.std,
                    f"must be in [{STD_RANGE[0]:g}, {STD_RANGE[1]:g}] tokens")
        if self.kind == "lognormal":
            require(self.std == 0 or STD_RANGE[0] <= self.std <= STD_RANGE[1], "length.std",
                    self.std, f"must be 0 (shape from max) or in [{STD_RANGE[0]:g}, "
                    f"{STD_RANGE[1]:g}] tokens for kind 'lognormal'")
        if self.kind in CLIP_KINDS:
            if self.min < self.max:
                require(self.min < self.mean < self.max, "length.mean", self.mean,
                        f"must lie strictly inside (min={self.min}, max={self.max})")
            _pmf(self)  # the truncated moments must be computable: say so now, by field
        if self.kind == "empirical":
            self._check_empirical()

    def _check_clip(self) -> None:
        """clip_ratio > 0: a kind with a body below the cap whose mean keeps ``mean`` exact."""
        require(self.kind in CLIP_KINDS, "length.clip_ratio", self.clip_ratio,
                f"must be 0 for kind '{self.kind}': only {list(CLIP_KINDS)} take a share at max"
                + (" (give it as the histogram's share at max)" if self.kind == "empirical"
                   else ""))
        require(self.max - self.min >= 2, "length.clip_ratio", self.clip_ratio,
                f"needs at least two lengths below max (min={self.min}, max={self.max})")
        body = _body_mean(self)
        require(body > self.min, "length.clip_ratio", self.clip_ratio,
                f"leaves the lengths below max={self.max} a mean of {body:.6g} tokens, not above "
                f"min={self.min}: lower clip_ratio or raise mean (mean must exceed "
                f"(1 - clip_ratio) min + clip_ratio max = "
                f"{(1 - self.clip_ratio) * self.min + self.clip_ratio * self.max:.6g})")
        require(body < self.max - 1, "length.mean", self.mean,
                f"must be below max - 1 + clip_ratio = {self.max - 1 + self.clip_ratio:.6g} "
                f"(the lengths below the cap end at max - 1 = {self.max - 1})")

    def _check_empirical(self) -> None:
        lengths = [length for length, _ in self.histogram]
        require(self.std == 0, "length.std", self.std,
                "must be 0 for kind 'empirical' (the histogram gives the spread)")
        require(self.min <= lengths[0], "length.min", self.min,
                f"must be <= the histogram's shortest length ({lengths[0]})")
        require(self.max >= lengths[-1], "length.max", self.max,
                f"must be >= the histogram's longest length ({lengths[-1]})")
        hist_mean = _histogram_mean(self.histogram)
        require(abs(self.mean - hist_mean) <= MEAN_TOL * self.max, "length.mean", self.mean,
                f"must be the histogram's mean, {hist_mean!r} tokens (or be left out)")

    @classmethod
    def fixed(cls, tokens: int) -> LengthDist:
        return cls(mean=tokens, max=tokens, min=tokens, kind="fixed")

    @classmethod
    def empirical(cls, histogram: Any) -> LengthDist:
        """An ``empirical`` distribution over ``histogram`` ([[length, share], ...]), with min,
        max and mean taken from it."""
        return cls.from_dict({"kind": "empirical", "histogram": histogram})

    # --- derived quantities ---
    def support(self) -> np.ndarray:
        """Token counts min..max (int64)."""
        return np.arange(self.min, self.max + 1, dtype=np.int64)

    def pmf(self) -> np.ndarray:
        """Probability of each length in :meth:`support` (sums to 1)."""
        return _pmf(self)

    def cdf(self) -> np.ndarray:
        return _cdf(self)

    def expected_max(self, n: int) -> float:
        """Expected longest of ``n`` independent draws (tokens)."""
        if n <= 0:
            return 0.0
        cdf = _cdf(self)
        prev = np.concatenate(([0.0], cdf[:-1]))
        return float(np.dot(self.support(), cdf**n - prev**n))

    def quantile(self, q: float) -> int:
        """Smallest length L with P(length <= L) >= q."""
        idx = int(np.searchsorted(_cdf(self), min(max(q, 0.0), 1.0) - 1e-12))
        return int(self.min + min(idx, self.max - self.min))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths drawn with ``rng`` (int64)."""
        return rng.choice(self.support(), size=n, p=self.pmf())

    def to_dict(self) -> dict[str, Any]:
        """Plain values (YAML/JSON); ``clip_ratio`` only when not 0, ``histogram`` (a list of
        [length, share] lists) only for ``empirical``."""
        out = asdict(self)
        if not self.clip_ratio:
            del out["clip_ratio"]
        if self.kind == "empirical":
            out["histogram"] = [[length, share] for length, share in self.histogram]
        else:
            del out["histogram"]
        return out

    @classmethod
    def from_dict(cls, data: Any, field: str = "length") -> LengthDist:
        if is_int(data):
            return cls.fixed(data)
        require(isinstance(data, Mapping), field, data,
                "must be an integer (fixed length) or a mapping "
                "{mean, max, std, min, kind, clip_ratio, histogram}")
        known = set(cls.__dataclass_fields__)
        extra = set(data) - known
        if extra:
            key = min(extra, key=str)
            raise SpecError(f"{field}.{key}", data[key], f"unknown key; known keys: {sorted(known)}")
        values = dict(data)
        for key in ("max", "min"):
            if key in values:
                require(is_int(values[key]), f"{field}.{key}", values[key],
                        "must be an integer (tokens)")
        kind = values.get("kind", "truncnorm")
        if kind == "empirical":
            hist = _histogram(values.get("histogram"), f"{field}.histogram")
            values["histogram"] = hist
            values.setdefault("min", hist[0][0])
            values.setdefault("max", hist[-1][0])
            values.setdefault("mean", _histogram_mean(hist))
        require("max" in values, f"{field}.max", None, "is required")
        if kind == "fixed":
            values.setdefault("mean", values["max"])
            values.setdefault("min", values["max"])
        if kind == "uniform":
            values.setdefault("min", 1)
            values.setdefault("mean", (values["min"] + values["max"]) / 2)
        require("mean" in values, f"{field}.mean", None, "is required")
        try:
            return cls(**values)
        except SpecError as exc:
            raise SpecError(exc.field.replace("length", field, 1), exc.value, exc.problem) from None


def _empty(histogram: Any) -> bool:
    """No histogram given: an empty list or tuple."""
    return isinstance(histogram, list | tuple) and len(histogram) == 0


def _histogram(data: Any, field: str) -> tuple[tuple[int, float], ...]:
    """``data`` ([[length, share], ...], any order) checked and sorted by length: distinct
    integer lengths in [1, MAX_TOKENS] tokens, finite shares > 0 summing to 1 (within
    :data:`SHARE_SUM_TOL`)."""
    require(isinstance(data, list | tuple) and len(data) > 0, field, data,
            "must be a non-empty list of [length, share] pairs")
    rows: list[tuple[int, float]] = []
    for i, row in enumerate(data):
        require(isinstance(row, list | tuple) and len(row) == 2, f"{field}[{i}]", row,
                "must be a [length, share] pair")
        length, share = row
        require(is_int(length) and 1 <= length <= MAX_TOKENS, f"{field}[{i}][0]", length,
                f"must be an integer length in [1, {MAX_TOKENS}] tokens")
        require(is_number(share) and math.isfinite(share) and share > 0, f"{field}[{i}][1]",
                share, "must be a finite share > 0")
        rows.append((length, float(share)))
    rows.sort()
    for (a, _), (b, _) in zip(rows, rows[1:], strict=False):
        require(a != b, field, a, "lists this length twice: one [length, share] per length")
    total = math.fsum(share for _, share in rows)
    require(abs(total - 1) <= SHARE_SUM_TOL, field, total,
            f"shares must sum to 1 (within {SHARE_SUM_TOL:g}); they sum to {total!r}")
    return tuple(rows)


def _histogram_mean(histogram: tuple[tuple[int, float], ...]) -> float:
    """Mean length of a checked histogram, its shares divided by their sum (tokens)."""
    return math.fsum(length * share for length, share in histogram) / math.fsum(
        share for _, share in histogram)


def _body_mean(dist: LengthDist) -> float:
    """Mean of the lengths below the cap that keeps the overall mean at ``dist.mean`` with
    ``clip_ratio`` of the mass at ``max`` (tokens)."""
    return (dist.mean - dist.clip_ratio * dist.max) / (1 - dist.clip_ratio)


def _normal_weights(support: np.ndarray, loc: float, std: float) -> np.ndarray:
    """A normal's density at the support points, normalised over them: a softmax of the
    log-density relative to the support point nearest ``loc``, written without cancellation
    (-(x - ref)(x + ref - 2 loc) / 2 std^2), so that a location far outside [min, max] keeps
    the tail's shape instead of underflowing to 0 / 0 or rounding the points together."""
    ref = min(max(loc, support[0]), support[-1])
    return softmax(-(support - ref) * (support + ref - 2 * loc) / (2 * std * std))


def _solved_loc(support: np.ndarray, mean: float, std: float) -> float:
    """The underlying normal's location whose truncation to the support has mean ``mean``
    (the truncated mean is increasing in the location; Brent's method). A mean within d of an
    end needs a location about std^2 / d beyond that end."""
    lo_end, hi_end = float(support[0]), float(support[-1])
    var = std * std
    lo = lo_end - 20 * std - hi_end - var / (mean - lo_end)
    hi = 2 * hi_end + 20 * std + var / (hi_end - mean)

    def excess(loc: float) -> float:
        return float(np.dot(support, _normal_weights(support, loc, std))) - mean

    try:
        return brentq(excess, lo, hi, xtol=1e-12, rtol=4 * np.finfo(float).eps, maxiter=500)
    except (ValueError, RuntimeError):  # no sign change or no convergence in floating point
        raise SpecError("length.mean", mean,
                        f"no truncated normal with std {std} in [{int(lo_end)}, {int(hi_end)}] "
                        f"has this mean in floating point: raise std") from None


def _lognormal_shape(dist: LengthDist, mean: float) -> float:
    """The lognormal's shape (sigma of log length) for lengths of mean ``mean`` (tokens; the
    body's below the cap with a clip_ratio): from ``dist.std`` (tokens) if given,
    sqrt(ln(1 + (std/mean)^2)); else the narrower of the two shapes whose :data:`MAX_QUANTILE`
    quantile, mean * exp(z sigma - sigma^2 / 2), is ``dist.max`` (the wider one puts most
    lengths near min and the mean in a tail beyond max)."""
    if dist.std > 0:
        return math.sqrt(math.log1p((dist.std / mean) ** 2))
    disc = _MAX_Z * _MAX_Z - 2 * math.log(dist.max / mean)
    ratio = math.exp(_MAX_Z * _MAX_Z / 2)  # the most a quantile can exceed the mean by
    below = f" (the lengths below max, {mean:.6g})" if dist.clip_ratio > 0 else ""
    require(disc > 0, "length.mean", dist.mean,
            f"puts the mean{below} below max / {ratio:.4g} = {dist.max / ratio:.4g} tokens: no "
            f"lognormal of that mean has max={dist.max} at its {MAX_QUANTILE} quantile; give "
            f"std (tokens)")
    return _MAX_Z - math.sqrt(disc)


def _lognormal_weights(support: np.ndarray, mu: float, shape: float) -> np.ndarray:
    """P(round(X) = L) for each support point L, X ~ ``scipy.stats.lognorm(shape,
    scale=exp(mu))``, normalised over the support: each point takes the mass of
    [L - 1/2, L + 1/2]. The log-cdf and log-survival are lognorm's, log_ndtr(+-(ln x - mu) /
    shape), written without forming exp(mu), which overflows at the locations a mean within a
    token of an end needs; the log-cdf serves below the median and the log-survival above it
    (no cancellation in either tail), and a softmax normalises, so that a location far outside
    the support keeps the tail's shape instead of underflowing to 0 / 0."""
    edges = np.append(support - 0.5, support[-1] + 0.5)
    z = (np.log(edges) - mu) / shape
    log_cdf, log_sf = log_ndtr(z), log_ndtr(-z)
    with np.errstate(divide="ignore", invalid="ignore"):  # the branch np.where drops
        upper = log_sf[:-1] + np.log1p(-np.exp(log_sf[1:] - log_sf[:-1]))
        lower = log_cdf[1:] + np.log1p(-np.exp(log_cdf[:-1] - log_cdf[1:]))
    return softmax(np.where(z[:-1] >= 0, upper, lower))


def _solved_mu(support: np.ndarray, mean: float, shape: float) -> float:
    """The lognormal's log-scale location (ln of scipy's ``scale``) whose rounded, truncated
    lengths have mean ``mean`` (increasing in the location; Brent's method). As for truncnorm
    in log length: a mean within a log-distance d of an end needs a location about shape^2 / d
    beyond that end."""
    lo_end, hi_end = math.log(support[0] - 0.5), math.log(support[-1] + 0.5)
    var = shape * shape
    span = hi_end - lo_end + 20 * shape
    lo = lo_end - span - 2 * var / math.log(mean / support[0])
    hi = hi_end + span + 2 * var / math.log(support[-1] / mean)

    def excess(mu: float) -> float:
        return float(np.dot(support, _lognormal_weights(support, mu, shape))) - mean

    try:
        return brentq(excess, lo, hi, xtol=1e-12, rtol=4 * np.finfo(float).eps, maxiter=500)
    except (ValueError, RuntimeError):  # no sign change or no convergence in floating point
        raise SpecError("length.mean", mean,
                        f"no lognormal of shape {shape:.6g} in [{int(support[0])}, "
                        f"{int(support[-1])}] has this mean in floating point: move it from "
                        f"the end or change std") from None


def _shaped_pmf(dist: LengthDist, support: np.ndarray, mean: float) -> np.ndarray:
    """truncnorm's or lognormal's pmf over ``support`` with mean ``mean`` (tokens), checked."""
    if support.size == 1:
        return np.ones(1)
    if dist.kind == "truncnorm":
        out = _normal_weights(support, _solved_loc(support, mean, dist.std), dist.std)
        spread = f"std {dist.std}"
    else:
        shape = _lognormal_shape(dist, mean)
        out = _lognormal_weights(support, _solved_mu(support, mean, shape), shape)
        spread = f"lognormal shape {shape:.6g}"
    got = float(np.dot(support, out))
    # a std far below one token makes the mean a near-step function of the location: say
    # so rather than model another mean
    require(abs(got - mean) <= MEAN_TOL * dist.max, "length.mean", dist.mean,
            f"cannot be reached by integer lengths with {spread} in "
            f"[{int(support[0])}, {int(support[-1])}] (the nearest is {got:.6g}): raise std")
    return out


@lru_cache(maxsize=256)
def _pmf(dist: LengthDist) -> np.ndarray:
    support = dist.support().astype(np.float64)
    n = support.size
    if dist.kind == "fixed" or n == 1:
        out = np.zeros(n)
        out[-1] = 1.0
    elif dist.kind == "uniform":
        out = np.full(n, 1.0 / n)
    elif dist.kind == "empirical":
        out = np.zeros(n)
        lengths = np.array([length for length, _ in dist.histogram], dtype=np.int64)
        shares = np.array([share for _, share in dist.histogram])
        out[lengths - dist.min] = shares / shares.sum()
    elif dist.clip_ratio > 0:
        body = _shaped_pmf(dist, support[:-1], _body_mean(dist))
        out = np.append((1 - dist.clip_ratio) * body, dist.clip_ratio)
    else:
        out = _shaped_pmf(dist, support, dist.mean)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=256)
def _cdf(dist: LengthDist) -> np.ndarray:
    out = np.minimum(np.cumsum(_pmf(dist)), 1.0)
    out[-1] = 1.0
    out.setflags(write=False)
    return out
