"""A plan as a picture (``hetrl show``): regions as boxes, their nodes inside, each GPU a cell
painted by the tasks that run on it (one stripe per task: a GPU shared by co-located tasks shows
each) and outlined in its task group's colour; beside it a table of the tasks -- group, (dp,
pp, tp), its GPUs by type and region, backend, data shares, layer split -- and the cross-region flows of one iteration (:mod:`hetrl.cost.flows`)
drawn as arrows between region boxes, labelled with their bytes.

Drawn with matplotlib's object API on an Agg canvas (no display, no pyplot state). The picture
has a fixed size, :data:`SIZE_IN` inches at :data:`DPI` dots per inch.
"""

from __future__ import annotations

import math
from pathlib import Path

from hetrl.cost.details import where_task_runs, where_text
from hetrl.cost.flows import FLOW_KINDS, human_bytes, iteration_flows, region_flows
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.plan import Plan, TaskPlacement
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec
from hetrl.views.gantt import task_colour

SIZE_IN = (16.0, 9.0)
DPI = 100
FORMATS = ("png", "svg")
#: Cells per row of a node (a node of 16 GPUs takes two rows).
CELLS_PER_ROW = 8
#: Short names of the flow kinds in arrow labels.
SHORT = {"rollout data": "rollout", "weight sync": "weights", "DP ring": "DP", "pipeline": "PP"}


def group_colours(n: int) -> list[tuple[float, float, float, float]]:
    """``n`` distinguishable colours (tab10, then tab20)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def shares_text(p: TaskPlacement, most: int = 6) -> str:
    """A placement's data shares in words: ``even`` or percentages (the first ``most``)."""
    shares = p.data_shares
    if max(shares) - min(shares) < 1e-9:
        return "even" if p.dp > 1 else "all"
    text = " ".join(f"{100 * s:.0f}" for s in shares[:most])
    return f"{text}{' ...' if len(shares) > most else ''} %"


def layers_text(p: TaskPlacement) -> str:
    """The layer split of a pipelined placement: ``9/stage``, ``10+9+9+8``, or for long splits
    the range ``2-3/stage`` (so the side table stays inside the picture)."""
    if p.pp == 1:
        return ""
    if len(set(p.layers_per_stage)) == 1:
        return f"{p.layers_per_stage[0]}/stage"
    text = "+".join(map(str, p.layers_per_stage))
    return text if len(text) <= 24 else f"{min(p.layers_per_stage)}-{max(p.layers_per_stage)}/stage"


#: Arrows labelled on the picture (the largest pairs); the side table lists them too.
LABELLED_PAIRS = 8


def _region_grid(n: int) -> tuple[int, int]:
    cols = n if n <= 2 else 2 if n <= 4 else 3
    return cols, math.ceil(n / cols)


def _pairs(between: dict[tuple[str, str], dict[str, float]]
           ) -> list[tuple[tuple[str, str], dict[str, float], bool]]:
    """Flows per unordered region pair (both directions summed), largest first, with whether
    bytes go both ways."""
    merged: dict[tuple[str, str], dict[str, float]] = {}
    both: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for (a, b), kinds in between.items():
        key = (a, b) if (b, a) not in merged else (b, a)
        into = merged.setdefault(key, {})
        for k, v in kinds.items():
            into[k] = into.get(k, 0.0) + v
        both.setdefault(key, set()).add((a, b))
    out = [(k, v, len(both[k]) == 2) for k, v in merged.items()]
    return sorted(out, key=lambda x: -sum(x[1].values()))


def draw_plan(plan: Plan, workload: WorkloadSpec, cluster: ClusterSpec,
              params: CostParams = DEFAULT_PARAMS, title: str | None = None):
    """The picture as a matplotlib Figure (not yet written)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

    fig = Figure(figsize=SIZE_IN, dpi=DPI)
    ax = fig.add_axes((0.01, 0.02, 0.60, 0.90))
    side = fig.add_axes((0.62, 0.02, 0.37, 0.90))
    side.axis("off")
    ax.axis("off")
    fig.suptitle(title or f"{workload.name} on {cluster.name}: "
                 f"{len(plan.groups)} task group(s), {len(plan.device_ids)} of "
                 f"{cluster.num_devices} GPUs", fontsize=13)

    colours = group_colours(len(plan.groups))
    group_of_device = {d: gi for gi, g in enumerate(plan.groups) for d in g.devices}
    # each GPU is painted by the tasks that run on it (a stripe per task, in workload order)
    order = {t: i for i, t in enumerate(workload.task_names)}
    tasks_on: dict[int, list[str]] = {}
    for p in sorted(plan.placements, key=lambda p: order.get(p.task, len(order))):
        for d in sorted({d for replica in p.devices for stage in replica for d in stage}):
            tasks_on.setdefault(d, []).append(p.task)

    # --- geometry: regions in a grid, nodes stacked inside, cells in rows of CELLS_PER_ROW ---
    regions = cluster.regions
    cols, rows = _region_grid(len(regions))
    nodes_in = {r: [n for n in cluster.nodes if n.region == r] for r in regions}
    node_rows = {n.name: math.ceil(n.count / CELLS_PER_ROW) for n in cluster.nodes}
    region_h = {r: sum(node_rows[n.name] + 0.9 for n in ns) + 0.6 for r, ns in nodes_in.items()}
    box_w = CELLS_PER_ROW + 1.0
    gap_x, gap_y = 3.2, 2.6
    row_h = [max([region_h[r] for r in regions[i * cols:(i + 1) * cols]] or [1.0])
             for i in range(rows)]
    first_device = {}
    k = 0
    for n in cluster.nodes:
        first_device[n.name] = k
        k += n.count
    centres = {}
    y_top = 0.0
    for ri in range(rows):
        for ci in range(cols):
            idx = ri * cols + ci
            if idx >= len(regions):
                break
            r = regions[idx]
            x0 = ci * (box_w + gap_x)
            h = row_h[ri]
            ax.add_patch(Rectangle((x0, y_top - h), box_w, h, fill=False, lw=1.5,
                                   ec="0.3", zorder=1))
            ax.text(x0 + 0.1, y_top + 0.15, r, fontsize=9, weight="bold", va="bottom")
            centres[r] = (x0 + box_w / 2, y_top - h / 2)
            y = y_top - 0.4
            for n in nodes_in[r]:
                ax.text(x0 + 0.5, y - 0.05, f"{n.name} ({n.gpu}{', edge' if n.edge else ''})",
                        fontsize=6.5, va="top", color="0.25")
                y -= 0.45
                for c in range(n.count):
                    d = first_device[n.name] + c
                    cx = x0 + 0.5 + c % CELLS_PER_ROW
                    cy = y - 1 - c // CELLS_PER_ROW
                    gi = group_of_device.get(d)
                    on = tasks_on.get(d, [])
                    for k, t in enumerate(on):  # one vertical stripe per task on this GPU
                        ax.add_patch(Rectangle((cx + 0.05 + 0.9 * k / len(on), cy + 0.05),
                                               0.9 / len(on), 0.9, zorder=2,
                                               fc=task_colour(t), ec="none"))
                    ax.add_patch(Rectangle((cx + 0.05, cy + 0.05), 0.9, 0.9, zorder=2.5,
                                           fill=not on, fc="white",
                                           ec=colours[gi] if gi is not None else "0.4",
                                           lw=1.4 if gi is not None else 0.6))
                    ax.text(cx + 0.5, cy + 0.5, str(d), fontsize=5.5, ha="center", va="center",
                            zorder=3, color="black" if not on else "white")
                y -= node_rows[n.name] + 0.45
        y_top -= row_h[ri] + gap_y
    ax.set_xlim(-0.5, cols * (box_w + gap_x) - gap_x + 0.5)
    ax.set_ylim(y_top + gap_y - 0.5, 1.2)
    ax.set_aspect("equal", adjustable="box")

    # --- cross-region flows as arrows, one per pair of regions ---
    between = region_flows(iteration_flows(plan, workload, cluster, params), cluster)
    pairs = _pairs(between)
    biggest = max((sum(v.values()) for _, v, _ in pairs), default=1.0)
    for i, ((a, b), kinds, two_way) in enumerate(pairs):
        total = sum(kinds.values())
        width = 0.5 + 3.0 * math.log1p(total) / math.log1p(biggest)
        labelled = i < LABELLED_PAIRS
        arrow = FancyArrowPatch(centres[a], centres[b], connectionstyle="arc3,rad=0.12",
                                arrowstyle="<|-|>" if two_way else "-|>", mutation_scale=12,
                                lw=width, color="crimson", alpha=0.6 if labelled else 0.25,
                                shrinkA=18, shrinkB=18, zorder=4)
        ax.add_patch(arrow)
        if labelled:
            (xa, ya), (xb, yb) = centres[a], centres[b]
            mx, my = (xa + xb) / 2 + 0.12 * (yb - ya) / 2, (ya + yb) / 2 - 0.12 * (xb - xa) / 2
            label = "\n".join(f"{SHORT[k]} {human_bytes(kinds[k])}" for k in FLOW_KINDS
                              if k in kinds)
            ax.text(mx, my, label, fontsize=6, ha="center", va="center", zorder=5,
                    bbox={"fc": "white", "ec": "crimson", "lw": 0.5, "alpha": 0.85})

    # --- the side table: groups, tasks and their layouts, flows in totals ---
    lines: list[tuple[str, dict]] = []
    for gi, g in enumerate(plan.groups):
        types = sorted({cluster.devices[d].gpu.name for d in g.devices})
        regs = sorted({cluster.devices[d].region for d in g.devices})
        where = ", ".join(regs) if len(regs) <= 2 else f"{len(regs)} regions"
        lines.append((f"group {gi}: {len(g.devices)} GPUs ({', '.join(types)}; {where})",
                      {"weight": "bold", "color": colours[gi]}))
        for t in g.tasks:
            p = plan.placement(t)
            extra = [x for x in (p.backend if p.backend != "megatron" else "",
                                 "offload" if p.offload else "",
                                 f"ep {p.ep}" if p.ep > 1 else "", layers_text(p)) if x]
            lines.append((f"  {t}: (dp, pp, tp) = ({p.dp}, {p.pp}, {p.tp})"
                          f"{' ' + ', '.join(extra) if extra else ''}",
                          {"color": task_colour(t), "weight": "bold"}))
            where = where_text(where_task_runs(p, cluster))
            where = where if len(where) <= 52 else where[:49] + "..."
            lines.append((f"      on {where}", {"color": "0.2"}))
            lines.append((f"      data shares: {shares_text(p)}", {"color": "0.35"}))
    totals = {k: sum(v.get(k, 0.0) for v in between.values()) for k in FLOW_KINDS}
    lines.append(("", {}))
    lines.append(("cross-region bytes per iteration (arrows):", {"weight": "bold"}))
    if not between:
        lines.append(("  none: every flow stays inside one region", {}))
    for k in FLOW_KINDS:
        if totals[k] > 0:
            relay = " (relayed: one copy per region)" if k == "weight sync" and plan.sync_relay \
                else ""
            lines.append((f"  {k}: {human_bytes(totals[k])}{relay}", {}))
    if pairs:
        lines.append((f"largest region pairs ({min(len(pairs), LABELLED_PAIRS)} of "
                       f"{len(pairs)}, both ways):", {"weight": "bold"}))
    for (a, b), kinds, _ in pairs[:LABELLED_PAIRS]:
        lines.append((f"  {a} - {b}: {human_bytes(sum(kinds.values()))}", {}))
    size = 8.5 if len(lines) <= 40 else max(4.5, 8.5 * 40 / len(lines))
    step = 1.0 / max(len(lines) + 1, 30)
    for i, (text, style) in enumerate(lines):
        side.text(0.0, 1.0 - i * step, text, fontsize=size, va="top", family="monospace",
                  transform=side.transAxes, **style)
    handles = [Patch(fc=task_colour(t), label=t) for t in workload.task_names
               if any(t in on for on in tasks_on.values())]
    handles += [Patch(fc="white", ec=c, lw=1.4, label=f"group {i} (outline)")
                for i, c in enumerate(colours)]
    handles.append(Patch(fc="white", ec="0.4", label="unused"))
    fig.legend(handles=handles, loc="lower left", fontsize=8, ncol=min(len(handles), 8),
               bbox_to_anchor=(0.01, 0.0), frameon=False)
    return fig


def picture_format(path: str | Path, fmt: str | None, field: str = "--out") -> str:
    """The file format: ``fmt`` if given, else the path's suffix (png or svg), else png."""
    from hetrl.errors import SpecError

    if fmt is not None:
        if fmt not in FORMATS:
            raise SpecError("--format", fmt, f"must be one of {list(FORMATS)}")
        return fmt
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix in FORMATS:
        return suffix
    if suffix:
        raise SpecError(field, str(path), f"suffix .{suffix} is not a picture format "
                        f"({', '.join(FORMATS)})")
    return "png"


def save_figure(fig, path: str | Path, fmt: str, field: str = "--out") -> None:
    """Write ``fig`` to ``path`` in ``fmt`` atomically (hetrl.io writes every file)."""
    import io as _io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from hetrl.io import write_bytes_atomic

    FigureCanvasAgg(fig)
    buf = _io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=DPI)
    write_bytes_atomic(path, buf.getvalue(), field)
