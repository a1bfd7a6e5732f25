"""The five-level search space of HetRL and the size of each level.

Level 1: task groupings -- set partitions of the workflow's tasks (Bell number B_T).
Level 2: GPU-group sizes -- compositions of the N GPUs into one part per group (C(N-1, G-1)).
Level 3: concrete GPU sets -- N! / prod(n_g!) ways, fewer once GPUs of one type in one node
         are treated as interchangeable (multinomials over each node's type classes).
Level 4: (dp, pp, tp) per task with dp*pp*tp <= n_g (here: > n_g / 2, tp dividing the heads),
         and ep for a mixture-of-experts model.
Level 5: tasklet-to-GPU maps inside a group (<= n_g! per task).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from functools import lru_cache

from hetrl.errors import SpecError
from hetrl.plan import validate_layout
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.model import ModelShape
from hetrl.spec.tasks import COLOCATED_WITH
from hetrl.spec.workload import WorkloadSpec

#: (dp, pp, tp); (dp, 1, 1, backend) for an FSDP layout; (dp, pp, tp, ep) with an int ep > 1
#: for a Megatron layout with expert parallelism; (dp, 1, 1, backend, ep) for an FSDP one with
#: expert parallelism (see :func:`with_backends`)
Layout = tuple
#: The FSDP layouts a training or inference task may take besides Megatron's: the backend
#: string of a layout's fourth element and the placement fields it stands for.
FSDP_VARIANTS = {"fsdp": ("fsdp", False), "fsdp+offload": ("fsdp", True)}


def with_backends(kind: str, base: tuple[Layout, ...],
                  backends: tuple[str, ...] = ("megatron", "fsdp"),
                  model: ModelShape | None = None) -> tuple[Layout, ...]:
    """``base`` layouts of a task of ``kind`` plus, for training and inference when ``backends``
    (the workload's) has ``fsdp``, an FSDP variant (with and without offload) of each
    data-parallel-only one (pp = tp = 1); for a mixture-of-experts ``model``, each Megatron
    and FSDP layout with every expert parallelism it allows (:func:`expert_parallel_sizes`)."""
    moe = model is not None and model.moe is not None
    out = base
    if moe:
        out = base + tuple((*x, ep) for x in base for ep in expert_parallel_sizes(model, x[0]))
    if kind == "generation" or "fsdp" not in backends:
        return out
    flat = [x for x in base if x[1] == 1 and x[2] == 1]
    out += tuple((x[0], 1, 1, v) for x in flat for v in FSDP_VARIANTS)
    if moe:
        out += tuple((x[0], 1, 1, v, ep) for x in flat for v in FSDP_VARIANTS
                     for ep in expert_parallel_sizes(model, x[0]))
    return out


def expert_parallel_sizes(model: ModelShape, dp: int) -> tuple[int, ...]:
    """The expert parallelism sizes > 1 the search gives a layout of ``dp`` replicas of
    ``model``: powers of two dividing both dp and the routed experts (an expert-parallel group
    is ep whole replicas, each holding experts / ep whole experts)."""
    if model.moe is None:
        return ()
    out, ep = [], 2
    while ep <= dp:
        if dp % ep == 0 and model.moe.experts % ep == 0:
            out.append(ep)
        ep *= 2
    return tuple(out)


def layout_key(lay: Layout) -> tuple:
    """A sort key over layouts of every kind (a Megatron layout first, then its expert-parallel
    variants by ep, then its FSDP ones by name and ep): the order of plain tuples where they
    compare, and no int compared with a str."""
    if len(lay) == 3:
        return (*lay, 0)
    return (*lay[:3], 1 if type(lay[3]) is int else 2, *lay[3:])


def placement_fields(lay: Layout) -> tuple[int, int, int, str, bool, int]:
    """(dp, pp, tp, backend, offload, ep) of a layout."""
    if len(lay) == 3:
        return lay[0], lay[1], lay[2], "megatron", False, 1
    if type(lay[3]) is int:
        return lay[0], lay[1], lay[2], "megatron", False, lay[3]
    backend, offload = FSDP_VARIANTS[lay[3]]
    return lay[0], lay[1], lay[2], backend, offload, lay[4] if len(lay) == 5 else 1
MAX_TP = 8
MAX_PP = 16


def set_partitions(items: Sequence[str]) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every partition of ``items`` into non-empty groups (restricted growth strings)."""
    items = list(items)
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield ((first,),) + part
        for i in range(len(part)):
            yield part[:i] + ((first,) + part[i],) + part[i + 1:]


def task_groupings(workload: WorkloadSpec) -> list[tuple[tuple[str, ...], ...]]:
    """Level 1 arms: all set partitions of the tasks, each group in workflow order, groups
    ordered by their first task (a canonical form). A task that must share a host's group
    (``COLOCATED_WITH``: actor_inference with actor_training) joins the host's group."""
    order = {t: i for i, t in enumerate(workload.task_names)}
    follows = {t: h for t, h in COLOCATED_WITH.items() if t in order and h in order}
    out = set()
    for part in set_partitions([t for t in workload.task_names if t not in follows]):
        part = tuple(g + tuple(t for t, h in follows.items() if h in g) for g in part)
        groups = tuple(sorted((tuple(sorted(g, key=order.get)) for g in part),
                              key=lambda g: order[g[0]]))
        out.add(groups)
    return sorted(out, key=lambda p: (len(p), [[order[t] for t in g] for g in p]))


def bell(n: int) -> int:
    """Bell number B_n (number of set partitions of n items)."""
    row = [1]
    for _ in range(n):
        nxt = [row[-1]]
        for x in row:
            nxt.append(nxt[-1] + x)
        row = nxt
    return row[0]


@lru_cache(maxsize=4096)
def _layouts(model: ModelShape, n: int) -> tuple[Layout, ...]:
    out = []
    for tp in (1, 2, 4, 8, 16):
        if tp > min(MAX_TP, n):
            break
        try:
            validate_layout(model, tp, 1, "layout")
        except SpecError:
            continue
        for pp in range(1, min(MAX_PP, model.layers, n // tp) + 1):
            dp = n // (tp * pp)
            if dp >= 1 and dp * tp * pp > n / 2:
                out.append((dp, pp, tp))
    return tuple(out)


def layouts(model: ModelShape, n: int) -> tuple[Layout, ...]:
    """Level 4 candidates for a task of ``model`` on a group of ``n`` GPUs: (dp, pp, tp) with tp a
    power of two <= 8 dividing the heads, pp <= min(16, layers), using more than half the GPUs
    (dp = floor(n / (pp * tp)))."""
    return _layouts(model, n)


def aligned(used: int, n: int, node_size: int) -> bool:
    """Whether a part of ``used`` GPUs of a group of ``n`` is one the search considers: a
    multiple of the node size, or half the group."""
    return used % node_size == 0 or 2 * used == n


@lru_cache(maxsize=4096)
def _sub_layouts(model: ModelShape, n: int) -> tuple[Layout, ...]:
    full = set(_layouts(model, n))
    out: set[Layout] = set()
    for m in range(1, n):
        out.update(x for x in _layouts(model, m) if x[0] * x[1] * x[2] == m and x not in full)
    return tuple(sorted(out, key=lambda x: (x[2], x[1], x[0])))


def sub_layouts(model: ModelShape, n: int) -> tuple[Layout, ...]:
    """The rest of the paper's level 4 (any dp * pp * tp <= n_t): layouts on a group of ``n``
    GPUs that leave part of it to other tasks of the group -- not in :func:`layouts` (whose dp
    is the largest that fits), same tp and pp rules. The EA draws them as a second kind of
    layout mutation, so that tasks of one group can run side by side on different parts of it
    (our addition; see docs/search.md)."""
    return _sub_layouts(model, n)


def device_classes(cluster: ClusterSpec) -> dict[tuple[str, str], list[int]]:
    """Interchangeable GPUs: (node, GPU type) -> device ids."""
    out: dict[tuple[str, str], list[int]] = {}
    for d in cluster.devices:
        out.setdefault((d.node, d.gpu.name), []).append(d.id)
    return out


def space_size(workload: WorkloadSpec, cluster: ClusterSpec) -> dict[str, float]:
    """log10 of each level's size (and of their product) for the paper's formulas, plus
    the raw counts where they are small. Level 3 is counted with and without symmetry."""
    t = len(workload.tasks)
    n = cluster.num_devices
    groupings = task_groupings(workload)
    level1 = len(groupings)
    # Level 2: sum over groupings of compositions of N into G parts.
    level2 = sum(math.comb(n - 1, len(g) - 1) for g in groupings)
    # Level 3 for an even split into G groups, with and without symmetry, maximised over G.
    classes = [len(v) for v in device_classes(cluster).values()]
    log_l3 = log_l3_sym = 0.0
    for g in range(1, t + 1):
        sizes = [n // g + (1 if i < n % g else 0) for i in range(g)]
        raw = math.lgamma(n + 1) - sum(math.lgamma(s + 1) for s in sizes)
        log_l3 = max(log_l3, raw / math.log(10))
        # with symmetry: ways to split each class's count over g groups (stars and bars)
        sym = sum(math.log(math.comb(c + g - 1, g - 1)) for c in classes)
        log_l3_sym = max(log_l3_sym, sym / math.log(10))
    per_task = [len(with_backends(ti.kind, layouts(workload.model(ti.role), n), workload.backends,
                                  workload.model(ti.role)))
                for ti in workload.tasks]
    log_l4 = sum(math.log10(max(c, 1)) for c in per_task)
    log_l5 = t * math.lgamma(n + 1) / math.log(10)
    return {
        "tasks": t,
        "devices": n,
        "level1_task_groupings": level1,
        "bell_number": bell(t),
        "level2_gpu_groupings": level2,
        "log10_level3_gpu_sets": log_l3,
        "log10_level3_gpu_sets_symmetric": log_l3_sym,
        "log10_level4_layouts": log_l4,
        "log10_level5_tasklet_maps": log_l5,
        "log10_total": math.log10(level2) + log_l3 + log_l4 + log_l5,
    }
