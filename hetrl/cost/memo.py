"""The cost model's tables of pure functions of a cluster's topology (link facts, DP and
fan-in times, weight-sync factors, device efficiencies, the node symmetry), kept here and not on
the spec objects. One set of tables per :class:`~hetrl.spec.cluster.Topology` object, held
weakly: a cluster that is dropped takes its tables with it. Every table starts afresh past
``MEMO_SIZE`` entries (long searches: bound the memory)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from hetrl.spec.cluster import ClusterSpec

#: Entries per table before it starts afresh.
MEMO_SIZE = 200_000

_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def topology_table(cluster: ClusterSpec, kind: str) -> dict:
    """The table ``kind`` of ``cluster``'s topology (made empty on first use)."""
    topo = cluster.topology
    tables = _TABLES.get(topo)
    if tables is None:
        tables = _TABLES[topo] = {}
    table = tables.get(kind)
    if table is None:
        table = tables[kind] = {}
    return table


def topology_memoised(cluster: ClusterSpec, kind: str, key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()`` once per (``kind``, ``key``) for ``cluster``'s topology (pure functions of
    it, and of ``key``, only)."""
    table = topology_table(cluster, kind)
    out = table.get(key)
    if out is None:
        out = compute()
        if len(table) >= MEMO_SIZE:
            table.clear()
        table[key] = out
    return out
