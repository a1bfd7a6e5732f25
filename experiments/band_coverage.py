"""Does the 80% band tell the truth? (docs/validation.md, "The band of an estimate"): for each
step row, the band its estimate would get from the holdout step rows of *other* sources
(leave-one-source-out: no row vouches for itself, nor do its siblings from one source), and
whether the measured step lies inside it (``in_band``). Over the holdout step rows the share
inside is the band's coverage, which should be near its nominal 80% (issue 58: 70-90%).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from hetrl.cost.band import Residual, half_width


def in_band(row: Any, residuals: Sequence[Residual]) -> bool | None:
    """Whether a step row's measured value lies inside the band of its estimate built from
    ``residuals`` of other sources (None where the row is no estimated step comparison or no
    other source's row is left)."""
    if row["kind"] != "step" or row["status"] != "estimated" or row["measure"] != "time":
        return None
    others = [r for r in residuals if r.source_key != row["source_key"]]
    if not others:
        return None
    q = half_width(bool(row["colocated"]), others)[0]
    return bool(abs(math.log(row["ratio"])) <= q)


def coverage(df: pd.DataFrame) -> dict[str, Any]:
    """The share of holdout step rows (primary comparisons, published lengths) inside their
    leave-one-source-out band, over all of them, per plan class and per framework profile."""
    part = df[df["primary"].astype(bool) & (df["split"] == "holdout") & (df["kind"] == "step")
              & (df["lengths"] != "unknown") & df["in_band"].notna()]
    out: dict[str, Any] = {"rows": int(len(part)),
                           "inside": int(part["in_band"].astype(bool).sum())}
    out["share"] = out["inside"] / out["rows"] if out["rows"] else None
    for cls, flag in (("colocated", True), ("disaggregated", False)):
        sub = part[part["colocated"].astype(bool) == flag]
        out[cls] = {"rows": int(len(sub)), "inside": int(sub["in_band"].astype(bool).sum())}
    # per framework profile (the workload's ``framework``: hetrl.cost.profiles)
    out["framework"] = {name: {"rows": int(len(sub)),
                               "inside": int(sub["in_band"].astype(bool).sum())}
                        for name, sub in part.groupby("framework", sort=True)}
    return out
