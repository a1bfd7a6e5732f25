"""Per-seed comparisons for the figures' summary rows: ratios of one system to another taken seed
by seed (not means of means), and the cells where ours falls below a baseline."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd


def with_seed(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with a ``seed`` column (tables written before figures repeated seeds: seed 0)."""
    return table if "seed" in table else table.assign(seed=0)


def paired(table: pd.DataFrame, keys: list[str], series: str, value: str) -> pd.DataFrame:
    """One row per ``keys`` combination (the seed among them), one column per value of
    ``series``: ``value`` side by side, so that a ratio of two columns pairs equal seeds."""
    return table.groupby([*keys, series], sort=False)[value].mean().unstack(series)


def spans(values: pd.Series, dims: dict[str | tuple[str, ...], str]) -> str:
    """What ``values`` span: ``dims`` maps index levels (a tuple: the levels together) to a noun,
    e.g. ``{("size", "algorithm"): "job", "seed": "seed"}`` -> ``2 jobs x 3 seeds``."""
    out = []
    for levels, noun in dims.items():
        names = levels if isinstance(levels, tuple) else (levels,)
        n = len(set(zip(*(values.index.get_level_values(lv) for lv in names), strict=True)))
        out.append(f"{n} {noun}{'s' * (n != 1)}")
    return " x ".join(out)


def ratio_text(ratio: pd.Series, dims: dict[str | tuple[str, ...], str], unit: str = "") -> str:
    """min-max of per-seed ratios and what they span (:func:`spans`): ``0.93-1.21 (2 jobs x 3
    seeds)``."""
    return f"{ratio.min():.2f}-{ratio.max():.2f}{unit} ({spans(ratio, dims)})"


def shortfalls(wide: pd.DataFrame, ours: str, baselines: Iterable[str]) -> tuple[int, list[tuple[float, Any, str]]]:
    """How many (row, baseline) cells of ``wide`` compare ``ours`` with a baseline (both present),
    and those where ``ours`` is strictly below, as (ours / baseline, row index, baseline), worst
    first."""
    cells, below = 0, []
    for base in baselines:
        if base not in wide or ours not in wide:
            continue
        both = wide[[ours, base]].dropna()
        cells += len(both)
        for idx, x, y in zip(both.index, both[ours], both[base], strict=True):
            if x < y:
                below.append((float(x / y), idx, base))
    below.sort(key=lambda b: b[0])
    return cells, below


def describe_cell(names: list[str | None], idx: Any, base: str) -> str:
    """A row index of :func:`paired`'s table as words: ``single-region 8b ppo sync seed 1 vs verl``."""
    values = idx if isinstance(idx, tuple) else (idx,)
    parts = [f"seed {v}" if n == "seed" else str(v) for n, v in zip(names, values, strict=True)]
    return " ".join(parts) + f" vs {base}"


def shortfall_row(wide: pd.DataFrame, ours: str, baselines: Iterable[str], what: str,
                  paper: str, target: str) -> dict[str, str]:
    """A summary row counting the cells where ``ours`` is below a baseline (the target: none)."""
    cells, below = shortfalls(wide, ours, baselines)
    text = f"{len(below)} of {cells} cells"
    if below:
        clear = sum(r < 0.99 for r, _, _ in below)
        names = list(wide.index.names)
        worst = [f"{describe_cell(names, idx, base)} at {ratio:.3f}" for ratio, idx, base in below[:3]]
        text += f" ({clear} by more than 1%); worst: " + ", ".join(worst)
        if len(below) > 3:
            text += ", ..."
    return {"what": what, "ours": text, "paper": paper,
            "reading": f"target met: {target}" if not below and cells else
            ("no cells to compare" if not cells else f"target missed: {target}")}


def range_reading(ours: tuple[float, float], ref: tuple[float, float] | None) -> str:
    """How our (lowest, highest) ratio over the cells reads against the paper's range: inside,
    overlapping, below or above it (fig3, fig10)."""
    if ref is None:
        return "paper gives no range"
    lo, hi = ours
    if lo >= ref[0] and hi <= ref[1]:
        return "inside the paper's range"
    if hi < ref[0]:
        return "below the paper's range: our baselines fare better in our cost model/simulator"
    if lo > ref[1]:
        return "above the paper's range: our baselines fare worse here"
    return "overlaps the paper's range"
