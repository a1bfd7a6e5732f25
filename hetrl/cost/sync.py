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
node's bytes in or out over its uplink (NIC, or an edge node's slow link), every device's
bytes in or out over its GPU link (NVLink/PCIe) and every capped region pair's bytes (each
direction) over its aggregate (``RegionLink.aggregate_gbps`` x link efficiency).

With the relay (``Plan.sync_relay``), in each region that holds generation but no actor-training
GPU, the generation GPUs of one shard (one (stage, tp rank) of the generation layout; one per
replica there) each pull 1/m of it (m of them), so one copy crosses into the region, spread over
their NICs; then they pass the slices round a ring inside the region (each ring edge carries
(m - 1)/m of the shard: a ring all-gather). The relay's time is the pulls' (as above) plus the
fan-out's, priced the same way (:func:`hetrl.cost.kernels.transfers_seconds`), and the
simulator replays the two lists in that order.
"""

from __future__ import annotations

import numpy as np

from hetrl.cost.flops import StageShape
from hetrl.cost.kernels import transfers_seconds as _fan_out_kernel
from hetrl.cost.kernels import weight_sync_pulls as _pulls_kernel
from hetrl.cost.kernels import weight_sync_seconds as _seconds_kernel
from hetrl.cost.memo import SYNC_NEEDS, topology_memoised
from hetrl.cost.params import CostParams
from hetrl.cost.primitives import device_efficiency
from hetrl.plan import TaskPlacement
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec

Transfer = tuple[int, int, float]  # (source device, destination device, bytes)


def weights_shared_in_place(workload: WorkloadSpec, train: TaskPlacement) -> bool:
    """Whether the trainer's weights serve the rollout in place where the two layouts are the
    same on the same devices: in sync mode, from a Megatron trainer (an FSDP trainer's shards
    are gathered first), into a BF16 rollout (an FP8 one holds its own quantised copy)."""
    return workload.mode == "sync" and train.backend != "fsdp" and not workload.gen_fp8


def weight_sync_time(gen: TaskPlacement, gen_shapes: tuple[StageShape, ...], train: TaskPlacement,
                     cluster: ClusterSpec, params: CostParams, shared_in_place: bool,
                     relay: bool = False) -> float:
    """Seconds to move the actor's new weights into the generation engine (``relay``: one copy
    per remote region, then a local fan-out; see the module)."""
    return _weight_sync(gen, gen_shapes, train, cluster, params, shared_in_place, False,
                        relay)[0]


def weight_sync_pulls(gen: TaskPlacement, gen_shapes: tuple[StageShape, ...], train: TaskPlacement,
                      cluster: ClusterSpec, params: CostParams, shared_in_place: bool
                      ) -> tuple[list[Transfer], list[tuple[int, float]]]:
    """The transfers a weight sync without relay makes: (source, destination, bytes) pulls
    between devices and (device, seconds) local copies."""
    _, pulls, _, local = _weight_sync(gen, gen_shapes, train, cluster, params, shared_in_place,
                                      True, False)
    return pulls, local


def weight_sync_transfers(gen: TaskPlacement, gen_shapes: tuple[StageShape, ...],
                          train: TaskPlacement, cluster: ClusterSpec, params: CostParams,
                          shared_in_place: bool, relay: bool = False
                          ) -> tuple[list[Transfer], list[Transfer], list[tuple[int, float]]]:
    """The transfers a weight sync makes, what the simulator replays: the pulls (source,
    destination, bytes) and the local copies (device, seconds), all at once, then -- with
    ``relay`` -- the local fan-out (source, destination, bytes) once every pull has ended."""
    _, pulls, fan_out, local = _weight_sync(gen, gen_shapes, train, cluster, params,
                                            shared_in_place, True, relay)
    return pulls, fan_out, local


def pair_factors(cluster: ClusterSpec, params: CostParams
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per device its region index, the capped region pairs on each route and their effective
    aggregates (bytes/s: the cap x the smallest link efficiency of the two regions' devices,
    as the simulator's resource; see :func:`pair_capacities`), for the kernels."""
    def compute() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        topo = cluster.topology
        caps = pair_capacities(cluster, params)
        caps.setflags(write=False)
        return topo.region_of, topo.pair_route, caps
    return topology_memoised(cluster, "sync_pair_factors", params, compute)


def pair_capacities(cluster: ClusterSpec, params: CostParams) -> np.ndarray:
    """Per directed capped region pair (:attr:`Topology.pair_cap_Bps`) its effective aggregate,
    bytes/s: the cap x the smallest link efficiency among the devices of its two regions (the
    simulator's resource and the cost model's term alike)."""
    topo = cluster.topology
    if not topo.has_aggregate:
        return np.zeros(0)
    link = device_efficiency(cluster, params, "link")
    per_region = [min((float(e) for e, r in zip(link, topo.region_of, strict=True) if r == i),
                      default=1.0) for i in range(len(cluster.regions))]
    return np.array([cap * min(per_region[a], per_region[b])
                     for cap, (a, b) in zip(topo.pair_cap_Bps, topo.pair_regions, strict=True)])


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
                 transfers: bool = True, relay: bool = False
                 ) -> tuple[float, list[Transfer], list[Transfer], list[tuple[int, float]]]:
    """(seconds, pulls, fan-out, local copies); ``transfers`` False skips building the lists."""
    if gen.devices == train.devices and gen.layers_per_stage == train.layers_per_stage \
            and gen.ep == train.ep:
        if shared_in_place:
            return 0.0, [], [], []
        # a device-local copy reads and writes the shard: 2 x its bytes over HBM
        local = [(d, 2 * s.weight_bytes / (cluster.topology.hbm_Bps[d] * params.efficiency(
                     cluster.devices[d].gpu.name, "hbm")))
                 for replica in gen.devices for s, stage in zip(gen_shapes, replica, strict=True)
                 for d in stage]
        return max(t for _, t in local), [], [], local
    topo = cluster.topology
    link_eff, hbm_eff, gpu_link = _device_factors(cluster, params)
    dst = gen.device_array
    stages, nbytes, need = _stage_needs(gen, gen_shapes, train)
    if not stages:
        return 0.0, [], [], []
    fan: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    if relay:
        scale, fan = _relay(gen, train, cluster, nbytes)
        if fan is not None:
            nbytes = nbytes * scale  # each member of a shard's ring pulls its slice
    grid = np.asarray(train.device_array).reshape(train.dp, train.pp, train.tp)
    src = np.ascontiguousarray(grid[:, stages, :].transpose(1, 0, 2).reshape(len(stages), -1))
    # A device that trains a stage holds its layers: a local copy if it holds them whole
    # (tp = 1); with tp > 1 it holds one slice and fetches the rest from another device
    # (conservative: no partial reuse). Pulls spread over a stage's equally quick devices.
    pairs = pair_factors(cluster, params) if topo.has_aggregate else _NO_PAIRS
    args = (src, dst, nbytes, need, topo.latency_s, topo.bandwidth_Bps, link_eff, hbm_eff,
            train.tp == 1, gpu_link, topo.node_of, topo.uplink_Bps, *pairs)
    fan_s = 0.0
    if fan is not None:
        fan_s = _fan_out_kernel(*fan, topo.latency_s, topo.bandwidth_Bps, link_eff, gpu_link,
                                topo.node_of, topo.uplink_Bps, *pairs)
    if not transfers:
        return _seconds_kernel(*args) + fan_s, [], [], []
    worst, best, chosen = _pulls_kernel(*args)
    pulls: list[Transfer] = []
    local: list[tuple[int, float]] = []
    for s, row in enumerate(best.tolist()):  # stage-major, then destination
        for k, i in enumerate(row):
            if need[s, k]:
                s_dev, d_dev = int(src[s, i]), int(dst[k])
                if s_dev != d_dev:
                    pulls.append((s_dev, d_dev, float(nbytes[s, k])))
                else:
                    local.append((d_dev, float(chosen[s, k])))
    fan_out = [] if fan is None else [(int(a), int(b), float(n)) for a, b, n in zip(
        *(x.tolist() for x in fan), strict=True)]
    return worst + fan_s, pulls, fan_out, local


#: The kernels' region-pair arguments when no pair has a cap (not read).
_NO_PAIRS = (np.zeros(0, dtype=np.int64), np.full((0, 0, 1), -1, dtype=np.int64), np.zeros(0))


def _relay(gen: TaskPlacement, train: TaskPlacement, cluster: ClusterSpec, nbytes: np.ndarray
           ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray] | None]:
    """The relay of a weight sync (see the module): per generation device (``gen.device_array``
    order) the share of its shard it pulls (1 / m, m the devices of its shard in its region,
    for regions without an actor-training device; else 1), and the fan-out as (sources,
    destinations, bytes) arrays: per such shard and region with m >= 2 a ring over its devices
    in (node, id) order, each edge carrying (m - 1) / m of the shard. None for the fan-out when
    no region holds a shard twice (the relay is then the plain pulls)."""
    topo = cluster.topology
    region, node = topo.region_of, topo.node_of
    home = {int(region[d]) for d in train.device_ids}
    per_replica = gen.pp * gen.tp
    rings: dict[tuple[int, int], list[int]] = {}
    for k, d in enumerate(gen.device_ids):
        r = int(region[d])
        if r not in home:  # k % per_replica: the shard's (stage, tp rank) in its replica
            rings.setdefault((r, k % per_replica), []).append(k)
    scale = np.ones(len(gen.device_ids))
    src, dst, moved = [], [], []
    shard = nbytes.sum(axis=0)  # bytes of each destination's whole shard
    for ks in rings.values():
        m = len(ks)
        if m < 2:
            continue
        scale[ks] = 1.0 / m
        ring = sorted((gen.device_ids[k] for k in ks), key=lambda d: (int(node[d]), d))
        per_edge = float(shard[ks[0]]) * (m - 1) / m
        for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
            src.append(a)
            dst.append(b)
            moved.append(per_edge)
    if not src:
        return scale, None
    return scale, (np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64),
                   np.array(moved))


def _stage_needs(gen: TaskPlacement, gen_shapes: tuple[StageShape, ...], train: TaskPlacement
                 ) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The training stages some generation device needs bytes from, and per such stage the
    bytes each generation device (in ``gen.device_array`` order) needs from it -- the part of
    its shard in the layers that stage trains, plus the embedding / LM head where both hold it
    -- as (stage, destination) arrays of bytes and of bytes > 0. A pure function of the two
    layouts (no device ids): memoised."""
    key = (gen.dp, gen.tp, gen.layers_per_stage, gen_shapes, train.layers_per_stage)
    out = SYNC_NEEDS.get(key)  # (gen_shapes hold gen's ep)
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
    if m.moe is None:
        per_layer = m.params_per_layer
    else:  # the layers' mean, with only the rank's 1 / ep of the routed experts
        per_layer = (m.layer_params_total - m.expert_params * (1 - 1 / shape.ep)) / m.layers
    p = max(0, min(hi, train_hi) - max(lo, train_lo)) * per_layer
    if shape.first and train_first:
        p += m.vocab * m.hidden
    if shape.last and train_last:
        if shape.lm_head and not (m.tied_embeddings and shape.first):
            p += m.vocab * m.hidden
        elif not shape.lm_head:
            p += m.hidden  # scalar value head
        p += m.hidden  # final norm
    return p / shape.tp * shape.bytes_per_value
