"""Weight sync: the new actor weights from the training devices to the generation devices.

Each generation device needs its shard (the layers of its stage, split over its TP group). It
pulls from a training device with the quickest path to it (latency + bytes / bandwidth), spreading
pulls over equally quick sources. Free when the generation and training layouts are identical on
the same devices in sync mode (the weights are shared in place); a device-local copy in async
mode (generation keeps its own copy). A device that trains in another layout holds a different
shard and fetches its generation shard from another training device (no partial reuse), unless
it trains a whole replica (tp = pp = 1): then a local copy. Concurrent pulls share node NICs: the
time is the largest of the slowest single pull and every node's bytes in or out over its uplink (NIC, or an edge node's slow link).
"""

from __future__ import annotations

import numpy as np

from hetrl.cost.flops import StageShape
from hetrl.cost.params import CostParams
from hetrl.plan import TaskPlacement
from hetrl.spec.cluster import ClusterSpec


def weight_sync_time(gen: TaskPlacement, gen_shapes: tuple[StageShape, ...], train: TaskPlacement,
                     cluster: ClusterSpec, params: CostParams, shared_in_place: bool) -> float:
    """Seconds to move the actor's new weights into the generation engine."""
    return _weight_sync(gen, gen_shapes, train, cluster, params, shared_in_place)[0]


def weight_sync_pulls(gen: TaskPlacement, gen_shapes: tuple[StageShape, ...], train: TaskPlacement,
                      cluster: ClusterSpec, params: CostParams, shared_in_place: bool
                      ) -> tuple[list[tuple[int, int, float]], list[tuple[int, float]]]:
    """The transfers a weight sync makes: (source, destination, bytes) pulls between devices and
    (device, seconds) local copies -- what the simulator replays."""
    return _weight_sync(gen, gen_shapes, train, cluster, params, shared_in_place)[1:]


def _weight_sync(gen: TaskPlacement, gen_shapes: tuple[StageShape, ...], train: TaskPlacement,
                 cluster: ClusterSpec, params: CostParams, shared_in_place: bool
                 ) -> tuple[float, list[tuple[int, int, float]], list[tuple[int, float]]]:
    if gen.devices == train.devices and gen.layers_per_stage == train.layers_per_stage:
        if shared_in_place:
            return 0.0, [], []
        local = [(d, s.weight_bytes / (cluster.topology.hbm_Bps[d] * params.efficiency(
                     cluster.devices[d].gpu.name, "hbm")))
                 for replica in gen.devices for s, stage in zip(gen_shapes, replica, strict=True)
                 for d in stage]
        return max(t for _, t in local), [], local
    topo = cluster.topology
    src = np.array(train.device_ids)
    dst = np.array(gen.device_ids)
    shapes_of = [s for replica in gen.devices for s, stage in zip(gen_shapes, replica, strict=True)
                 for _ in stage]
    nbytes = np.array([s.weight_bytes for s in shapes_of])
    eff = np.array([params.efficiency(cluster.devices[d].gpu.name, "link") for d in dst.tolist()])
    bw = topo.bandwidth_Bps[np.ix_(src, dst)]
    lat = topo.latency_s[np.ix_(src, dst)]
    with np.errstate(divide="ignore"):
        pull = lat + nbytes[None, :] / (bw * eff[None, :])
    # A device that also trains holds a shard of another layout: it fetches its generation shard
    # from another training device (conservative: no partial reuse) -- unless it trains a whole
    # replica (tp = pp = 1) and so holds every weight: then a local copy.
    own = src[:, None] == dst[None, :]
    if train.tp == 1 and train.pp == 1:
        hbm = np.array([topo.hbm_Bps[d] * params.efficiency(cluster.devices[d].gpu.name, "hbm")
                        for d in dst.tolist()])
        pull = np.where(own, (2 * nbytes / hbm)[None, :], pull)
    else:
        pull[own] = np.inf
    # Each destination pulls from a quickest source; among sources within 1% of the quickest,
    # the least loaded so far (pulls spread over the training devices).
    best = np.argmin(pull, axis=0)
    near = pull <= pull.min(axis=0) * 1.01
    near_count = near.sum(axis=0)
    if (near_count > 1).any():  # ties: spread greedily (plain lists: this loop is hot)
        sent = [0.0] * src.size
        sizes = nbytes.tolist()
        cols, rows = np.nonzero(near.T)  # the near sources of each destination, in source order
        cands: list[list[int]] = [[] for _ in range(dst.size)]
        for k, i in zip(cols.tolist(), rows.tolist(), strict=True):
            cands[k].append(i)
        choices = best.tolist()
        for k, near_k in enumerate(cands):
            choice = choices[k] if len(near_k) == 1 else min(near_k, key=sent.__getitem__)
            choices[k] = choice
            sent[choice] += sizes[k]
        best = np.array(choices)
    cols = np.arange(dst.size)
    worst = float(pull[best, cols].max())
    sdev = src[best]
    a, b = topo.node_of[sdev], topo.node_of[dst]
    off = (a != b) & (sdev != dst)
    n_nodes = topo.nic_Bps.size
    node_out = np.bincount(a[off], weights=nbytes[off], minlength=n_nodes)
    node_in = np.bincount(b[off], weights=nbytes[off], minlength=n_nodes)
    nic = topo.uplink_Bps * float(eff.min())
    pulls = [(int(sdev[k]), int(dst[k]), float(nbytes[k])) for k in range(dst.size)
             if sdev[k] != dst[k]]
    local = [(int(dst[k]), float(pull[best[k], k])) for k in range(dst.size) if sdev[k] == dst[k]]
    return max(worst, float((node_out / nic).max()), float((node_in / nic).max())), pulls, local
