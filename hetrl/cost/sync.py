"""Weight sync: the new actor weights from the training devices to the generation devices.

Each generation device needs its shard (the layers of its stage, split over its TP group). It
pulls from the training device with the quickest path to it (latency + bytes / bandwidth). Free when
the generation and training layouts are identical on the same devices in sync mode (the weights
are shared in place); a device-local copy when the device already trains the same shard in
async mode. Concurrent pulls share node NICs: the time is the largest of the slowest single pull
and every node's bytes in or out over its NIC.
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
    if gen.devices == train.devices and gen.layers_per_stage == train.layers_per_stage:
        if shared_in_place:
            return 0.0
        return max(
            s.weight_bytes / (cluster.topology.hbm_Bps[d] * params.efficiency(
                cluster.devices[d].gpu.name, "hbm"))
            for replica in gen.devices for s, stage in zip(gen_shapes, replica, strict=True)
            for d in stage)
    topo = cluster.topology
    src = np.array(train.device_ids)
    dst = np.array(gen.device_ids)
    shapes_of = [s for replica in gen.devices for s, stage in zip(gen_shapes, replica, strict=True)
                 for _ in stage]
    nbytes = np.array([s.weight_bytes for s in shapes_of])
    bw = topo.bandwidth_Bps[np.ix_(src, dst)]
    lat = topo.latency_s[np.ix_(src, dst)]
    eff = np.array([params.efficiency(cluster.devices[d].gpu.name, "link") for d in dst.tolist()])
    # Per destination: the source with the quickest pull (latency + bytes / bandwidth).
    with np.errstate(divide="ignore"):
        pull = lat + nbytes[None, :] / (bw * eff[None, :])
    best = np.argmin(pull, axis=0)
    cols = np.arange(dst.size)
    sdev = src[best]
    remote = sdev != dst
    if not remote.any():
        return 0.0
    worst = float(pull[best, cols][remote].max())
    a, b = topo.node_of[sdev], topo.node_of[dst]
    off = remote & (a != b)
    n_nodes = topo.nic_Bps.size
    node_out = np.bincount(a[off], weights=nbytes[off], minlength=n_nodes)
    node_in = np.bincount(b[off], weights=nbytes[off], minlength=n_nodes)
    link_eff = float(eff.min())
    nic = topo.nic_Bps * link_eff
    return max(worst, float((node_out / nic).max()), float((node_in / nic).max()))
