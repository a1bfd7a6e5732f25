"""An iteration as a Gantt chart (``hetrl simulate --gantt``, ``hetrl run --gantt``), built from
a trace's spans, so that the simulator and the real backend share one picture.

One row per task of the plan, grouped by task group and labelled with the task's GPUs by type
and region (or, ``per_gpu``, one row per GPU; without a plan, one per set of devices the trace's
tasks use). In a row's upper lane the tasks run as bars coloured by task; per GPU, a task's span is a pale band and its tasklets (a
generation replica, a forward or backward micro-batch) solid bars on it, so a replica that
finished early or a pipeline bubble shows as pale. The lower, thinner lane holds the network:
transfers, collectives (gradient rings) and the weight sync. White is idle time; each row ends
with its busy share (the union of its upper lane over the run). Iterations alternate plain and
hatched, with their number on bars wide enough to hold it: in async runs the iterations
overlap, and the hatching shows which bar belongs to which. Dashed lines mark where the trace's
iterations end; red lines mark injected faults.

Drawn with matplotlib's object API on an Agg canvas; the width is fixed (:data:`WIDTH_IN`), the
height grows with the rows (:func:`gantt_size`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from hetrl.plan import Plan
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.tasks import TASK_NAMES, WEIGHT_SYNC
from hetrl.trace import Span, Trace

WIDTH_IN = 16.0
DPI = 100
#: Height of one row and of the title, legend and axis around the rows, inches.
ROW_IN, FRAME_IN = 0.42, 1.9
NETWORK_COLOURS = {"transfer": "0.45", "collective": "black", WEIGHT_SYNC: "crimson"}
HATCHES = ("", "///")


def gantt_size(rows: int) -> tuple[float, float]:
    """The figure's (width, height) in inches for ``rows`` rows (pixels: times :data:`DPI`)."""
    return WIDTH_IN, FRAME_IN + ROW_IN * max(rows, 1)


def task_colour(task: str):
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    i = TASK_NAMES.index(task) if task in TASK_NAMES else len(TASK_NAMES) + hash(task) % 3
    return cmap(i % cmap.N)


def _rows(trace: Trace, plan: Plan | None, cluster: ClusterSpec | None, per_gpu: bool
          ) -> tuple[list[str], dict[int, list[int]]]:
    """Row labels, and per device the rows it belongs to."""
    devices = sorted({d for s in trace.spans for d in s.devices})
    if per_gpu:
        if plan is not None:
            devices = sorted(set(devices) | set(plan.device_ids))
        labels = []
        for d in devices:
            if cluster is not None and d < cluster.num_devices:
                dev = cluster.devices[d]
                labels.append(f"GPU {d} {dev.gpu.name} {dev.node}")
            else:
                labels.append(f"GPU {d}")
        return labels, {d: [i] for i, d in enumerate(devices)}
    if plan is not None:  # one row per task, grouped by task group: what runs where
        labels, member = [], defaultdict(list)
        for gi, g in enumerate(plan.groups):
            for t in g.tasks:
                where = f"{len(g.devices)} GPUs"
                if cluster is not None:
                    from hetrl.cost.details import where_task_runs, where_text

                    info = where_task_runs(plan.placement(t), cluster)
                    where = where_text(info)
                    if len(where) > 44:  # the first type and region, and how many more
                        first = info["by_type_region"][0]
                        where = f"{first['count']} x {first['gpu']} ({first['region']}) + " \
                            f"{info['gpus'] - first['count']} more GPUs"
                labels.append(f"{_short(t)} (group {gi})\n{where}")
                for d in g.devices:
                    member[d].append(len(labels) - 1)
        return labels, dict(member)
    # no plan: one row per distinct device set of the task spans
    sets: dict[tuple[int, ...], int] = {}
    for s in trace.spans:
        if s.kind == "task" and s.task != WEIGHT_SYNC and s.devices:
            sets.setdefault(tuple(sorted(s.devices)), len(sets))
    member = defaultdict(list)
    for ds, i in sets.items():
        for d in ds:
            if i not in member[d]:
                member[d].append(i)
    labels = [f"devices {list(ds)[:6]}{'...' if len(ds) > 6 else ''}" for ds in sets]
    return labels, dict(member)


def _short(task: str) -> str:
    return task.replace("_inference", "_inf").replace("_generation", "_gen").replace(
        "_training", "_train")


def _span_rows(s: Span, member: dict[int, list[int]], task_of_row: list[str] | None = None
               ) -> set[int]:
    """The rows a span is drawn on: its devices' rows; with one row per task, a task's span only
    on that task's row (a span of no task of the rows, e.g. the weight sync, on all of them)."""
    rows = {r for d in s.devices for r in member.get(d, ())}
    if task_of_row is None:
        return rows
    own = {r for r in rows if task_of_row[r] == s.task}
    return own or rows


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _task_lanes(trace: Trace, member: dict[int, list[int]], per_gpu: bool,
                task_of_row: list[str] | None = None) -> dict[tuple[int, int], int]:
    """Per (row, id of a task span) its sub-lane: tasks of one group that run at the same time
    (on different GPUs of the group) are stacked, greedily, the first free lane first."""
    if per_gpu:
        return {}
    ends: dict[int, list[float]] = defaultdict(list)
    out = {}
    tasks = sorted((s for s in trace.spans if s.kind == "task" and s.task != WEIGHT_SYNC),
                   key=lambda s: (s.start_s, s.end_s))
    for s in tasks:
        for r in _span_rows(s, member, task_of_row):
            free = ends[r]
            k = next((i for i, e in enumerate(free) if e <= s.start_s + 1e-12), len(free))
            if k == len(free):
                free.append(s.end_s)
            else:
                free[k] = s.end_s
            out[(r, id(s))] = k
    return out


def draw_gantt(trace: Trace, plan: Plan | None = None, cluster: ClusterSpec | None = None,
               per_gpu: bool = False, title: str | None = None):
    """The Gantt chart of ``trace`` as a matplotlib Figure (not yet written)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    labels, member = _rows(trace, plan, cluster, per_gpu)
    task_of_row = None if per_gpu or plan is None else [t for g in plan.groups for t in g.tasks]
    n = len(labels)
    fig = Figure(figsize=gantt_size(n), dpi=DPI)
    height = gantt_size(n)[1]
    ax = fig.add_axes((0.2, 1.25 / height, 0.72, 1 - 1.75 / height))
    t0 = min([a for a, _ in trace.iterations] + [s.start_s for s in trace.spans] or [0.0])
    t1 = max([b for _, b in trace.iterations] + [s.end_s for s in trace.spans] or [1.0])
    t1 = max(t1, t0 + 1e-9)
    min_label = (t1 - t0) * 0.035

    # (row, lane, colour, hatch, alpha) -> bars; one broken_barh per key (fast on big traces)
    bars: dict[tuple[int, str, object, str, float], list[tuple[float, float]]] = defaultdict(list)
    busy: dict[int, list[tuple[float, float]]] = defaultdict(list)
    labels_at: list[tuple[float, float, str]] = []
    faults: list[float] = []
    lane_of = _task_lanes(trace, member, per_gpu, task_of_row)
    lanes = defaultdict(lambda: 1)
    for (r, _), k in lane_of.items():
        lanes[r] = max(lanes[r], k + 1)
    for s in trace.spans:
        if s.kind == "fault":
            faults.append(s.start_s)
            continue
        if s.kind == "phase":  # inside its tasklet, which the chart draws
            continue
        rows = _span_rows(s, member, task_of_row)
        hatch = HATCHES[s.iteration % 2]
        if s.kind in ("transfer", "collective") or s.task == WEIGHT_SYNC:
            colour = NETWORK_COLOURS[WEIGHT_SYNC if s.task == WEIGHT_SYNC else s.kind]
            for r in rows:
                bars[(r, "net", colour, "", 0.8)].append((s.start_s, s.duration_s))
            continue
        if s.kind == "tasklet" and not per_gpu:
            continue  # a group's row shows whole tasks
        colour = task_colour(s.task)
        alpha = 0.3 if (per_gpu and s.kind == "task") else 1.0
        for r in rows:
            lane = lane_of.get((r, id(s)), 0) if s.kind == "task" and not per_gpu else 0
            bars[(r, f"task{lane}", colour, hatch, alpha)].append((s.start_s, s.duration_s))
            if (s.kind == "tasklet") == per_gpu:  # per GPU its tasklets, per group its tasks
                busy[r].append((s.start_s, s.end_s))
            if s.kind == "task" and s.duration_s >= min_label:
                labels_at.append((s.start_s + s.duration_s / 2, r, lane, str(s.iteration + 1)))
    for (r, lane, colour, hatch, alpha), xs in bars.items():
        if lane == "net":
            y, h = (n - 1 - r) + 0.06, 0.22
        else:  # concurrent tasks of one group share the upper lane in sub-lanes
            h = 0.56 / lanes[r]
            y = (n - 1 - r) + 0.36 + int(lane[4:]) * h
        ax.broken_barh(xs, (y, h), facecolors=colour, alpha=alpha, hatch=hatch or None,
                       edgecolor="white" if hatch else "none", linewidth=0.0 if not hatch else 0.3)
    for x, r, lane, text in labels_at:
        h = 0.56 / lanes[r]
        ax.text(x, (n - 1 - r) + 0.36 + (lane + 0.5) * h, text, ha="center", va="center",
                fontsize=6, color="white", weight="bold")
    for _, b in trace.iterations:
        ax.axvline(b, color="0.5", lw=0.7, ls="--")
    for x in faults:
        ax.axvline(x, color="red", lw=1.2)
    span = t1 - t0
    for r in range(n):
        share = _union_length(busy.get(r, [])) / span if busy.get(r) else 0.0
        ax.text(1.005, (n - 1 - r + 0.5) / n, f"busy {100 * share:.0f}%", fontsize=7,
                va="center", transform=ax.transAxes)
    ax.set_yticks([n - 1 - r + 0.5 for r in range(n)], labels, fontsize=7)
    ax.set_ylim(0, n)
    ax.set_xlim(t0, t1)
    ax.set_xlabel("seconds from the start of the run")
    ax.grid(axis="x", color="0.9", lw=0.5)
    ax.set_axisbelow(True)
    iters = len(trace.iterations)
    view = "per GPU" if per_gpu else "per task" if plan is not None else "per task group"
    fig.suptitle(title or f"{trace.workload} on {trace.cluster} ({trace.source}): {iters} "
                 f"iteration(s), {view}", fontsize=11,
                 y=1 - 0.12 / height)
    tasks = [t for t in TASK_NAMES if any(s.task == t for s in trace.spans)]
    handles = [Patch(fc=task_colour(t), label=t) for t in tasks]
    handles += [Patch(fc=c, label=k if k != WEIGHT_SYNC else "weight sync")
                for k, c in NETWORK_COLOURS.items()]
    handles += [Patch(fc="0.7", hatch=HATCHES[1], ec="white", label="even iterations (2, 4, ...)")]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=7,
               frameon=False, bbox_to_anchor=(0.5, 0.0))
    return fig


def write_gantt(trace: Trace, path: str, plan: Plan | None = None,
                cluster: ClusterSpec | None = None, per_gpu: bool = False,
                field: str = "--gantt") -> None:
    """Draw and write the chart; the format follows the suffix (.png or .svg; none: PNG)."""
    from hetrl.views.plan_picture import picture_format, save_figure

    fmt = picture_format(path, None, field)
    save_figure(draw_gantt(trace, plan, cluster, per_gpu), path, fmt, field)
