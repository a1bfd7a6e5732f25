"""Summaries of clusters and workloads, as plain dicts (for ``--json``) and as text."""

from __future__ import annotations

from typing import Any

import numpy as np

from hetrl.fingerprint import cluster_fingerprint, workload_fingerprint
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec


def describe_cluster(cluster: ClusterSpec) -> dict[str, Any]:
    """GPUs by type and region, aggregate peak TFLOPS and memory, latency/bandwidth ranges.

    ``one_way_latency_s`` and ``bandwidth_gbps`` are {min, max} over pairs of devices in
    different nodes (null for a one-node cluster); bandwidth in Gbit/s.
    """
    topo = cluster.topology
    off = topo.node_of[:, None] != topo.node_of[None, :]
    if off.any():
        lat = {"min": float(topo.latency_s[off].min()), "max": float(topo.latency_s[off].max())}
        bw = topo.bandwidth_Bps[off] * 8 / 1e9
        bandwidth = {"min": float(bw.min()), "max": float(bw.max())}
    else:
        lat = bandwidth = None
    by_region: dict[str, dict[str, int]] = {}
    for d in cluster.devices:
        region = by_region.setdefault(d.region, {})
        region[d.gpu.name] = region.get(d.gpu.name, 0) + 1
    first = 0
    nodes = []  # the names fault files and errors use, with each node's device ids
    for n in cluster.nodes:
        nodes.append({"name": n.name, "gpu": n.gpu, "count": n.count, "region": n.region,
                      "zone": n.zone, "edge": n.edge, "devices": [first, first + n.count - 1]})
        first += n.count
    return {
        "name": cluster.name,
        "fingerprint": cluster_fingerprint(cluster),  # what a plan's made_for.cluster records
        "num_devices": cluster.num_devices,
        "num_nodes": len(cluster.nodes),
        "gpu_types": cluster.gpu_counts(),
        "regions": list(cluster.regions),
        "gpus_by_region": by_region,
        "edge_nodes": [n.name for n in cluster.nodes if n.edge],
        "aggregate_bf16_tflops": float(np.sum(topo.flops) / 1e12),
        "aggregate_memory_gb": float(np.sum(topo.memory_bytes) / 1e9),
        "one_way_latency_s": lat,
        "bandwidth_gbps": bandwidth,
        "nodes": nodes,
        # per region pair: one-way ms, per-flow Gbit/s and the pair's aggregate Gbit/s (null:
        # no cap of the pair)
        "region_links": [{"a": link.a, "b": link.b, "latency_ms": link.latency_ms,
                          "bandwidth_gbps": link.bandwidth_gbps,
                          "aggregate_gbps": link.aggregate_gbps}
                         for link in cluster.region_links],
        # the links taken from the AWS matrix's great-circle estimates (source G), not from a
        # measurement: "a<->b"
        "estimated_region_links": _estimated_links(cluster),
    }


def _estimated_links(cluster: ClusterSpec) -> list[str]:
    """The cluster's region links whose values are the shipped matrix's great-circle estimate
    (source G in ``hetrl/data/aws_rtt_source.csv``)."""
    from hetrl.spec.regions import aws_bandwidth_gbps, aws_rtt_ms, aws_rtt_source

    source, rtt, bw = aws_rtt_source(), aws_rtt_ms(), aws_bandwidth_gbps()
    return [f"{link.a}<->{link.b}" for link in cluster.region_links
            if source.get((link.a, link.b)) == "G"
            and link.latency_ms == rtt[(link.a, link.b)] / 2
            and link.bandwidth_gbps == bw[(link.a, link.b)]]


def format_cluster(info: dict[str, Any]) -> str:
    lines = [f"cluster {info['name']}: {info['num_devices']} GPUs in {info['num_nodes']} nodes, "
             f"{len(info['regions'])} region(s)", f"  fingerprint {info['fingerprint']}"]
    for region, counts in info["gpus_by_region"].items():
        lines.append(f"  {region:<14} " + ", ".join(f"{n} x {g}" for g, n in counts.items()))
    if info["edge_nodes"]:
        lines.append(f"  edge nodes: {', '.join(info['edge_nodes'])}")
    lines.append(f"  aggregate: {info['aggregate_bf16_tflops']:,.0f} bf16 TFLOPS, "
                 f"{info['aggregate_memory_gb']:,.0f} GB memory")
    if info["one_way_latency_s"]:
        lat, bw = info["one_way_latency_s"], info["bandwidth_gbps"]
        lines.append(f"  between nodes: one-way latency {lat['min'] * 1e3:.2f}-{lat['max'] * 1e3:.2f} ms,"
                     f" bandwidth {bw['min']:.2f}-{bw['max']:.2f} Gbps")
    links = info.get("region_links") or []
    if links:
        flows = [link["bandwidth_gbps"] for link in links]
        capped = [link for link in links if link["aggregate_gbps"] is not None]
        caps = ", ".join(f"{c['a']}<->{c['b']} {c['aggregate_gbps']:g}" for c in capped[:8])
        more = f", ... ({len(capped)} in all)" if len(capped) > 8 else ""
        span = f"{min(flows):g}" if min(flows) == max(flows) else f"{min(flows):g}-{max(flows):g}"
        lines.append(f"  region links: {len(links)}, per flow {span} Gbit/s; "
                     + (f"aggregate caps (Gbit/s, each direction): {caps}{more}" if capped
                        else "no aggregate caps"))
    estimated = info.get("estimated_region_links") or []
    if estimated:
        lines.append(f"  estimated (great-circle, not measured; override under region_links): "
                     f"{', '.join(estimated[:6])}{', ...' if len(estimated) > 6 else ''}")
    lines.append("  nodes (name: GPUs, region/zone, device ids):")
    for n in info["nodes"]:
        lo, hi = n["devices"]
        lines.append(f"    {n['name']}: {n['count']} x {n['gpu']}, {n['region']}/{n['zone']}"
                     f"{', edge' if n['edge'] else ''}, devices {lo}-{hi}")
    return "\n".join(lines)


def describe_workload(workload: WorkloadSpec) -> dict[str, Any]:
    """Algorithm, models per role with derived parameter counts, tasks and their dependencies."""
    return {
        "name": workload.name,
        "fingerprint": workload_fingerprint(workload),  # what a plan's made_for.workload records
        "algorithm": workload.algorithm,
        "mode": workload.mode,
        "staleness": workload.staleness,
        "models": {role: {"name": m.name, "params": m.params, "layers": m.layers,
                          **({"active_params": m.active_params, "experts": m.moe.experts,
                              "top_k": m.moe.top_k} if m.moe is not None else {})}
                   for role, m in workload.models},
        "tasks": {t.name: {"role": t.role, "kind": t.kind, "depends_on": list(t.depends_on)}
                  for t in workload.tasks},
        "batch_prompts": workload.batch_prompts,
        "responses_per_prompt": workload.responses_per_prompt,
        "samples": workload.samples,
        "prompt_length": workload.prompt_length.to_dict(),
        "response_length": workload.response_length.to_dict(),
        "tokens_per_iteration": workload.samples * (workload.prompt_length.mean
                                                    + workload.response_length.mean),
    }


def format_workload(info: dict[str, Any]) -> str:
    lines = [f"workload {info['name']}: {info['algorithm'].upper()} {info['mode']}"
             + (f" (staleness {info['staleness']})" if info["mode"] == "async" else ""),
             f"  fingerprint {info['fingerprint']}"]
    for role, m in info["models"].items():
        moe = (f", {m['active_params'] / 1e9:.2f} B active: {m['experts']} experts, "
               f"top-{m['top_k']}") if "experts" in m else ""
        lines.append(f"  {role:<10} {m['name']} ({m['params'] / 1e9:.2f} B params{moe}, "
                     f"{m['layers']} layers)")
    pl, rl = info["prompt_length"], info["response_length"]
    lines.append(f"  batch: {info['batch_prompts']} prompts x {info['responses_per_prompt']} "
                 f"responses = {info['samples']} samples")
    lines.append(f"  prompt length mean {pl['mean']:g} max {pl['max']}; response length mean "
                 f"{rl['mean']:g} max {rl['max']} tokens")
    for name, t in info["tasks"].items():
        deps = ", ".join(t["depends_on"]) or "-"
        lines.append(f"  task {name:<20} {t['kind']:<10} after: {deps}")
    return "\n".join(lines)
