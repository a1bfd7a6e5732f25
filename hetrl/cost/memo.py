"""Every memo table of the cost model, named and bounded, in one place.

The formulas (``tasks.py``, ``fsdp.py``, ``model_*.py``, ...) stay free of caching concerns: a
speed-up is a lookup in a :class:`Table` here before the formula runs, and a :meth:`Table.put`
after. Each table starts afresh past its limit (long searches: bounded memory; an emptied table
changes no answer, only the time until it fills again).

- **Per topology** (:func:`topology_table`): pure functions of a cluster's topology (link facts,
  DP and fan-in times, weight-sync factors, device efficiencies, the node symmetry), held
  weakly per :class:`~hetrl.spec.cluster.Topology` object: a cluster that is dropped takes its
  tables with it; nothing is stored on the spec objects.
- **Per process** (module constants below): n-independent task terms and engines, micro-batchers,
  weight-sync needs, stage arrays, and the facts shared by cost models of one (workload,
  cluster, params).
- **Per (workload, cluster, params)** (:class:`SharedTables`): tables every CostModel built for
  them shares.
- **Per CostModel** (:class:`OwnTables`): its plans, tasks, groups and their parts, bounded
  together (:data:`MODEL_ENTRIES`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from hetrl.spec.cluster import ClusterSpec


class Table(dict):
    """A memo table: a dict that starts afresh when a :meth:`put` finds ``limit`` entries."""

    __slots__ = ("name", "limit")

    def __init__(self, name: str, limit: int):
        super().__init__()
        self.name = name
        self.limit = limit

    def put(self, key: Any, value: Any) -> Any:
        """Store ``value`` under ``key`` (emptying the table first when it is full); returns
        ``value``."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value

    def __repr__(self) -> str:
        return f"Table({self.name!r}, {len(self)}/{self.limit})"


# --- per topology ----------------------------------------------------------------------------

#: Entries per topology table before it starts afresh.
MEMO_SIZE = 200_000

_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def topology_table(cluster: ClusterSpec, kind: str) -> Table:
    """The table ``kind`` of ``cluster``'s topology (made empty on first use)."""
    topo = cluster.topology
    tables = _TABLES.get(topo)
    if tables is None:
        tables = _TABLES[topo] = {}
    table = tables.get(kind)
    if table is None:
        table = tables[kind] = Table(f"topology {kind}", MEMO_SIZE)
    return table


def topology_memoised(cluster: ClusterSpec, kind: str, key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()`` once per (``kind``, ``key``) for ``cluster``'s topology (pure functions of
    it, and of ``key``, only)."""
    table = topology_table(cluster, kind)
    out = table.get(key)
    if out is None:
        out = table.put(key, compute())
    return out


# --- per process -----------------------------------------------------------------------------

#: n-independent terms and engines per (kind, stage shapes, replica hardware, lengths, params)
TASK_TERMS = Table("task terms", 100_000)
#: micro-batchers per (batching, lengths)
BATCHERS = Table("micro-batchers", 1024)
#: weight-sync destinations and bytes per (generation layout, training layout)
SYNC_NEEDS = Table("weight-sync needs", 10_000)
#: the first index of each (replica, stage) in a grid's flat device ids, per (devices, tp)
STAGE_STARTS = Table("stage starts", 10_000)
#: parameters per stage (one tp rank) of interned stage shapes, as an array
STAGE_PARAMS = Table("stage parameters", 10_000)
#: the facts and :class:`SharedTables` per (workload, cluster, params), keyed by identity (each
#: entry holds its keys, so an id is never reused while it lives)
MODEL_FACTS = Table("cost-model facts", 64)

#: Entries of an engine's own tables (per layout and replica hardware).
ENGINE_ENTRIES = 4096


# --- per (workload, cluster, params) ---------------------------------------------------------

def _table(name: str, limit: int = 100_000) -> Any:
    return field(default_factory=lambda: Table(name, limit))


@dataclass(frozen=True)
class SharedTables:
    """The tables every CostModel of one (workload, cluster, params) shares. ``device_entries``
    bounds the three whose entries hold arrays over all devices (~100 MB in all at most)."""

    device_entries: int
    #: the model copies and task groups of a task layout
    copy_groups: Table = _table("copy groups")
    #: the interned stage shapes of a (role, layers per stage, tp)
    shapes: Table = _table("stage shapes")
    #: replica hardware per replica grid
    hw: Table = _table("replica hardware")
    #: replica hardware per (pp, tp, node of each device), where the nodes are symmetric
    hw_by_nodes: Table = _table("replica hardware by nodes")
    #: engines per (task kind, id of stage shapes, id of replica hardware) -> (shapes, hw,
    #: engine): the entry holds the two objects, so their ids stay theirs while it lives
    engines: Table = _table("engines")
    #: per-device bytes of a layout's tasklets per (kind, id of the interned stage shapes, dp,
    #: tp, per-replica batch inputs, backend, offload)
    slot_rows: Table = _table("tasklet memory rows")
    #: per-device arrays of a placement (for the ILP), per (id of its tasklet rows, grid)
    dense: Table = field(init=False)
    #: a task group's memory, per (ids of its tasklet rows, grids, copies)
    group_mem: Table = field(init=False)
    #: the workflow's merge steps per (stage tasks, device sets): see workflow.iteration_time
    makespan: Table = field(init=False)

    def __post_init__(self) -> None:
        for name in ("dense", "group_mem", "makespan"):
            object.__setattr__(self, name, Table(name.replace("_", " "), self.device_entries))


# --- per CostModel ---------------------------------------------------------------------------

#: A cost model's own entries (plans, tasks, groups, placements, ...) before they all start
#: afresh: ~2.5 KB each measured (paper64 PPO, 60 s search: 1.5 GB resident at ~550,000), so
#: ~2 GB per process. Unbounded, a 10-minute search held 8.3 GB per process.
MODEL_ENTRIES = 800_000


@dataclass(frozen=True)
class OwnTables:
    """One CostModel's tables, bounded together: when their entries pass
    :data:`MODEL_ENTRIES` they are all emptied at once (some are read on the others' hits)."""

    #: estimates per plan placements
    plans: dict = field(default_factory=dict)
    #: (iteration seconds, feasible) per plan placements, of plans the neighbourhood pricer
    #: priced (hetrl.cost.neighbourhood)
    briefs: dict = field(default_factory=dict)
    #: task results per placement (and generation placement, KV budgets)
    tasks: dict = field(default_factory=dict)
    #: task-group results per (placements, copies)
    groups: dict = field(default_factory=dict)
    #: per-device bytes per placement
    memory: dict = field(default_factory=dict)
    #: task-level terms (DP, FSDP collectives, replica hardware, KV caps, callers' memoised)
    tasklevel: dict = field(default_factory=dict)
    #: replica costs per (engine, sequences[, dp])
    replica: dict = field(default_factory=dict)
    #: weight-sync seconds per (generation grid and layers, training grid, layers, backend)
    sync: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the tables as a tuple: counted before every new estimate (fields() costs microseconds)
        object.__setattr__(self, "_all", tuple(getattr(self, f.name) for f in fields(self)))

    def entries(self) -> int:
        return sum(map(len, self._all))

    def full(self) -> bool:
        """Whether the tables hold more than :data:`MODEL_ENTRIES` entries."""
        return sum(map(len, self._all)) > MODEL_ENTRIES

    def clear(self) -> None:
        for table in self._all:
            table.clear()
