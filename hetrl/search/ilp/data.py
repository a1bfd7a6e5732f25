"""The ILP's data: each task's candidates (device set, layout), priced by the cost model.

A device set takes, in each node, nothing or one aligned power-of-two block of its GPUs (GPUs of
a type in a node are interchangeable, so blocks lose nothing but the order); the layout uses the
whole set (dp * pp * tp = |set|). A candidate is load-balanced and priced alone
(``CostModel.task_alone``): its seconds and the bytes it needs on each device.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from hetrl.cost.model import CostModel
from hetrl.cost.primitives import node_symmetry
from hetrl.errors import HetrlError
from hetrl.plan import TaskPlacement, make_placement
from hetrl.search.balance import balance
from hetrl.search.space import layouts, placement_fields, with_backends

SCALE = 1000  # objective units per second (integer milliseconds)


@dataclass(frozen=True)
class Candidate:
    """One (task, device set, layout): ``seconds`` running alone, ``need`` bytes per device of
    the cluster (0 where unused)."""

    task: str
    devices: tuple[int, ...]
    placement: TaskPlacement
    seconds: float
    need: np.ndarray


def node_blocks(cluster) -> list[list[tuple[int, ...]]]:
    """Per node, its aligned power-of-two blocks of GPUs (the whole node, halves, quarters...)."""
    out, start = [], 0
    for node in cluster.nodes:
        ids = list(range(start, start + node.count))
        start += node.count
        blocks, size = [], node.count
        while size >= 1:
            if node.count % size == 0:
                blocks += [tuple(ids[i:i + size]) for i in range(0, node.count, size)]
            if size == 1:
                break
            size //= 2
        out.append(blocks)
    return out


def device_sets(cluster, max_sets: int = 4096) -> list[tuple[int, ...]]:
    """Unions of at most one block per node (every non-empty combination)."""
    per_node = [[()] + blocks for blocks in node_blocks(cluster)]
    total = int(np.prod([len(b) for b in per_node]))
    if total - 1 > max_sets:
        raise HetrlError(f"ilp: {total - 1} device sets exceed the limit of {max_sets}; the ILP "
                         "is meant for small clusters (up to ~24 GPUs)")
    sets = []
    for combo in itertools.product(*per_node):
        devices = tuple(d for block in combo for d in block)
        if devices:
            sets.append(devices)
    return sets


def candidates(model: CostModel, load_balance: bool = True, max_sets: int = 4096,
               reuse_symmetric: bool = True) -> dict[str, list[Candidate]]:
    """Every task's priced candidates, in device-set, task and layout order; candidates that do
    not fit in memory even alone are left out. Where every node's GPUs are interchangeable
    (``node_symmetry``), device sets that take blocks of the same size in the same nodes are
    renamings of each other, and so are their candidates: each such class is priced once and
    the rest renamed (``reuse_symmetric``; exact, bit for bit)."""
    wl = model.workload
    out: dict[str, list[Candidate]] = {t: [] for t in wl.task_names}
    usable = model.cluster.topology.memory_bytes * model.params.usable_memory_fraction
    sym = node_symmetry(model.cluster) if reuse_symmetric else None
    priced: dict[tuple[int, ...], tuple[tuple[int, ...], list[Candidate]]] = {}
    for devices in device_sets(model.cluster, max_sets):
        if sym is not None:
            counts = [0] * len(sym[1])
            for d in devices:
                counts[sym[0][d]] += 1
            key = tuple(counts)  # GPUs per node: with one block per node, its size
            hit = priced.get(key)
            if hit is not None:  # the same block sizes in the same nodes: rename
                first, cands = hit
                for c in cands:
                    out[c.task].append(_renamed(c, first, devices))
                continue
        mine = []
        n = len(devices)
        for t in wl.task_names:
            shape = wl.model(wl.task(t).role)
            for lay in with_backends(wl.task(t).kind, layouts(shape, n), wl.backends, shape):
                dp, pp, tp, backend, offload, ep = placement_fields(lay)
                if dp * pp * tp != n:
                    continue
                p = make_placement(t, devices, dp, pp, tp, shape.layers, backend=backend,
                                   offload=offload, ep=ep)
                if load_balance:
                    p = balance(model, p)
                seconds, need = model.task_alone(p)
                if np.any(need > usable + 1e-6):
                    continue  # cannot fit even alone
                mine.append(Candidate(t, devices, p, seconds, need))
        if sym is not None:
            priced[key] = (devices, mine)
        for c in mine:
            out[c.task].append(c)
    return out


def _renamed(c: Candidate, first: tuple[int, ...], devices: tuple[int, ...]) -> Candidate:
    """Candidate ``c`` on device set ``first`` moved to ``devices``: both list their GPUs node by
    node in id order with equal counts per node, so position i of one is position i of the
    other (a renaming within nodes: same seconds, same bytes on the renamed devices)."""
    name = dict(zip(first, devices, strict=True))
    grid = tuple(tuple(tuple(name[d] for d in stage) for stage in replica)
                 for replica in c.placement.devices)
    need = np.zeros_like(c.need)
    need[list(devices)] = c.need[list(first)]
    return Candidate(c.task, devices, replace(c.placement, devices=grid), c.seconds, need)


def prune_dominated(cands: dict[str, list[Candidate]],
                    keep: tuple[str, ...] = ("actor_generation", "actor_training")
                    ) -> dict[str, list[Candidate]]:
    """Drop candidates that another candidate of the same task on the same devices dominates
    (no slower and needing no more memory on any device; ties keep the first). Exact: every
    constraint and the objective see a candidate only through its devices, duration and memory
    -- except for generation and actor training, whose layouts also enter the weight sync, so
    ``keep`` leaves them whole."""
    out = {}
    for t, cs in cands.items():
        if t in keep:
            out[t] = cs
            continue
        by_devices: dict[tuple[int, ...], list[Candidate]] = {}
        for c in cs:
            by_devices.setdefault(c.devices, []).append(c)
        kept = []
        for c in cs:
            rivals = by_devices[c.devices]
            dominated = False
            for i, o in enumerate(rivals):
                if o is c:
                    continue
                if o.seconds <= c.seconds and np.all(o.need <= c.need) and (
                        o.seconds < c.seconds or np.any(o.need < c.need)
                        or i < rivals.index(c)):
                    dominated = True
                    break
            if not dominated:
                kept.append(c)
        out[t] = kept
    return out
