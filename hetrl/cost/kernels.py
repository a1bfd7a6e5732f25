"""Compiled kernels of the cost model's per-device-grid facts (numba, cached on disk).

A new device grid (a plan's first estimate on devices it has not seen) costs the cost model
some hundreds of small array operations; in Python each costs microseconds of interpreter
overhead, so these loops are compiled with numba (``cache=True``: compiled once per machine
and source version, then loaded from ``__pycache__``). They are plain Python over numpy arrays
and run as such where numba is missing (slowly, with the same answers); ``kernel.py_func`` is
the uncompiled function either way, which the tests compare against.

Each kernel does exactly the floating-point operations, in the same order, as the Python and
numpy code it replaced (no fast-math, so no fused multiply-adds), so the estimates did not change
by a bit.
"""

from __future__ import annotations

import numpy as np

try:
    from numba import njit as _njit
except ImportError:  # pragma: no cover - numba is a dependency; this keeps a bare checkout usable
    _njit = None


def warm_up() -> None:
    """Start numba's code generator in this process (the first call of any kernel costs about
    0.2-0.4 s, once per process), so that a timed search does not count it."""
    ceil_log2(2)


def compiled(fn):
    """``fn`` compiled by numba (no Python objects, cached on disk), or ``fn`` itself."""
    if _njit is None:
        fn.py_func = fn
        return fn
    return _njit(cache=True, nogil=True)(fn)


@compiled
def weight_sync_pulls(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, need: np.ndarray,
                      latency: np.ndarray, bandwidth: np.ndarray, link_eff: np.ndarray,
                      hbm_eff: np.ndarray, own_local: bool, gpu_link: np.ndarray,
                      node_of: np.ndarray, uplink: np.ndarray, region_of: np.ndarray,
                      pair_route: np.ndarray, pair_cap: np.ndarray
                      ) -> tuple[float, np.ndarray, np.ndarray]:
    """The weight sync's slowest term (seconds) and the source each pull takes.

    ``src`` (stage, source): device ids of the training stages' devices; ``dst``: the generation
    devices; ``nbytes``/``need`` (stage, destination): bytes each destination needs from each
    stage (and bytes > 0); ``latency`` (s) and ``bandwidth`` (bytes/s) between devices;
    ``link_eff``, ``hbm_eff`` (effective HBM bytes/s), ``gpu_link`` (effective NVLink/PCIe
    bytes/s) per device; ``own_local``: a destination that is one of a stage's sources copies
    locally over HBM (2 x bytes; training tp = 1) rather than never pulling from itself;
    ``node_of`` per device and ``uplink`` per node (bytes/s); ``region_of`` per device,
    ``pair_route`` (region, region, hop) the directed capped region pairs on the route between
    two regions (-1 padded) and ``pair_cap`` their effective aggregates (bytes/s; empty: no
    pair has a cap, and the two others are not read).

    A pull's time is latency + bytes / (bandwidth x link efficiency of the destination); each
    destination takes, among the sources within 1% of its quickest, the least loaded so far
    (bytes sent; the first in source order on ties), destinations in order, stage by stage.
    The answer is the largest of the slowest chosen pull, every device's bytes out and in over
    its GPU link, every node's bytes out and in (across nodes) over its uplink x the
    smallest destination link efficiency and every capped region pair's bytes (each direction)
    over its aggregate. Returns (seconds, and per (stage, destination) the index of the chosen
    source and that pull's seconds)."""
    n_stages, n_src = src.shape
    n_dst = dst.size
    n_dev = node_of.size
    best = np.zeros((n_stages, n_dst), dtype=np.int64)
    chosen = np.zeros((n_stages, n_dst))
    pull = np.empty(n_src)
    sent = np.empty(n_src)
    dev_out, dev_in, node_out, node_in, pair_load = _new_loads(n_dev, uplink.size, pair_cap.size)
    eff_min = link_eff[dst].min() if n_dst else np.inf
    worst = 0.0
    for s in range(n_stages):
        sent[:] = 0.0
        for k in range(n_dst):
            d = dst[k]
            eff = link_eff[d]
            b = nbytes[s, k]
            quickest = np.inf
            for i in range(n_src):
                a = src[s, i]
                if a == d:
                    t = 2 * b / hbm_eff[d] if own_local else np.inf
                elif need[s, k]:
                    t = latency[a, d] + b / (bandwidth[a, d] * eff)
                else:
                    t = 0.0
                pull[i] = t
                if t < quickest:
                    quickest = t
            limit = quickest * 1.01
            choice = -1
            for i in range(n_src):  # least loaded near source, the first on ties
                if pull[i] <= limit and (choice < 0 or sent[i] < sent[choice]):
                    choice = i
            sent[choice] += b
            best[s, k] = choice
            chosen[s, k] = pull[choice]
            if pull[choice] > worst:
                worst = pull[choice]
            a = src[s, choice]
            if a != d and need[s, k]:
                _add_flow(a, d, b, dev_out, dev_in, node_out, node_in, pair_load, node_of,
                          region_of, pair_route, pair_cap)
    worst = max(worst, _load_bound(dev_out, dev_in, node_out, node_in, pair_load, gpu_link,
                                   uplink, eff_min, pair_cap))
    return worst, best, chosen


@compiled
def _new_loads(n_dev: int, n_nodes: int, n_pairs: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Zeroed byte counters for :func:`_add_flow`: per device out and in, per node out and in,
    per capped region pair."""
    return (np.zeros(n_dev), np.zeros(n_dev), np.zeros(n_nodes), np.zeros(n_nodes),
            np.zeros(n_pairs))


@compiled
def _add_flow(a: int, d: int, b: float, dev_out: np.ndarray, dev_in: np.ndarray,
              node_out: np.ndarray, node_in: np.ndarray, pair_load: np.ndarray,
              node_of: np.ndarray, region_of: np.ndarray, pair_route: np.ndarray,
              pair_cap: np.ndarray) -> None:
    """Count a flow of ``b`` bytes from device ``a`` to ``d`` on the GPU links, the node
    uplinks it crosses and the capped region pairs on its route."""
    dev_out[a] += b
    dev_in[d] += b
    if node_of[a] != node_of[d]:
        node_out[node_of[a]] += b
        node_in[node_of[d]] += b
        if pair_cap.size:
            _add_pair_load(pair_load, region_of[a], region_of[d], b, pair_route)


@compiled
def _load_bound(dev_out: np.ndarray, dev_in: np.ndarray, node_out: np.ndarray,
                node_in: np.ndarray, pair_load: np.ndarray, gpu_link: np.ndarray,
                uplink: np.ndarray, eff_min: float, pair_cap: np.ndarray) -> float:
    """Seconds the counted bytes need at least: every device's bytes out and in over its GPU
    link, every node's over its uplink x ``eff_min``, every capped pair's over its aggregate."""
    worst = 0.0
    for a in range(dev_out.size):
        worst = max(worst, dev_out[a] / gpu_link[a], dev_in[a] / gpu_link[a])
    for n in range(uplink.size):
        nic = uplink[n] * eff_min
        worst = max(worst, node_out[n] / nic, node_in[n] / nic)
    for r in range(pair_cap.size):
        worst = max(worst, pair_load[r] / pair_cap[r])
    return worst


@compiled
def _add_pair_load(pair_load: np.ndarray, ra: int, rb: int, nbytes: float,
                   pair_route: np.ndarray) -> None:
    """Add ``nbytes`` to every capped region pair on the route from region ``ra`` to ``rb``."""
    if ra != rb:
        for h in range(pair_route.shape[2]):
            r = pair_route[ra, rb, h]
            if r < 0:
                break
            pair_load[r] += nbytes


@compiled
def transfers_seconds(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray,
                      latency: np.ndarray, bandwidth: np.ndarray, link_eff: np.ndarray,
                      gpu_link: np.ndarray, node_of: np.ndarray, uplink: np.ndarray,
                      region_of: np.ndarray, pair_route: np.ndarray,
                      pair_cap: np.ndarray) -> float:
    """Seconds of concurrent flows ``src[i]`` -> ``dst[i]`` of ``nbytes[i]`` bytes (the weight
    sync's local fan-out), priced as :func:`weight_sync_pulls` prices its chosen pulls: the
    largest of the slowest flow (latency + bytes / (bandwidth x the destination's link
    efficiency)), every device's bytes out and in over its GPU link, every node's bytes out and
    in (across nodes) over its uplink x the smallest destination link efficiency and every
    capped region pair's bytes over its aggregate. 0 with no flows."""
    dev_out, dev_in, node_out, node_in, pair_load = _new_loads(node_of.size, uplink.size,
                                                               pair_cap.size)
    eff_min = link_eff[dst].min() if dst.size else np.inf
    worst = 0.0
    for k in range(src.size):
        a, d, b = src[k], dst[k], nbytes[k]
        if a == d or b <= 0:
            continue
        t = latency[a, d] + b / (bandwidth[a, d] * link_eff[d])
        if t > worst:
            worst = t
        _add_flow(a, d, b, dev_out, dev_in, node_out, node_in, pair_load, node_of, region_of,
                  pair_route, pair_cap)
    return max(worst, _load_bound(dev_out, dev_in, node_out, node_in, pair_load, gpu_link,
                                  uplink, eff_min, pair_cap))


@compiled
def weight_sync_seconds(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, need: np.ndarray,
                        latency: np.ndarray, bandwidth: np.ndarray, link_eff: np.ndarray,
                        hbm_eff: np.ndarray, own_local: bool, gpu_link: np.ndarray,
                        node_of: np.ndarray, uplink: np.ndarray, region_of: np.ndarray,
                        pair_route: np.ndarray, pair_cap: np.ndarray) -> float:
    """The seconds of :func:`weight_sync_pulls` alone (its arrays stay in compiled code)."""
    return weight_sync_pulls(src, dst, nbytes, need, latency, bandwidth, link_eff, hbm_eff,
                             own_local, gpu_link, node_of, uplink, region_of, pair_route,
                             pair_cap)[0]


# --- collectives ----------------------------------------------------------------------------

#: Columns of a row of link facts (see :class:`hetrl.cost.primitives.GroupLinks`).
LINK_FACTS = ("n", "ring_latency_s", "ring_Bps", "nodes", "per_node", "intra_latency_s",
              "intra_Bps", "inter_latency_s", "inter_Bps", "cross_Bps")


@compiled
def _ring(order: np.ndarray, lo: int, hi: int, latency: np.ndarray,
          bandwidth: np.ndarray) -> tuple[float, float]:
    """The slowest latency and the narrowest bandwidth on the ring through ``order[lo:hi]``
    (0 and inf for fewer than two devices)."""
    lat, bw = 0.0, np.inf
    m = hi - lo
    if m >= 2:
        lat = -np.inf
        for i in range(m):
            a, b = order[lo + i], order[lo + (i + 1) % m]
            if latency[a, b] > lat:
                lat = latency[a, b]
            if bandwidth[a, b] < bw:
                bw = bandwidth[a, b]
    return lat, bw


@compiled
def group_link_facts(devices: np.ndarray, latency: np.ndarray, bandwidth: np.ndarray,
                     node_of: np.ndarray, uplink: np.ndarray) -> np.ndarray:
    """The link facts of a device set for collectives, as a row in :data:`LINK_FACTS` order:
    the ring runs node by node (devices ordered by (node, id)); the in-node rings, the ring
    between each node's first device, and the cross-node flow's share of its node's uplink
    (``uplink`` bytes/s per node / the set's devices on that node, the smallest; inf within
    one node). ``per_node`` is 0 when the nodes hold different numbers of the devices."""
    out = np.empty(10)
    _link_facts_into(out, devices, np.empty(devices.size, dtype=np.int64),
                     np.empty(devices.size, dtype=np.int64), latency, bandwidth, node_of, uplink)
    return out


@compiled
def _link_facts_into(out: np.ndarray, devices: np.ndarray, order: np.ndarray, reps: np.ndarray,
                     latency: np.ndarray, bandwidth: np.ndarray, node_of: np.ndarray,
                     uplink: np.ndarray) -> None:
    """:func:`group_link_facts` written into ``out`` (10 values), with ``order`` and ``reps``
    (at least ``devices.size`` each) as scratch: no allocation, for loops over many groups."""
    n = devices.size
    stride = node_of.size + 1
    for i in range(n):  # insertion sort by (node, id)
        d = devices[i]
        key = node_of[d] * stride + d
        j = i
        while j > 0 and node_of[order[j - 1]] * stride + order[j - 1] > key:
            order[j] = order[j - 1]
            j -= 1
        order[j] = d
    out[0] = n
    out[1], out[2] = _ring(order, 0, n, latency, bandwidth)
    runs = 0  # runs of one node in ``order``, each run's first device in ``reps``
    per_node = 0
    for i in range(n):
        if i == 0 or node_of[order[i]] != node_of[order[i - 1]]:
            reps[runs] = i
            runs += 1
    for r in range(runs):
        size = (reps[r + 1] if r + 1 < runs else n) - reps[r]
        if r == 0:
            per_node = size
        elif size != per_node:
            per_node = 0
    out[3] = runs
    out[4] = per_node
    intra_lat, intra_bw = 0.0, np.inf
    cross = np.inf
    for r in range(runs):
        lo = reps[r]
        hi = reps[r + 1] if r + 1 < runs else n
        lat, bw = _ring(order, lo, hi, latency, bandwidth)
        intra_lat = max(intra_lat, lat)
        intra_bw = min(intra_bw, bw)
        if runs > 1:
            cross = min(cross, uplink[node_of[order[lo]]] / (hi - lo))
    out[5] = intra_lat
    out[6] = intra_bw
    for r in range(runs):
        reps[r] = order[reps[r]]
    out[7], out[8] = _ring(reps, 0, runs, latency, bandwidth)
    out[9] = cross


@compiled
def ceil_log2(n: int) -> int:
    """ceil(log2(n)), at least 1."""
    k = 0
    while (1 << k) < n:
        k += 1
    return max(1, k)


@compiled
def all_gather_seconds(n: int, ring_latency_s: float, ring_Bps: float, cross_Bps: float,
                       nbytes: float, efficiency: float) -> float:
    """All-gather whose result is ``nbytes`` per device over a group of ``n`` (reduce-scatter
    costs the same): the better of a ring (n - 1 steps) and a tree (ceil(log2 n) steps) whose
    flows leave a node together (``cross_Bps`` each)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    bw = ring_Bps * efficiency
    ring = (n - 1) * ring_latency_s + (n - 1) / n * nbytes / bw
    tree_bw = bw if ring_Bps <= cross_Bps else cross_Bps * efficiency
    tree = ceil_log2(n) * ring_latency_s + nbytes / tree_bw
    return ring if ring < tree else tree


# --- data-parallel gradient sync and the optimizer step ---------------------------------------

@compiled
def dp_link_table(grid: np.ndarray, stage_bytes: np.ndarray, latency: np.ndarray,
                  bandwidth: np.ndarray, node_of: np.ndarray, uplink: np.ndarray) -> np.ndarray:
    """Link facts (rows in :data:`LINK_FACTS` order) of each DP group of a (dp, pp, tp) device
    grid, stage-major then tp rank: the devices of one (stage, tp rank) across the replicas.
    All groups reduce at once, so a node's uplink is shared by every group whose ring leaves
    the node, each in proportion to its bytes (``stage_bytes`` per stage, any unit): the ring's
    bandwidth is at most that share, the tree's cross-node flows at most the share over the
    group's devices on the node."""
    dp, pp, tp = grid.shape
    table = np.empty((pp * tp, 10))
    load = np.zeros(uplink.size)  # bytes of all rings leaving each node
    on_node = np.zeros((pp * tp, uplink.size), dtype=np.int64)  # a group's devices per node
    order = np.empty(dp, dtype=np.int64)
    reps = np.empty(dp, dtype=np.int64)
    for j in range(pp):
        for k in range(tp):
            i = j * tp + k
            _link_facts_into(table[i], grid[:, j, k], order, reps, latency, bandwidth, node_of,
                             uplink)
            for r in range(dp):
                on_node[i, node_of[grid[r, j, k]]] += 1
            if table[i, 3] > 1:
                for n in range(uplink.size):
                    if on_node[i, n]:
                        load[n] += stage_bytes[j]
    for i in range(pp * tp):
        row = table[i]
        if row[3] > 1:
            for n in range(uplink.size):
                if on_node[i, n]:
                    share = uplink[n] * stage_bytes[i // tp] / load[n]
                    if share < row[2]:
                        row[2] = share
                    if share / on_node[i, n] < row[9]:
                        row[9] = share / on_node[i, n]
    return table


@compiled
def dp_optimizer_seconds(grid: np.ndarray, stage_params: np.ndarray, grad_bytes: float,
                         value_bytes: float, optimizer_bytes: float, hbm: np.ndarray,
                         hbm_eff: np.ndarray, link_eff: np.ndarray, latency: np.ndarray,
                         bandwidth: np.ndarray, node_of: np.ndarray,
                         uplink: np.ndarray) -> tuple[float, float]:
    """(DP gradient sync, optimizer step) seconds per optimizer step of a training task on a
    (dp, pp, tp) device grid (ZeRO-1): per DP group a reduce-scatter of the gradients
    (``grad_bytes`` per parameter) and an all-gather of the parameters (``value_bytes``), the
    slowest group; the sharded Adam step streams ``optimizer_bytes`` per parameter / dp over
    the stage's smallest HBM bandwidth (bytes/s) at the efficiency of the stage's first device,
    the slowest stage. ``stage_params``: parameters per stage (of one tp rank); efficiencies
    per device (a DP group at its first device's)."""
    dp, pp, tp = grid.shape
    opt_s = 0.0
    for j in range(pp):
        slowest = np.inf
        for r in range(dp):
            for k in range(tp):
                slowest = min(slowest, hbm[grid[r, j, k]])
        t = stage_params[j] * optimizer_bytes / dp / (slowest * hbm_eff[grid[0, j, 0]])
        opt_s = max(opt_s, t)
    dp_s = 0.0
    if dp > 1:
        table = dp_link_table(grid, stage_params, latency, bandwidth, node_of, uplink)
        for j in range(pp):
            for k in range(tp):
                g = table[j * tp + k]
                n = int(g[0])
                eff = link_eff[grid[0, j, k]]
                t = (all_gather_seconds(n, g[1], g[2], g[9], stage_params[j] * grad_bytes, eff)
                     + all_gather_seconds(n, g[1], g[2], g[9], stage_params[j] * value_bytes,
                                          eff))
                dp_s = max(dp_s, t)
    return dp_s, opt_s


# --- rollout data to an inference or training task -------------------------------------------

@compiled
def fan_in_link_facts(src: np.ndarray, dst: np.ndarray, latency: np.ndarray,
                      bandwidth: np.ndarray) -> np.ndarray:
    """Per device of ``dst`` (a column): the slowest latency (s) and the narrowest bandwidth
    (bytes/s) from the devices of ``src`` other than itself, and whether there is one (1.0 or
    0.0): one (3, destinations) array, so one array crosses back into Python."""
    out = np.empty((3, dst.size))
    out[0] = -np.inf
    out[1] = np.inf
    out[2] = 0.0
    for i in range(dst.size):
        d = dst[i]
        for s in src:
            if s != d:
                out[2, i] = 1.0
                out[0, i] = max(out[0, i], latency[s, d])
                out[1, i] = min(out[1, i], bandwidth[s, d])
    return out


@compiled
def all_reduce_seconds(n: int, ring_latency_s: float, ring_Bps: float, nodes: int,
                       per_node: int, intra_latency_s: float, intra_Bps: float,
                       inter_latency_s: float, inter_Bps: float, cross_Bps: float,
                       nbytes: float, efficiency: float) -> float:
    """All-reduce of ``nbytes`` per device over a group with these link facts
    (:data:`LINK_FACTS`): the best of a ring (2(n - 1) steps), a tree (2 ceil(log2 n) steps,
    its cross-node flows at ``cross_Bps`` each) and, when every node holds ``per_node`` of the
    devices, the hierarchical scheme (reduce-scatter in each node, all-reduce of a 1/per_node
    slice between the nodes over per_node flows sharing the uplink, all-gather in each node)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    bw = ring_Bps * efficiency
    ring = 2 * (n - 1) * ring_latency_s + 2 * (n - 1) / n * nbytes / bw
    tree_bw = bw if ring_Bps <= cross_Bps else cross_Bps * efficiency
    tree = 2 * ceil_log2(n) * ring_latency_s + 2 * nbytes / tree_bw
    best = ring if ring < tree else tree
    if nodes > 1 and per_node >= 1:
        k, m = nodes, per_node
        intra = 0.0
        if m > 1:
            ibw = intra_Bps * efficiency
            intra = 2 * ((m - 1) * intra_latency_s + (m - 1) / m * nbytes / ibw)
        slice_bytes = nbytes / m  # each local rank carries its slice on its own flow
        xbw = min(inter_Bps, cross_Bps) * efficiency  # the m flows share the node uplink
        inter = min(2 * (k - 1) * inter_latency_s + 2 * (k - 1) / k * slice_bytes / xbw,
                    2 * ceil_log2(k) * inter_latency_s + 2 * slice_bytes / xbw)
        best = min(best, intra + inter)
    return best


# --- a forward (inference) or forward + backward (training) replica -------------------------

#: Columns of a stage row of :func:`forward_replica_seconds`, then the :data:`LINK_FACTS` of
#: the stage's TP group.
FORWARD_STAGE = ("matmul_flops_per_token", "attn_flops_per_token_ctx", "flops_per_s",
                 "weight_read_s", "tp_allreduces", "link_eff")


@compiled
def forward_replica_seconds(stages: np.ndarray, sends: np.ndarray, seqs: float, m: int,
                            seq_mean: float, seq_sq_mean: float, hidden: int, value_bytes: int,
                            flops_mult: float, backward: bool, fill_all: bool,
                            tp_overlap: bool = False
                            ) -> tuple[float, float, float, float, float, float]:
    """One replica's ``m`` micro-batches of ``seqs`` sequences, pipelined over its stages.

    Per stage (a row of ``stages``: :data:`FORWARD_STAGE` then its TP links) and micro-batch:
    compute ``flops_mult`` x (tokens x matmul FLOPs + attention FLOPs x seqs x E[len^2] / 2) /
    FLOP rate or the weight reads, whichever is larger (``flops_mult``: 1 forward, 3 forward +
    backward, 4 with recomputation), plus the TP all-reduces of the activations (tokens x hidden
    x ``value_bytes``), plus the send of its activations over its outgoing boundary (``sends``
    rows: latency s, bandwidth bytes/s, link efficiency) and, with ``backward``, of the
    activation gradient back over its incoming one (a boundary is paid once in each direction,
    by the stage that sends). ``tp_overlap`` (Megatron's ``--tp-comm-overlap``): the TP
    collectives are pipelined with the GEMMs, so a stage takes max(compute or weight reads, TP)
    and only TP's excess is reported as TP. ``fill_all`` (inference): the sum of
    the stages plus (m - 1) x the slowest; else (1F1B training) (m + pp - 1) x the slowest.
    Returns (seconds, and the slowest stage's compute, HBM, TP and send seconds x m, bubble)."""
    pp = stages.shape[0]
    tokens = seqs * seq_mean
    msg = tokens * hidden * value_bytes
    n_sends = sends.shape[0]
    send = np.zeros(n_sends)
    for j in range(n_sends):
        if msg > 0:
            send[j] = sends[j, 0] + msg / (sends[j, 1] * sends[j, 2])
    slow, total_per = -np.inf, 0.0
    comp_k = mem_k = tp_k = bnd_k = 0.0
    for j in range(pp):
        st = stages[j]
        c = flops_mult * (tokens * st[0] + st[1] * seqs * seq_sq_mean / 2) / st[2]
        hb = st[3]
        comp = c if c >= hb else 0.0
        mem = hb if hb > c else 0.0
        tp = st[4] * all_reduce_seconds(int(st[6]), st[7], st[8], int(st[9]), int(st[10]),
                                        st[11], st[12], st[13], st[14], st[15], msg, st[5])
        if tp_overlap:
            tp = max(0.0, tp - comp - mem)
        out = send[j] if j < n_sends else 0.0
        back = send[j - 1] if backward and j > 0 else 0.0
        bnd = out + back
        per = comp + mem + tp + bnd
        total_per += per
        if per > slow:  # the first slowest stage
            slow = per
            comp_k, mem_k, tp_k, bnd_k = comp, mem, tp, bnd
    if fill_all:
        total = total_per + (m - 1) * slow
        bubble = total_per - slow
    else:
        total = (m + pp - 1) * slow
        bubble = (pp - 1) * slow
    return total, m * comp_k, m * mem_k, m * tp_k, m * bnd_k, bubble


# --- a task group's memory ------------------------------------------------------------------

#: Rows of :func:`group_memory_rows` (bytes per device; ``used`` and ``over`` 1.0 or 0.0).
GROUP_MEMORY_ROWS = ("need", "weights", "states", "working", "resident", "kv_budget", "used",
                     "over", "generation_kv_per_seq", "rollout_weights")


@compiled
def group_memory_rows(slots: np.ndarray, flat: np.ndarray, starts: np.ndarray,
                      copy_of: np.ndarray, n_copies: int, generation: int, usable: np.ndarray,
                      kv_pool_kept: bool, rollout_sleeps: bool) -> np.ndarray:
    """A task group's (or a whole plan's) memory per device, rows in :data:`GROUP_MEMORY_ROWS`
    order.

    Placement i's columns are ``starts[i]:starts[i + 1]`` of ``slots`` (rows: weights, trained
    states, working set, KV bytes of an average sequence, 1; bytes) and ``flat`` (their device
    ids); ``copy_of[i]`` the index of its model copy among the group's ``n_copies`` (in the
    order their weights are added). A copy's weights count once per device (the largest of its
    placements'), trained states add up, the working set is the largest; resident = weights +
    states, need = resident + working, the KV budget = ``usable`` - resident (- working when
    ``kv_pool_kept``: async mode, vLLM keeps its pool while other tasks run); ``over``: used and
    need > usable. ``generation``: the placement whose KV row is returned (-1: none).

    ``rollout_sleeps`` (sync mode, vLLM sleep level 1 or 2): the generation placement's weights
    stay on a device only while it generates. They count in ``resident`` and the KV budget as
    above (the generation phase); ``weights`` holds the other placements' copies only, and
    ``rollout_weights`` what the rollout adds to them (its shard beyond its copy's other
    placements' there); need = the larger of weights + states + working (the other tasks'
    phases) and resident (the generation phase). Without it ``rollout_weights`` is 0 and the
    rows are those above.

    The operations and their order are those of numpy over per-placement dense arrays (the
    definition in tests/cost/test_kernels.py, and the cost model's code before this kernel),
    device by device, so the bytes are equal to the last bit."""
    n_dev = usable.size
    out = np.zeros((10, n_dev))
    dense = np.empty((5, n_dev))
    by_copy = np.zeros((n_copies, n_dev))
    seen = np.zeros(n_copies, dtype=np.bool_)
    # the copies' weights without the sleeping rollout's (only when it sleeps)
    awake = np.zeros((n_copies, n_dev))
    awake_seen = np.zeros(n_copies, dtype=np.bool_)
    for i in range(starts.size - 1):
        dense[:] = 0.0
        for j in range(starts[i], starts[i + 1]):
            d = flat[j]
            for r in range(5):
                dense[r, d] = slots[r, j]
        c = copy_of[i]
        counts_awake = rollout_sleeps and i != generation
        for d in range(n_dev):
            w = dense[0, d]
            if not seen[c]:
                by_copy[c, d] = w
            else:
                by_copy[c, d] = max(by_copy[c, d], w)
            if counts_awake:
                if not awake_seen[c]:
                    awake[c, d] = w
                else:
                    awake[c, d] = max(awake[c, d], w)
            if i == 0:
                out[2, d] = dense[1, d]
                out[3, d] = dense[2, d]
                out[6, d] = 1.0 if dense[4, d] > 0 else 0.0
            else:
                out[2, d] = out[2, d] + dense[1, d]
                out[3, d] = max(out[3, d], dense[2, d])
                if dense[4, d] > 0:
                    out[6, d] = 1.0
        seen[c] = True
        if counts_awake:
            awake_seen[c] = True
        if i == generation:
            out[8] = dense[3]
    for d in range(n_dev):
        weights = 0.0
        for c in range(n_copies):
            weights = weights + by_copy[c, d]
        resident = weights + out[2, d]
        out[4, d] = resident
        kv = usable[d] - resident
        if kv_pool_kept:
            kv = kv - out[3, d]
        out[5, d] = kv
        if rollout_sleeps and generation >= 0:
            others = 0.0
            for c in range(n_copies):
                others = others + awake[c, d]
            out[1, d] = others
            out[9, d] = weights - others
            out[0, d] = max(others + out[2, d] + out[3, d], resident)
        else:
            out[0, d] = resident + out[3, d]
            out[1, d] = weights
        if out[6, d] > 0 and out[0, d] > usable[d]:
            out[7, d] = 1.0
    return out
