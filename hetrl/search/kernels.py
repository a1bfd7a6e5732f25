"""Compiled kernels of the search (numba, cached on disk, as hetrl/cost/kernels.py's): plain
Python loops over numpy arrays, run as such where numba is missing (slowly, with the same
answers); ``kernel.py_func`` is the uncompiled function either way, which the tests compare
against.

The swap loop of the EA's local search (:func:`hetrl.search.ea.local_search`) is one: its numpy
form built a matrix of gains over every pair of device classes at each step; this loop takes
the same steps, in integers, and picks the same swap (timings: docs/search.md, "local
search").
"""

from __future__ import annotations

import numpy as np

from hetrl.cost.kernels import compiled


@compiled
def locality_swaps(order: np.ndarray, group_of: np.ndarray, n_groups: int, node: np.ndarray,
                   zone: np.ndarray, region: np.ndarray, gpu: np.ndarray, n_node: int,
                   n_zone: int, n_region: int, n_gpu: int, aff_node: int, aff_zone: int,
                   aff_region: int, max_swaps: int) -> None:
    """Greedy swaps of ``order`` (device ids by position, changed in place) that raise the
    locality score: up to ``max_swaps`` times, the swap of two GPUs of one type in different
    groups (``group_of``: each position's group, ``n_groups`` of them) and different nodes with
    the largest gain, until none gains. ``node``, ``zone``, ``region``, ``gpu``: per device id,
    indices below ``n_node`` ... ``n_gpu``.

    A group's score counts, over every pair of its GPUs, ``aff_node`` if they share a node,
    else ``aff_zone`` if a zone, else ``aff_region`` if a region. GPUs of one (group, node,
    type) class are interchangeable, so each class is represented by its first position;
    classes are taken in the order of (group, node, type), and of two swaps with the same gain
    the one of the earlier pair (first class, then second) is made: the swap the numpy form it
    replaced made (the argmax of its gain matrix)."""
    n = order.size
    n_keys = n_groups * n_node * n_gpu
    cn = np.zeros((n_groups, n_node), dtype=np.int64)
    cz = np.zeros((n_groups, n_zone), dtype=np.int64)
    cr = np.zeros((n_groups, n_region), dtype=np.int64)
    first = np.full(n_keys, -1, dtype=np.int64)
    reps = np.empty(n, dtype=np.int64)
    by_type = np.empty(n, dtype=np.int64)
    count = np.zeros(n_gpu + 1, dtype=np.int64)
    fill = np.zeros(n_gpu + 1, dtype=np.int64)
    for _ in range(max_swaps):
        cn[:] = 0
        cz[:] = 0
        cr[:] = 0
        first[:] = -1
        for p in range(n):
            g, d = group_of[p], order[p]
            cn[g, node[d]] += 1
            cz[g, zone[d]] += 1
            cr[g, region[d]] += 1
            key = (g * n_node + node[d]) * n_gpu + gpu[d]
            if first[key] < 0:
                first[key] = p
        r = 0
        for key in range(n_keys):  # the classes' first positions, in (group, node, type) order
            if first[key] >= 0:
                reps[r] = first[key]
                r += 1
        # the classes of each GPU type, in that order (only GPUs of one type are swapped)
        count[:] = 0
        for i in range(r):
            count[gpu[order[reps[i]]] + 1] += 1
        for t in range(n_gpu):
            count[t + 1] += count[t]
        fill[:] = count
        for i in range(r):
            t = gpu[order[reps[i]]]
            by_type[fill[t]] = i
            fill[t] += 1
        best, bi, bj = 0, -1, -1
        for i in range(r):
            pi = reps[i]
            gi, di = group_of[pi], order[pi]
            ni, zi, ri, ti = node[di], zone[di], region[di], gpu[di]
            # a member scores its own group as a non-member would, less one node pair
            own_i = (aff_node * cn[gi, ni] + aff_zone * (cz[gi, zi] - cn[gi, ni])
                     + aff_region * (cr[gi, ri] - cz[gi, zi]) - aff_node)
            for k in range(count[ti], count[ti + 1]):
                pj = reps[by_type[k]]
                gj, dj = group_of[pj], order[pj]
                nj = node[dj]
                if not (gi < gj and nj != ni):
                    continue
                zj, rj = zone[dj], region[dj]
                own_j = (aff_node * cn[gj, nj] + aff_zone * (cz[gj, zj] - cn[gj, nj])
                         + aff_region * (cr[gj, rj] - cz[gj, zj]) - aff_node)
                i_in_j = (aff_node * cn[gj, ni] + aff_zone * (cz[gj, zi] - cn[gj, ni])
                          + aff_region * (cr[gj, ri] - cz[gj, zi]))
                j_in_i = (aff_node * cn[gi, nj] + aff_zone * (cz[gi, zj] - cn[gi, nj])
                          + aff_region * (cr[gi, rj] - cz[gi, zj]))
                aff = aff_zone if zi == zj else (aff_region if ri == rj else 0)
                gain = i_in_j + j_in_i - 2 * aff - own_i - own_j
                if gain > best:
                    best, bi, bj = gain, pi, pj
        if best <= 0:
            return
        order[bi], order[bj] = order[bj], order[bi]
