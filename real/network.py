"""Emulated devices and network: make one machine behave like the planned cluster.

Transfers between devices are delayed by the cluster's path latency and bandwidth (one-way
seconds + bytes / bytes-per-second, from the topology), so a run under a multi-region cluster is
slower by what the topology implies; the paper emulated its regions the same way. Collectives
use the ring formula over the slowest link of the ring. Optionally a device's compute is
stretched by its GPU type's peak relative to the cluster's fastest type, so an L4 tasklet takes
longer than an A100 tasklet on a CPU that runs both at one speed.

All times are seconds, sizes bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property

from hetrl.spec.cluster import ClusterSpec


@dataclass(frozen=True)
class NetworkEmulator:
    """Delays from ``cluster``'s topology; ``enabled`` False makes every delay zero."""

    cluster: ClusterSpec
    enabled: bool = True
    emulate_speed: bool = True

    def transfer_s(self, src: int, dst: int, nbytes: float) -> float:
        """One-way time of ``nbytes`` from device ``src`` to ``dst`` (0 on one device)."""
        if not self.enabled or src == dst:
            return 0.0
        return self.cluster.latency_s(src, dst) + nbytes / self.cluster.bandwidth_Bps(src, dst)

    def gather_s(self, sources: dict[int, float], dst: int) -> float:
        """Time for ``dst`` to receive ``sources`` (device -> bytes) as parallel flows."""
        return max((self.transfer_s(s, dst, b) for s, b in sources.items()), default=0.0)

    def ring_all_reduce_s(self, devices: tuple[int, ...], nbytes: float) -> float:
        """Ring all-reduce of ``nbytes`` per device: 2(n-1) steps of nbytes/n over the ring's
        slowest link, the ring going node by node as the cost model's (Patarasuk & Yuan 2009)."""
        n = len(devices)
        if not self.enabled or n < 2:
            return 0.0
        order = sorted(devices, key=lambda d: (self.cluster.device(d).node, d))  # node by node
        ring = list(zip(order, order[1:] + order[:1], strict=True))
        step = max(self.transfer_s(a, b, nbytes / n) for a, b in ring)
        return 2 * (n - 1) * step

    def all_to_all_s(self, devices: tuple[int, ...], nbytes: float, calls: int) -> float:
        """``calls`` all-to-alls over ``devices`` in which each device sends ``nbytes`` in all,
        spread evenly over the others, every pair at once: per call the slowest pair's latency,
        and the bytes at the slowest pair's bandwidth."""
        n = len(devices)
        if not self.enabled or n < 2:
            return 0.0
        pairs = [(a, b) for a in devices for b in devices if a != b]
        latency = max(self.cluster.latency_s(a, b) for a, b in pairs)
        bandwidth = min(self.cluster.bandwidth_Bps(a, b) for a, b in pairs)
        return calls * latency + nbytes / (n - 1) / bandwidth

    @cached_property
    def _fastest_tflops(self) -> float:
        return max(self.cluster.device(d).gpu.bf16_tflops for d in range(self.cluster.num_devices))

    def slowdown(self, device: int) -> float:
        """Factor (>= 1) by which ``device``'s compute is stretched: fastest peak / its peak."""
        if not self.emulate_speed:
            return 1.0
        return self._fastest_tflops / self.cluster.device(device).gpu.bf16_tflops


def wait(seconds: float) -> None:
    """Sleep ``seconds`` if positive (an emulated delay)."""
    if seconds > 0:
        time.sleep(seconds)
