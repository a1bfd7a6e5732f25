"""The compiled kernels (hetrl.cost.kernels) equal plain definitions of what they compute, bit
for bit, both compiled and run as Python (``py_func``): the weight sync's pulls, a device set's
collective link facts, the DP gradient sync and optimizer step of a training grid, the fan-in
links of rollout data, an inference or training replica's pipelined stages, and a task group's
memory per device."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetrl.cost import kernels
from hetrl.spec.presets import cluster_preset

BOTH = pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])


def _kernel_params():
    """The defaults without the framework's per-micro-batch cost: the kernel's own terms."""
    from hetrl.cost.framework import without_framework
    from hetrl.cost.params import DEFAULT_PARAMS

    return without_framework(DEFAULT_PARAMS)


def _fn(kernel, compiled: bool):
    return kernel if compiled else kernel.py_func


def _random_topology(rng, n_dev: int, n_nodes: int):
    """Latency (s) and bandwidth (bytes/s) matrices drawn from few values (so that pulls and
    rings tie), a node per device and an uplink per node."""
    node_of = np.sort(rng.integers(0, n_nodes, n_dev)).astype(np.int64)
    lat = rng.choice([1e-6, 5e-3, 5.02e-3, 2e-2], size=(n_dev, n_dev))
    bw = rng.choice([1e9, 1.005e9, 5e10, 3e11], size=(n_dev, n_dev))
    lat, bw = np.minimum(lat, lat.T), np.minimum(bw, bw.T)
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(bw, np.inf)
    uplink = rng.choice([2.5e9, 5e10], size=n_nodes)
    return lat, bw, node_of, uplink


# --- weight sync ------------------------------------------------------------------------------

def _pulls_by_definition(src, dst, nbytes, need, lat, bw, link_eff, hbm_eff, own_local,
                         gpu_link, node_of, uplink, region_of, pair_route, pair_cap):
    """Each destination in order, stage by stage: the pull times from every source of the stage
    (latency + bytes / (bandwidth x efficiency); its own device: a local copy over HBM or
    never), the least loaded source within 1% of the quickest; then the slowest of the chosen
    pulls, of every device's bytes over its GPU link, of every node's over its uplink and of
    every capped region pair's (the pairs on the route between the two regions) over its cap."""
    n_stages, n_src = src.shape
    best = np.zeros((n_stages, dst.size), dtype=np.int64)
    chosen = np.zeros((n_stages, dst.size))
    moved = []  # (source, destination, bytes) of every pull between two devices
    for s in range(n_stages):
        sent = [0.0] * n_src
        for k, d in enumerate(dst.tolist()):
            b = float(nbytes[s, k])
            pulls = []
            for a in src[s].tolist():
                if a == d:
                    pulls.append(2 * b / hbm_eff[d] if own_local else math.inf)
                elif need[s, k]:
                    pulls.append(lat[a, d] + b / (bw[a, d] * link_eff[d]))
                else:
                    pulls.append(0.0)
            near = [i for i, t in enumerate(pulls) if t <= min(pulls) * 1.01]
            i = min(near, key=lambda i: (sent[i], i))
            sent[i] += b
            best[s, k], chosen[s, k] = i, pulls[i]
            if src[s, i] != d and need[s, k]:
                moved.append((int(src[s, i]), d, b))
    worst = max(chosen.max(), _load_bound_by_definition(
        moved, link_eff[dst].min(), gpu_link, node_of, uplink, region_of, pair_route, pair_cap))
    return worst, best, chosen


def _load_bound_by_definition(moved, eff_min, gpu_link, node_of, uplink, region_of, pair_route,
                              pair_cap):
    """The slowest of every device's bytes of ``moved`` (source, destination, bytes) over its
    GPU link, every node's over its uplink x ``eff_min`` and every capped region pair's (the
    pairs on the route between the two regions) over its cap."""
    a, d, b = (np.array(x) for x in zip(*moved, strict=True)) if moved else (
        np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0))
    dev_out = np.bincount(a, weights=b, minlength=node_of.size)
    dev_in = np.bincount(d, weights=b, minlength=node_of.size)
    off = node_of[a] != node_of[d]
    node_out = np.bincount(node_of[a][off], weights=b[off], minlength=uplink.size)
    node_in = np.bincount(node_of[d][off], weights=b[off], minlength=uplink.size)
    nic = uplink * eff_min
    worst = max((dev_out / gpu_link).max(), (dev_in / gpu_link).max(),
                (node_out / nic).max(), (node_in / nic).max())
    pair_load = [0.0] * pair_cap.size
    for x, y, n in moved:
        if pair_cap.size and node_of[x] != node_of[y] and region_of[x] != region_of[y]:
            for r in pair_route[region_of[x], region_of[y]]:
                if r >= 0:
                    pair_load[r] += n
    return max([worst] + [load / cap for load, cap in zip(pair_load, pair_cap, strict=True)])


def _random_pairs(rng, node_of):
    """A region per node (two or three regions), a capped directed pair for each ordered pair
    of regions (some routes over two pairs), or none (the kernels' empty arrays)."""
    if rng.integers(0, 3) == 0:
        return (np.zeros(0, dtype=np.int64), np.full((0, 0, 1), -1, dtype=np.int64),
                np.zeros(0))
    n_regions = int(rng.integers(2, 4))
    region_of = (node_of % n_regions).astype(np.int64)
    ids = {(a, b): k for k, (a, b) in enumerate(
        (a, b) for a in range(n_regions) for b in range(n_regions) if a != b)}
    route = np.full((n_regions, n_regions, 2), -1, dtype=np.int64)
    for (a, b), k in ids.items():
        route[a, b, 0] = k
        if rng.integers(0, 2) and (a, (a + b) % n_regions) in ids:  # a second hop, some routes
            route[a, b, 1] = ids[(a, (a + b) % n_regions)]
    return region_of, route, rng.choice([1e8, 1e9, 1e11], size=len(ids))


@BOTH
def test_weight_sync_pulls_equal_their_definition(compiled):
    rng = np.random.default_rng(21)
    fn = _fn(kernels.weight_sync_pulls, compiled)
    for _ in range(60):
        n_dev = int(rng.integers(2, 24))
        lat, bw, node_of, uplink = _random_topology(rng, n_dev, int(rng.integers(1, 5)))
        n_stages, n_src = int(rng.integers(1, 4)), int(rng.integers(1, 6))
        src = rng.integers(0, n_dev, (n_stages, n_src)).astype(np.int64)
        dst = rng.permutation(n_dev)[:int(rng.integers(1, n_dev + 1))].astype(np.int64)
        nbytes = rng.choice([0.0, 1e8, 2e8, 7e8], size=(n_stages, dst.size))
        need = nbytes > 0
        link_eff = rng.choice([0.7, 0.8], n_dev)
        hbm_eff = rng.choice([1e12, 2e12], n_dev)
        gpu_link = rng.choice([6.4e10, 3e11], n_dev)
        own_local = bool(rng.integers(0, 2))
        args = (src, dst, nbytes, need, lat, bw, link_eff, hbm_eff, own_local, gpu_link,
                node_of, uplink, *_random_pairs(rng, node_of))
        worst, best, chosen = fn(*args)
        want = _pulls_by_definition(*args)
        assert worst == want[0]
        assert _fn(kernels.weight_sync_seconds, compiled)(*args) == want[0]
        assert np.array_equal(best, want[1]) and np.array_equal(chosen, want[2])


def _transfers_by_definition(src, dst, nbytes, lat, bw, link_eff, gpu_link, node_of, uplink,
                             region_of, pair_route, pair_cap):
    """Concurrent flows: the slowest flow (latency + bytes / (bandwidth x the destination's
    efficiency)), every device's bytes over its GPU link, every node's over its uplink x the
    smallest destination efficiency, every capped pair's over its cap."""
    moved = [(int(a), int(d), float(b)) for a, d, b in zip(src, dst, nbytes, strict=True)
             if a != d and b > 0]
    if not moved:
        return 0.0
    times = [lat[x, y] + n / (bw[x, y] * link_eff[y]) for x, y, n in moved]
    return max(max(times), _load_bound_by_definition(
        moved, link_eff[dst].min(), gpu_link, node_of, uplink, region_of, pair_route, pair_cap))


@BOTH
def test_transfers_seconds_equal_their_definition(compiled):
    """The relay's fan-out (and any list of concurrent flows) is priced as the pulls are."""
    rng = np.random.default_rng(22)
    fn = _fn(kernels.transfers_seconds, compiled)
    for _ in range(60):
        n_dev = int(rng.integers(2, 24))
        lat, bw, node_of, uplink = _random_topology(rng, n_dev, int(rng.integers(1, 5)))
        n = int(rng.integers(1, 12))
        src = rng.integers(0, n_dev, n).astype(np.int64)
        dst = rng.integers(0, n_dev, n).astype(np.int64)
        nbytes = rng.choice([0.0, 1e8, 7e8], size=n)
        link_eff = rng.choice([0.7, 0.8], n_dev)
        gpu_link = rng.choice([6.4e10, 3e11], n_dev)
        args = (src, dst, nbytes, lat, bw, link_eff, gpu_link, node_of, uplink,
                *_random_pairs(rng, node_of))
        assert fn(*args) == _transfers_by_definition(*args)


# --- collective link facts --------------------------------------------------------------------

def _ring(lat, bw, order):
    if len(order) < 2:
        return 0.0, math.inf
    pairs = list(zip(order, order[1:] + order[:1], strict=True))
    return max(lat[a, b] for a, b in pairs), min(bw[a, b] for a, b in pairs)


def _links_by_definition(devices, lat, bw, node_of, uplink):
    """The ring through the devices ordered by (node, id), each node's ring, the ring through
    each node's first device, and the smallest uplink share per device on a node."""
    order = sorted(devices, key=lambda d: (node_of[d], d))
    by_node: dict[int, list[int]] = {}
    for d in order:
        by_node.setdefault(int(node_of[d]), []).append(d)
    sizes = {len(v) for v in by_node.values()}
    intra = [_ring(lat, bw, m) for m in by_node.values()]
    cross = (min(uplink[k] / len(m) for k, m in by_node.items()) if len(by_node) > 1
             else math.inf)
    return [len(devices), *_ring(lat, bw, order), len(by_node),
            sizes.pop() if len(sizes) == 1 else 0, max(a for a, _ in intra),
            min(b for _, b in intra), *_ring(lat, bw, [m[0] for m in by_node.values()]), cross]


@BOTH
def test_group_link_facts_equal_their_definition(compiled):
    rng = np.random.default_rng(23)
    fn = _fn(kernels.group_link_facts, compiled)
    paper64 = cluster_preset("paper64-multi-continent").topology
    for i in range(200):
        if i % 2:
            t = paper64
            lat, bw, node_of, uplink = t.latency_s, t.bandwidth_Bps, t.node_of, t.uplink_Bps
        else:
            lat, bw, node_of, uplink = _random_topology(rng, 16, int(rng.integers(1, 6)))
        devices = rng.permutation(node_of.size)[:int(rng.integers(1, 17))].astype(np.int64)
        got = fn(devices, lat, bw, node_of, uplink).tolist()
        assert got == _links_by_definition(devices.tolist(), lat, bw, node_of, uplink)


# --- DP gradient sync and optimizer step --------------------------------------------------------

def _dp_optimizer_by_definition(grid, stage_params, grad_bytes, value_bytes, optimizer_bytes,
                                hbm, hbm_eff, link_eff, lat, bw, node_of, uplink):
    """Per stage the optimizer's bytes / dp over its slowest HBM; per DP group (stage j, tp rank
    k) a reduce-scatter and an all-gather on its links, the uplink of each node its ring leaves
    shared among all such rings in proportion to their bytes."""
    dp, pp, tp = grid.shape
    opt_s = max(stage_params[j] * optimizer_bytes / dp
                / (min(hbm[d] for d in grid[:, j, :].ravel()) * hbm_eff[grid[0, j, 0]])
                for j in range(pp))
    if dp == 1:
        return 0.0, opt_s
    groups = [(j, k, grid[:, j, k].tolist()) for j in range(pp) for k in range(tp)]
    links = {(j, k): _links_by_definition(m, lat, bw, node_of, uplink) for j, k, m in groups}
    load: dict[int, float] = {}
    for j, k, members in groups:
        if links[j, k][3] > 1:
            for n in dict.fromkeys(int(node_of[d]) for d in members):
                load[n] = load.get(n, 0.0) + stage_params[j]
    dp_s = 0.0
    for j, k, members in groups:
        n, ring_lat, ring_bw, nodes, *_, cross = links[j, k]
        if nodes > 1:
            for node in dict.fromkeys(int(node_of[d]) for d in members):
                share = uplink[node] * stage_params[j] / load[node]
                count = sum(int(node_of[d]) == node for d in members)
                ring_bw, cross = min(ring_bw, share), min(cross, share / count)
        eff = link_eff[members[0]]
        t = sum(kernels.all_gather_seconds.py_func(n, ring_lat, ring_bw, cross,
                                                   stage_params[j] * b, eff)
                for b in (grad_bytes, value_bytes))
        dp_s = max(dp_s, t)
    return dp_s, opt_s


@BOTH
def test_dp_optimizer_seconds_equal_their_definition(compiled):
    rng = np.random.default_rng(25)
    fn = _fn(kernels.dp_optimizer_seconds, compiled)
    for _ in range(80):
        n_dev = 27
        lat, bw, node_of, uplink = _random_topology(rng, n_dev, int(rng.integers(1, 6)))
        dp, pp, tp = (int(x) for x in rng.choice([1, 2, 3], 3))
        grid = rng.permutation(n_dev)[:dp * pp * tp].reshape(dp, pp, tp).astype(np.int64)
        stage_params = rng.choice([1e8, 3e8, 4.4e9], pp)
        hbm, hbm_eff = rng.choice([8e11, 2e12], n_dev), rng.choice([0.8, 0.9], n_dev)
        link_eff = rng.choice([0.7, 0.8], n_dev)
        args = (grid, stage_params, 4.0, 2.0, 16.0, hbm, hbm_eff, link_eff, lat, bw, node_of,
                uplink)
        assert fn(*args) == _dp_optimizer_by_definition(*args)


def test_all_gather_takes_the_better_of_ring_and_tree():
    # 8 devices, 1 ms per step, 1e9 B/s rings, 1e8 B/s per flow across nodes, 1 GB, eff 0.5:
    # ring 7 x 1e-3 + 7/8 x 1e9 / 5e8 = 1.757 s; tree 3 x 1e-3 + 1e9 / 5e7 = 20.003 s
    assert kernels.all_gather_seconds(8, 1e-3, 1e9, 1e8, 1e9, 0.5) == pytest.approx(1.757)
    # with an equally fast cross-node flow a 1 KB message goes by the tree (fewer latency
    # steps): ring 7e-3 + 1.75e-6 s, tree 3e-3 + 2e-6 s
    assert kernels.all_gather_seconds(8, 1e-3, 1e9, 1e9, 1e3, 0.5) == pytest.approx(3.002e-3)
    assert kernels.all_gather_seconds(1, 1e-3, 1e9, 1e9, 1e9, 0.5) == 0.0
    assert [kernels.ceil_log2(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 1, 2, 2, 3, 3, 4]


# --- rollout data -----------------------------------------------------------------------------

@BOTH
def test_fan_in_link_facts_equal_their_definition(compiled):
    """Into each destination: the slowest latency and the narrowest bandwidth from the sources
    other than itself (none: not found)."""
    rng = np.random.default_rng(27)
    fn = _fn(kernels.fan_in_link_facts, compiled)
    for _ in range(100):
        lat, bw, _, _ = _random_topology(rng, 12, 3)
        src = rng.permutation(12)[:int(rng.integers(1, 6))].astype(np.int64)
        dst = rng.permutation(12)[:int(rng.integers(1, 4))].astype(np.int64)
        got_lat, got_bw, found = fn(src, dst, lat, bw)
        assert set(found.tolist()) <= {0.0, 1.0}
        for i, d in enumerate(dst.tolist()):
            others = [s for s in src.tolist() if s != d]
            assert bool(found[i]) == bool(others)
            if others:
                assert got_lat[i] == max(lat[s, d] for s in others)
                assert got_bw[i] == min(bw[s, d] for s in others)


# --- a forward / training replica ---------------------------------------------------------------

def _forward_by_definition(consts, n, mbs, L, mult, training):
    """Per stage and micro-batch: max(compute, weight reads) + TP all-reduces + its sends (and
    with backward the gradient back); inference fills the pipeline (sum + (m - 1) x slowest),
    1F1B training takes (m + pp - 1) x the slowest stage."""
    from hetrl.cost.primitives import all_reduce_time, p2p_time

    stages, bounds, h, bpv = consts
    m = max(1, math.ceil(n / mbs - 1e-9))
    seqs = n / m
    tokens = seqs * L.seq_mean
    msg = tokens * h * bpv
    sends = [p2p_time(msg, lat, bw, eff) for lat, bw, eff in bounds]
    per, parts = [], []
    for j, (mfpt, afpc, rate, hb, tpl, g, link_eff) in enumerate(stages):
        c = mult * (tokens * mfpt + afpc * seqs * L.seq_sq_mean / 2) / rate
        comp, mem = (c if c >= hb else 0.0), (hb if hb > c else 0.0)
        tp = tpl * all_reduce_time(msg, g, link_eff)
        bnd = (sends[j] if j < len(sends) else 0.0) + (
            sends[j - 1] if training and j > 0 else 0.0)
        per.append(comp + mem + tp + bnd)
        parts.append((comp, mem, tp, bnd))
    slow = max(per)
    k = per.index(slow)
    pp = len(per)
    if training:
        total, bubble = (m + pp - 1) * slow, (pp - 1) * slow
    else:
        total, bubble = sum(per) + (m - 1) * slow, sum(per) - slow
    return (total, *(m * x for x in parts[k]), bubble)


@pytest.mark.parametrize("kind", ["inference", "training"])
def test_forward_replica_equals_its_definition(kind):
    from hetrl.cost.flops import stage_shapes
    from hetrl.cost.lengths import length_stats
    from hetrl.cost.replica import replica_hw
    from hetrl.cost.tasks import _stage_consts, forward_engine
    from hetrl.spec.presets import workload_preset

    wl = workload_preset("qwen3-8b-ppo-sync")
    L = length_stats(wl)
    cluster = cluster_preset("paper64-multi-continent")
    rng = np.random.default_rng(29)
    for _ in range(40):
        tp, pp = int(rng.choice([1, 2, 4])), int(rng.choice([1, 2, 3]))
        devs = [int(d) for d in rng.permutation(cluster.num_devices)[:tp * pp]]
        replica = tuple(tuple(devs[j * tp:(j + 1) * tp]) for j in range(pp))
        layers = [36 // pp] * pp
        layers[-1] += 36 - sum(layers)
        shapes = stage_shapes(wl.model("actor"), tuple(layers), tp, True, wl.bytes_per_value)
        hw = replica_hw(cluster, replica)
        recompute = bool(rng.integers(0, 2))
        KERNEL_PARAMS = _kernel_params()
        engine = forward_engine(kind, shapes, hw, L, KERNEL_PARAMS, 4, recompute)
        training = kind == "training"
        mult, allreduces = ((4.0, 6) if recompute else (3.0, 4)) if training else (1.0, 2)
        consts = _stage_consts(shapes, hw, L, KERNEL_PARAMS,
                               "train_flops" if training else "infer_flops", mult, allreduces)
        for n in rng.uniform(0.5, 500.0, 5).tolist():
            got = engine.replica(n)
            total, compute, hbm, tp_s, pp_s, bubble = _forward_by_definition(
                consts, n, 4, L, mult, training)
            assert got.seconds == total
            assert (got.parts["compute"], got.parts["hbm"], got.parts["tp"], got.parts["pp"],
                    got.parts["bubble"]) == (compute, hbm, tp_s, pp_s, bubble)


# --- a task group's memory --------------------------------------------------------------------

def _group_memory_by_definition(placements, n_copies, generation, usable, kv_pool_kept,
                                rollout_sleeps):
    """The numpy definition over dense per-placement arrays (``placements``: (5 x k rows, device
    ids, copy index)): a copy's weights the largest of its placements', states summed, working
    sets the largest, devices used where any placement has a tasklet; resident = the copies'
    weights (added in copy order) + states. A sleeping rollout (``rollout_sleeps`` and a
    generation placement): the other phases hold the copies without the rollout's weights."""
    by_copy: dict[int, np.ndarray] = {}
    awake: dict[int, np.ndarray] = {}
    states = working = used = kv = None
    for i, (rows, flat, copy) in enumerate(placements):
        dense = np.zeros((5, usable.size))
        dense[:, flat] = rows
        prev = by_copy.get(copy)
        by_copy[copy] = dense[0] if prev is None else np.maximum(prev, dense[0])
        if i != generation:
            prev = awake.get(copy)
            awake[copy] = dense[0] if prev is None else np.maximum(prev, dense[0])
        if states is None:
            states, working, used = dense[1], dense[2], dense[4] > 0
        else:
            states, working, used = (states + dense[1], np.maximum(working, dense[2]),
                                     used | (dense[4] > 0))
        if i == generation:
            kv = dense[3]
    weights = sum(by_copy[c] for c in range(n_copies))
    resident = weights + states
    need = resident + working
    kv_budget = usable - resident
    if kv_pool_kept:
        kv_budget = kv_budget - working
    rollout = np.zeros(usable.size)
    if rollout_sleeps and generation >= 0:
        others = sum(awake.get(c, np.zeros(usable.size)) for c in range(n_copies))
        rollout = weights - others
        need = np.maximum(others + states + working, resident)
        weights = others
    over = used & (need > usable)
    return np.array([need, weights, states, working, resident, kv_budget, used, over,
                     np.zeros(usable.size) if kv is None else kv, rollout])


@BOTH
def test_group_memory_rows_equal_their_definition(compiled):
    fn = _fn(kernels.group_memory_rows, compiled)
    rng = np.random.default_rng(11)
    checked_over = checked_sleep = 0
    for trial in range(150):
        n_dev = int(rng.integers(2, 24))
        n_copies = int(rng.integers(1, 4))
        placements = []
        for i in range(int(rng.integers(1, 5))):
            k = int(rng.integers(1, n_dev + 1))
            flat = rng.choice(n_dev, size=k, replace=trial % 10 == 0)  # (repeats: last wins)
            rows = np.vstack([rng.uniform(0, 4e10, (4, k)), np.ones((1, k))])
            copy = i % n_copies if i < n_copies else int(rng.integers(0, n_copies))
            placements.append((rows, flat.astype(np.int64), copy))
        n_copies = max(c for _, _, c in placements) + 1
        generation = int(rng.integers(-1, len(placements)))
        usable = rng.uniform(2e10, 8e10, n_dev)
        kept = bool(trial % 2)
        sleeps = not kept and trial % 4 == 0
        want = _group_memory_by_definition(placements, n_copies, generation, usable, kept,
                                           sleeps)
        starts = np.cumsum([0] + [rows.shape[1] for rows, _, _ in placements])
        got = fn(np.concatenate([r for r, _, _ in placements], axis=1),
                 np.concatenate([f for _, f, _ in placements]), starts,
                 np.array([c for _, _, c in placements]), n_copies, generation, usable, kept,
                 sleeps)
        assert got.shape == want.shape
        assert np.array_equal(got, want.astype(float)), trial
        checked_over += int(want[7].any())
        checked_sleep += int(sleeps and generation >= 0 and want[9].any())
    assert checked_over > 10  # some groups do not fit: the over row is exercised
    assert checked_sleep > 10  # and some sleeping rollouts add weights of their own
