"""Small matplotlib helpers shared by the figures (Agg backend: no display needed)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def save(fig, path: Path) -> None:
    """Save atomically (write a temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)


def empty(path: Path, title: str, note: str = "no results yet") -> None:
    fig, ax = plt.subplots(figsize=(5, 2))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, note, ha="center", va="center")
    save(fig, path)


def grouped_bars(ax, table: pd.DataFrame, group: str, series: str, value: str,
                 lo: str | None = None, hi: str | None = None) -> None:
    """Bars of ``value`` per ``group`` (x) and ``series`` (side by side). With ``lo`` and ``hi``
    (columns, e.g. from :func:`over_seeds`), each bar carries an error bar from ``lo`` to
    ``hi``."""
    groups = list(dict.fromkeys(table[group]))
    names = list(dict.fromkeys(table[series]))
    width = 0.8 / max(len(names), 1)
    for k, name in enumerate(names):
        sub = table[table[series] == name].set_index(group)

        def column(col: str, sub: pd.DataFrame = sub) -> list[float]:
            return [float(sub[col].get(g, float("nan"))) if g in sub.index else float("nan")
                    for g in groups]

        ys = column(value)
        yerr = None
        if lo is not None and hi is not None:
            # matplotlib wants distances below and above the bar; a missing bar gets none
            yerr = [[_gap(y, low) for y, low in zip(ys, column(lo), strict=True)],
                    [_gap(high, y) for y, high in zip(ys, column(hi), strict=True)]]
        ax.bar([i + k * width for i in range(len(groups))], ys, width, label=name, yerr=yerr,
               capsize=2 if yerr else 0, error_kw={"elinewidth": 0.8, "ecolor": "0.2"})
    ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels(groups, rotation=45, ha="right", fontsize=7)


def _gap(top: float, bottom: float) -> float:
    d = top - bottom
    return 0.0 if math.isnan(d) else max(d, 0.0)


def over_seeds(table: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """``value``'s mean, min and max over the rows (the seeds) of each ``keys`` combination, in
    order of first appearance: columns ``keys``, ``value`` (the mean), ``lo``, ``hi`` and
    ``seeds`` (how many rows)."""
    g = table.groupby(keys, sort=False)[value]
    out = pd.DataFrame({value: g.mean(), "lo": g.min(), "hi": g.max(), "seeds": g.count()})
    return out.reset_index()


def spread(table: pd.DataFrame) -> dict[str, str]:
    """:func:`grouped_bars`' error-bar columns for an :func:`over_seeds` table: none when every
    bar is one seed (an error bar would claim a spread that was not measured)."""
    return {"lo": "lo", "hi": "hi"} if len(table) and table["seeds"].max() > 1 else {}


def spread_note(table: pd.DataFrame) -> str:
    """What the bars and error bars of an :func:`over_seeds` table show (for a title)."""
    n = sorted(set(int(s) for s in table["seeds"])) if "seeds" in table and len(table) else [1]
    if n[-1] <= 1:
        return "one seed"
    seeds = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"
    return f"bars: mean over {seeds} seeds; error bars: min-max"


def suptitle(fig, title: str, note: str | None = None) -> None:
    """The figure's title, with ``note`` on a second line, above the panels' own titles."""
    # anchored by its bottom just above the panels' titles; save()'s tight box keeps what sticks out
    fig.suptitle(f"{title}\n({note})" if note else title, fontsize=10, y=0.95, va="bottom")
