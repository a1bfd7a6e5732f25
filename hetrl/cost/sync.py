"""Weight sync: the new actor weights from the training devices to the generation devices.

Each generation device needs its shard (the layers of its stage, split over its TP group). For
every training stage that trains some of those layers it pulls that part from a device of that
stage with the quickest path to it (latency + bytes / bandwidth), spreading pulls over equally
quick sources; the pulls from different stages run in parallel. (With training tp > 1 a stage's
slice is taken from one device of the stage: the bytes are right, the sources per rank are
approximated.) Free when the generation and training layouts are identical on the same devices
in sync mode (the weights are shared in place); a device-local copy in async mode (generation
keeps its own copy; read and written, 2 x the shard's bytes over HBM). A device that trains in
another layout holds a different shard and fetches its generation shard from another training
device (no partial reuse), unless it trains a whole replica (tp = pp = 1): then a local copy.
Concurrent pulls share node NICs: the time is the largest of the slowest single pull, every
node's bytes in or out over its uplink (NIC, or an edge node's slow link) and every device's
bytes in or out over its GPU link (NVLink/PCIe).
"""

from __future__ import annotations

import heapq

import numpy as np

from hetrl.cost.flops import StageShape
from hetrl.cost.params import CostParams
from hetrl.plan import TaskPlacement
from hetrl.spec.cluster import ClusterSpec


def weight_sync_time(gen: TaskPlacement, gen_shapes: tuple[StageShape, ...], train: TaskPlacement,
                     cluster: ClusterSpec, params: CostParams, shared_in_place: bool) -> float:
    """Seconds to move the actor's new weights into the generation engine."""
    return _weight_sync(gen, gen_shapes, train, cluster, params, shared_in_place, False)[0]


def weight_sync_pulls(gen: TaskPlacement, gen_shapes: tuple[StageShape, ...], train: TaskPlacement,
                      cluster: ClusterSpec, params: CostParams, shared_in_place: bool
                      ) -> tuple[list[tuple[int, int, float]], list[tuple[int, float]]]:
    """The transfers a weight sync makes: (source, destination, bytes) pulls between devices and
    (device, seconds) local copies -- what the simulator replays."""
    return _weight_sync(gen, gen_shapes, train, cluster, params, shared_in_place, True)[1:]


def _device_factors(cluster: ClusterSpec, params: CostParams
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per device its link efficiency, its effective HBM bandwidth and its effective GPU link
    bandwidth (the NVLink/PCIe link every transfer in or out of it crosses; bytes/s) under
    ``params``, and the latency and bandwidth matrices side by side (memoised per cluster: pure
    functions of the devices' GPU types and the topology)."""
    def compute() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        names = [d.gpu.name for d in cluster.devices]
        link = np.array([params.efficiency(g, "link") for g in names])
        hbm = cluster.topology.hbm_Bps * np.array([params.efficiency(g, "hbm") for g in names])
        gpu_link = np.array([d.gpu.intra_link_gbps * 1e9 for d in cluster.devices]) * link
        lat_bw = np.hstack([cluster.topology.latency_s, cluster.topology.bandwidth_Bps])
        for a in (link, hbm, gpu_link, lat_bw):
            a.setflags(write=False)
        return link, hbm, gpu_link, lat_bw
    return cluster.topology.memoised("sync_device_factors", params, compute)


def _spread(near: np.ndarray, pull: np.ndarray, sizes: list[float]) -> list[int]:
    """The source each destination (column of ``near``) pulls from: among its near sources, the
    least loaded so far (bytes sent), the first in source order on ties; destinations in order."""
    n_src, n_dst = near.shape
    if (near == near[:, :1]).all():  # every destination has the same near sources: a heap
        cands = np.flatnonzero(near[:, 0]).tolist()
        if len(cands) == 1:
            return cands * n_dst
        if min(sizes) == max(sizes):  # equal sizes: the least loaded goes round in source order
            return (cands * (n_dst // len(cands) + 1))[:n_dst]
        heap = [(0.0, i) for i in cands]
        heapq.heapify(heap)
        choices = []
        for size in sizes:
            sent, i = heap[0]
            choices.append(i)
            heapq.heapreplace(heap, (sent + size, i))
        return choices
    sent = [0.0] * n_src
    near_count = near.sum(axis=0).tolist()
    cols, rows = np.nonzero(near.T)  # the near sources of each destination, in source order
    rows_list = rows.tolist()
    choices = np.argmin(pull, axis=0).tolist()
    start = 0
    for k, count in enumerate(near_count):
        if count == 1:
            choice = choices[k]
        else:
            choice = min(rows_list[start:start + count], key=sent.__getitem__)
            choices[k] = choice
        start += count
        sent[choice] += sizes[k]
    return choices


def _weight_sync(gen: TaskPlacement, gen_shapes: tuple[StageShape, ...], train: TaskPlacement,
                 cluster: ClusterSpec, params: CostParams, shared_in_place: bool,
                 transfers: bool = True
                 ) -> tuple[float, list[tuple[int, int, float]], list[tuple[int, float]]]:
    """(seconds, pulls, local copies); ``transfers`` False skips building the two lists."""
    if gen.devices == train.devices and gen.layers_per_stage == train.layers_per_stage:
        if shared_in_place:
            return 0.0, [], []
        # a device-local copy reads and writes the shard: 2 x its bytes over HBM
        local = [(d, 2 * s.weight_bytes / (cluster.topology.hbm_Bps[d] * params.efficiency(
                     cluster.devices[d].gpu.name, "hbm")))
                 for replica in gen.devices for s, stage in zip(gen_shapes, replica, strict=True)
                 for d in stage]
        return max(t for _, t in local), [], local
    topo = cluster.topology
    link_eff, hbm_eff, gpu_link, lat_bw = _device_factors(cluster, params)
    dst = gen.device_array
    n_dst = dst.size
    eff = link_eff[dst]
    n_all = lat_bw.shape[0]
    node_of = topo.node_of
    n_nodes = topo.nic_Bps.size
    stages, nbytes, need, sizes = _stage_needs(gen, gen_shapes, train)
    if not stages:
        return 0.0, [], []
    # Every training stage at once: pull[s, i, k] = seconds for destination k to pull its part
    # of stage s's layers from that stage's source i.
    grid = np.asarray(train.device_array).reshape(train.dp, train.pp, train.tp)
    src = grid[:, stages, :].transpose(1, 0, 2).reshape(len(stages), -1)  # (stage, source)
    rows = lat_bw[src]  # (stage, source, [latency to every device, bandwidth to every device])
    lat, bw = rows[:, :, dst], rows[:, :, dst + n_all]
    with np.errstate(divide="ignore", invalid="ignore"):
        pull = np.where(need[:, None, :], lat + nbytes[:, None, :] / (bw * eff), 0.0)
    # A device that trains this stage holds its layers: a local copy if it holds them whole
    # (tp = 1); with tp > 1 it holds one slice and fetches the rest from another device
    # (conservative: no partial reuse).
    if not frozenset(train.device_ids).isdisjoint(gen.device_ids):
        own = src[:, :, None] == dst
        if train.tp == 1:
            pull = np.where(own, (2 * nbytes / hbm_eff[dst])[:, None, :], pull)
        else:
            pull[own] = np.inf
    # Each destination pulls from a quickest source; among sources within 1% of the quickest,
    # the least loaded so far (pulls spread over the stage's devices).
    quickest = pull.min(axis=1)
    near = pull <= quickest[:, None, :] * 1.01
    best = np.argmin(pull, axis=1)  # (stage, destination): the source index in the stage
    worst = float(quickest.max())  # the quickest pull of each destination
    cols = np.arange(n_dst)
    for k, ties in enumerate((near.sum(axis=(1, 2)) > n_dst).tolist()):
        if ties:  # spread greedily
            best[k] = _spread(near[k], pull[k], sizes[k])
            worst = max(worst, float(pull[k, best[k], cols].max()))
    # stage-major, then destination
    sdev = src.reshape(-1)[(best + (np.arange(len(stages)) * src.shape[1])[:, None]).reshape(-1)]
    dsts = np.concatenate((dst,) * len(stages))
    flat_bytes = nbytes.reshape(-1)
    moved = (sdev != dsts) & need.reshape(-1)
    if moved.any():  # a device serving several pulls sends them one after another
        dev_out = np.bincount(sdev[moved], weights=flat_bytes[moved], minlength=n_all)
        dev_in = np.bincount(dsts[moved], weights=flat_bytes[moved], minlength=n_all)
        worst = max(worst, float((dev_out / gpu_link).max()), float((dev_in / gpu_link).max()))
        a, b = node_of[sdev], node_of[dsts]
        off = (a != b) & moved
        if off.any():
            node_out = np.bincount(a[off], weights=flat_bytes[off], minlength=n_nodes)
            node_in = np.bincount(b[off], weights=flat_bytes[off], minlength=n_nodes)
            nic = topo.uplink_Bps * float(eff.min())
            worst = max(worst, float((node_out / nic).max()), float((node_in / nic).max()))
    pulls: list[tuple[int, int, float]] = []
    local: list[tuple[int, float]] = []
    if transfers:
        flat_pull = pull[np.repeat(np.arange(len(stages)), n_dst), best.reshape(-1),
                         np.concatenate((cols,) * len(stages))]
        columns = (sdev.tolist(), dsts.tolist(), flat_bytes.tolist(), need.reshape(-1).tolist())
        for k, (s_dev, d_dev, nb, needed) in enumerate(zip(*columns, strict=True)):
            if needed:
                if s_dev != d_dev:
                    pulls.append((s_dev, d_dev, nb))
                else:
                    local.append((d_dev, float(flat_pull[k])))
    return worst, pulls, local


def _stage_needs(gen: TaskPlacement, gen_shapes: tuple[StageShape, ...], train: TaskPlacement
                 ) -> tuple[list[int], np.ndarray, np.ndarray, list[list[float]]]:
    """The training stages some generation device needs bytes from, and per such stage the
    bytes each generation device (in ``gen.device_array`` order) needs from it -- the part of
    its shard in the layers that stage trains, plus the embedding / LM head where both hold it
    -- as (stage, destination) arrays of bytes and of bytes > 0, and as lists. A pure function
    of the two layouts (no device ids): memoised."""
    key = (gen.dp, gen.tp, gen.layers_per_stage, gen_shapes, train.layers_per_stage)
    out = _NEEDS.get(key)
    if out is not None:
        return out
    tb = _bounds(train.layers_per_stage)
    gb = _bounds(gen.layers_per_stage)
    stages, rows = [], []
    for s in range(len(train.layers_per_stage)):
        per_stage = [_overlap_bytes(shape, gb[g], gb[g + 1], tb[s], tb[s + 1], s == 0,
                                    s == len(train.layers_per_stage) - 1)
                     for g, shape in enumerate(gen_shapes)]
        row = [b for b in per_stage for _ in range(gen.tp)] * gen.dp
        if any(b > 0 for b in row):
            stages.append(s)
            rows.append(row)
    nbytes = np.array(rows, dtype=float).reshape(len(rows), gen.dp * gen.tp * len(gen_shapes))
    need = nbytes > 0
    for a in (nbytes, need):
        a.setflags(write=False)
    out = (stages, nbytes, need, rows)
    if len(_NEEDS) >= 10_000:
        _NEEDS.clear()
    _NEEDS[key] = out
    return out


_NEEDS: dict = {}


def _bounds(layers: tuple[int, ...]) -> list[int]:
    """Layer boundaries of consecutive stages: [0, l_0, l_0 + l_1, ...]."""
    out = [0]
    for n in layers:
        out.append(out[-1] + n)
    return out


def _overlap_bytes(shape: StageShape, lo: int, hi: int, train_lo: int, train_hi: int,
                   train_first: bool, train_last: bool) -> float:
    """Bytes one rank of generation stage ``shape`` (layers [lo, hi)) needs from the training
    stage of layers [train_lo, train_hi) (``train_first``/``train_last``: it holds the embedding /
    the final norm and head). A training stage covering the whole shard gives exactly
    ``shape.weight_bytes``."""
    m = shape.model
    p = max(0, min(hi, train_hi) - max(lo, train_lo)) * m.params_per_layer
    if shape.first and train_first:
        p += m.vocab * m.hidden
    if shape.last and train_last:
        if shape.lm_head and not (m.tied_embeddings and shape.first):
            p += m.vocab * m.hidden
        elif not shape.lm_head:
            p += m.hidden  # scalar value head
        p += m.hidden  # final norm
    return p / shape.tp * shape.bytes_per_value
