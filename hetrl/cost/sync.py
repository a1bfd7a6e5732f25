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

import numpy as np

from hetrl.cost.flops import StageShape
from hetrl.cost.kernels import weight_sync_pulls as _pulls_kernel
from hetrl.cost.kernels import weight_sync_seconds as _seconds_kernel
from hetrl.cost.memo import SYNC_NEEDS, topology_memoised
from hetrl.cost.params import CostParams
from hetrl.cost.primitives import device_efficiency
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
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per device its link efficiency, its effective HBM bandwidth and its effective GPU link
    bandwidth (the NVLink/PCIe link every transfer in or out of it crosses; bytes/s) under
    ``params`` (memoised per cluster: pure functions of the devices' GPU types)."""
    def compute() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        link = device_efficiency(cluster, params, "link")
        hbm = cluster.topology.hbm_Bps * device_efficiency(cluster, params, "hbm")
        gpu_link = np.array([d.gpu.intra_link_gbps * 1e9 for d in cluster.devices]) * link
        for a in (hbm, gpu_link):
            a.setflags(write=False)
        return link, hbm, gpu_link
    return topology_memoised(cluster, "sync_device_factors", params, compute)


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
    link_eff, hbm_eff, gpu_link = _device_factors(cluster, params)
    dst = gen.device_array
    stages, nbytes, need = _stage_needs(gen, gen_shapes, train)
    if not stages:
        return 0.0, [], []
    grid = np.asarray(train.device_array).reshape(train.dp, train.pp, train.tp)
    src = np.ascontiguousarray(grid[:, stages, :].transpose(1, 0, 2).reshape(len(stages), -1))
    # A device that trains a stage holds its layers: a local copy if it holds them whole
    # (tp = 1); with tp > 1 it holds one slice and fetches the rest from another device
    # (conservative: no partial reuse). Pulls spread over a stage's equally quick devices.
    args = (src, dst, nbytes, need, topo.latency_s, topo.bandwidth_Bps, link_eff, hbm_eff,
            train.tp == 1, gpu_link, topo.node_of, topo.uplink_Bps)
    if not transfers:
        return _seconds_kernel(*args), [], []
    worst, best, chosen = _pulls_kernel(*args)
    pulls: list[tuple[int, int, float]] = []
    local: list[tuple[int, float]] = []
    for s, row in enumerate(best.tolist()):  # stage-major, then destination
        for k, i in enumerate(row):
            if need[s, k]:
                s_dev, d_dev = int(src[s, i]), int(dst[k])
                if s_dev != d_dev:
                    pulls.append((s_dev, d_dev, float(nbytes[s, k])))
                else:
                    local.append((d_dev, float(chosen[s, k])))
    return worst, pulls, local


def _stage_needs(gen: TaskPlacement, gen_shapes: tuple[StageShape, ...], train: TaskPlacement
                 ) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The training stages some generation device needs bytes from, and per such stage the
    bytes each generation device (in ``gen.device_array`` order) needs from it -- the part of
    its shard in the layers that stage trains, plus the embedding / LM head where both hold it
    -- as (stage, destination) arrays of bytes and of bytes > 0. A pure function of the two
    layouts (no device ids): memoised."""
    key = (gen.dp, gen.tp, gen.layers_per_stage, gen_shapes, train.layers_per_stage)
    out = SYNC_NEEDS.get(key)
    if out is not None:
        return out
    tb, gb = train.layer_bounds, gen.layer_bounds
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
    return SYNC_NEEDS.put(key, (stages, nbytes, need))


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
