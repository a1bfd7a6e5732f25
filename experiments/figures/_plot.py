"""Small matplotlib helpers shared by the figures (Agg backend: no display needed)."""

from __future__ import annotations

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


def grouped_bars(ax, table: pd.DataFrame, group: str, series: str, value: str) -> None:
    groups = list(dict.fromkeys(table[group]))
    names = list(dict.fromkeys(table[series]))
    width = 0.8 / max(len(names), 1)
    for k, name in enumerate(names):
        sub = table[table[series] == name].set_index(group)
        ys = [float(sub[value].get(g, float("nan"))) if g in sub.index else float("nan") for g in groups]
        ax.bar([i + k * width for i in range(len(groups))], ys, width, label=name)
    ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels(groups, rotation=45, ha="right", fontsize=7)
