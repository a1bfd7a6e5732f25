"""Token-length distributions (prompt and response lengths), discrete over [min, max].

A distribution is described by plain numbers (kind, mean, max, min, std); its probability mass
function over integer token counts is derived once and cached. For ``truncnorm`` the underlying
normal's location is solved so that the *truncated* distribution has exactly the requested mean:
users state what they observe (mean and max response length), not a latent parameter.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import softmax

from hetrl.errors import SpecError, require
from hetrl.limits import MAX_SEQUENCE_TOKENS

KINDS = ("fixed", "uniform", "truncnorm")
#: Longest prompt or response, tokens (hetrl.limits.MAX_SEQUENCE_TOKENS)
MAX_TOKENS = MAX_SEQUENCE_TOKENS
#: truncnorm's std, tokens: below, the mean is a step function of the location; above, the
#: variance overflows (a std of 1e9 is already uniform over any supported range)
STD_RANGE = (1e-6, 1e9)


@dataclass(frozen=True)
class LengthDist:
    """Integer token lengths in [min, max] with the given mean (tokens).

    kinds: ``fixed`` (every sequence has ``mean`` = ``max`` tokens), ``uniform`` over [min, max]
    (mean implied), ``truncnorm`` (normal with std ``std``, truncated to [min, max], mean exact).
    """

    mean: float
    max: int
    min: int = 1
    std: float = 0.0
    kind: str = "truncnorm"

    def __post_init__(self) -> None:
        require(self.kind in KINDS, "length.kind", self.kind, f"must be one of {list(KINDS)}")
        for key in ("mean", "std"):
            value = getattr(self, key)
            require(isinstance(value, numbers.Real) and not isinstance(value, bool),
                    f"length.{key}", value, "must be a number (tokens)")
            require(math.isfinite(value), f"length.{key}", value, "must be finite (tokens)")
        require(isinstance(self.max, int) and not isinstance(self.max, bool), "length.max",
                self.max, "must be an integer")
        require(1 <= self.max <= MAX_TOKENS, "length.max", self.max,
                f"must be in [1, {MAX_TOKENS}] tokens")
        require(isinstance(self.min, int) and not isinstance(self.min, bool) and 1 <= self.min <= self.max, "length.min", self.min,
                f"must be an integer in [1, max={self.max}]")
        require(self.min <= self.mean <= self.max, "length.mean", self.mean,
                f"must be in [min={self.min}, max={self.max}]")
        if self.kind == "fixed":
            require(self.mean == self.max, "length.mean", self.mean,
                    f"must equal max ({self.max}) for kind 'fixed'")
        if self.kind == "uniform":
            require(abs(self.mean - (self.min + self.max) / 2) < 1e-9, "length.mean", self.mean,
                    f"must be (min+max)/2 = {(self.min + self.max) / 2} for kind 'uniform'")
        if self.kind == "truncnorm":
            require(self.std > 0, "length.std", self.std, "must be > 0 for kind 'truncnorm'")
            require(STD_RANGE[0] <= self.std <= STD_RANGE[1], "length.std", self.std,
                    f"must be in [{STD_RANGE[0]:g}, {STD_RANGE[1]:g}] tokens")
            if self.min < self.max:
                require(self.min < self.mean < self.max, "length.mean", self.mean,
                        f"must lie strictly inside (min={self.min}, max={self.max})")
            _pmf(self)  # the truncated moments must be computable: say so now, by field

    @classmethod
    def fixed(cls, tokens: int) -> LengthDist:
        return cls(mean=tokens, max=tokens, min=tokens, kind="fixed")

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
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, field: str = "length") -> LengthDist:
        if isinstance(data, int) and not isinstance(data, bool):
            return cls.fixed(data)
        require(isinstance(data, Mapping), field, data,
                "must be an integer (fixed length) or a mapping {mean, max, std, min, kind}")
        known = set(cls.__dataclass_fields__)
        extra = set(data) - known
        if extra:
            key = sorted(extra)[0]
            raise SpecError(f"{field}.{key}", data[key], f"unknown key; known keys: {sorted(known)}")
        require("max" in data, f"{field}.max", None, "is required")
        values = dict(data)
        for key in ("max", "min"):
            if key in values:
                require(isinstance(values[key], int) and not isinstance(values[key], bool),
                        f"{field}.{key}", values[key], "must be an integer (tokens)")
        kind = values.get("kind", "truncnorm")
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


def _normal_weights(support: np.ndarray, loc: float, std: float) -> np.ndarray:
    """A normal's density at the support points, normalised over them: a softmax of the
    log-density relative to the support point nearest ``loc``, written without cancellation
    (-(x - ref)(x + ref - 2 loc) / 2 std^2), so that a location far outside [min, max] keeps
    the tail's shape instead of underflowing to 0 / 0 or rounding the points together."""
    ref = min(max(loc, support[0]), support[-1])
    return softmax(-(support - ref) * (support + ref - 2 * loc) / (2 * std * std))


def _solved_loc(support: np.ndarray, dist: LengthDist) -> float:
    """The underlying normal's location whose truncation to the support has mean
    ``dist.mean`` (the truncated mean is increasing in the location; Brent's method). A mean
    within d of an end needs a location about std^2 / d beyond that end."""
    var = dist.std * dist.std
    lo = dist.min - 20 * dist.std - dist.max - var / (dist.mean - dist.min)
    hi = 2 * dist.max + 20 * dist.std + var / (dist.max - dist.mean)

    def excess(loc: float) -> float:
        return float(np.dot(support, _normal_weights(support, loc, dist.std))) - dist.mean

    try:
        return brentq(excess, lo, hi, xtol=1e-12, rtol=4 * np.finfo(float).eps, maxiter=500)
    except (ValueError, RuntimeError):  # no sign change or no convergence in floating point
        raise SpecError("length.mean", dist.mean,
                        f"no truncated normal with std {dist.std} in [{dist.min}, {dist.max}] "
                        f"has this mean in floating point: raise std") from None


@lru_cache(maxsize=256)
def _pmf(dist: LengthDist) -> np.ndarray:
    support = dist.support().astype(np.float64)
    n = support.size
    if dist.kind == "fixed" or n == 1:
        out = np.zeros(n)
        out[-1] = 1.0
    elif dist.kind == "uniform":
        out = np.full(n, 1.0 / n)
    else:
        out = _normal_weights(support, _solved_loc(support, dist), dist.std)
        mean = float(np.dot(support, out))
        # a std far below one token makes the mean a near-step function of the location: say
        # so rather than model another mean
        require(abs(mean - dist.mean) <= 1e-6 * dist.max, "length.mean", dist.mean,
                f"cannot be reached by integer lengths with std {dist.std} in "
                f"[{dist.min}, {dist.max}] (the nearest is {mean:.6g}): raise std")
    out.setflags(write=False)
    return out


@lru_cache(maxsize=256)
def _cdf(dist: LengthDist) -> np.ndarray:
    out = np.minimum(np.cumsum(_pmf(dist)), 1.0)
    out[-1] = 1.0
    out.setflags(write=False)
    return out
