"""Measure the local devices into a ClusterSpec that the cost model can use (``hetrl profile``).

Four figures, each the best of timed repetitions within a time budget:

- ``matmul_tflops``: achieved dense matmul throughput, TFLOPS (1e12 FLOP/s), 2 n^3 FLOPs per
  n x n product; float32 on CPU (one thread, as a Ray device worker runs with
  ``OMP_NUM_THREADS=1``), bf16 on CUDA.
- ``hbm_gbps``: copy bandwidth of a large tensor (``dst.copy_(src)``), GB/s (1e9 bytes/s), bytes
  read + bytes written per copy (the STREAM "copy" convention).
- ``link_latency_s``, ``link_gbps``: between two Ray actor workers: one-way latency = half the
  median round trip of an 8-byte numpy array through ``ray.get``; bandwidth = bytes of a large
  array sent one way / (its time - one small round trip), GB/s.
- ``memory_gb``: memory of one device, GB: CPU RAM (or the cgroup limit, the smaller) divided by
  the devices that share it; on CUDA the device's total memory.

Heavy imports (torch, ray) happen inside the functions.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import Any

from hetrl.errors import HetrlError, SpecError, require

DEVICE_KINDS = ("cpu", "cuda")
MAX_DEVICES = 64  # a cluster node holds at most 64 GPUs (docs/specs.md)


@dataclass(frozen=True)
class ProfileResult:
    """What ``profile_devices`` measured. Units in the names (GB = 1e9 bytes)."""

    matmul_tflops: float  # achieved matmul TFLOPS in ``dtype``
    hbm_gbps: float  # copy bandwidth, GB/s (read + written bytes)
    link_latency_s: float  # one-way latency between two Ray actor workers, seconds
    link_gbps: float  # one-way bandwidth between two Ray actor workers, GB/s
    memory_gb: float  # memory of one device, GB
    device: str = "cpu"  # "cpu" or "cuda"
    dtype: str = "float32"  # dtype of the matmul
    hostname: str = ""
    date: str = ""  # ISO date of the measurement

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Sizes:
    matmul_n: int  # n of the n x n matmul
    copy_bytes: int  # bytes of the copied tensor
    link_bytes: int  # bytes of the large array sent between actors
    link_reps: int  # round trips of the small array


_SIZES = {
    ("cpu", False): _Sizes(1024, 256 * 2**20, 64 * 2**20, 50),
    ("cpu", True): _Sizes(384, 64 * 2**20, 8 * 2**20, 20),
    ("cuda", False): _Sizes(8192, 2 * 2**30, 64 * 2**20, 50),
    ("cuda", True): _Sizes(4096, 512 * 2**20, 8 * 2**20, 20),
}


def best_seconds(fn: Callable[[], Any], budget_s: float, sync: Callable[[], Any],
                 min_reps: int = 3, max_reps: int = 1000) -> float:
    """Shortest wall time of ``fn()`` over repetitions (one warm-up, at least ``min_reps``, more
    while ``budget_s`` seconds last). ``sync`` waits for queued device work."""
    fn()
    sync()
    best = math.inf
    start = time.perf_counter()
    reps = 0
    while reps < min_reps or (time.perf_counter() - start < budget_s and reps < max_reps):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return max(best, 1e-9)


def measure_matmul_tflops(device: str, n: int, budget_s: float) -> tuple[float, str]:
    """Achieved TFLOPS of an n x n matmul on ``device`` and the dtype used."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = best_seconds(lambda: torch.matmul(a, b, out=out), budget_s, device_sync(device))
    return 2.0 * n**3 / seconds / 1e12, str(dtype).removeprefix("torch.")


def measure_copy_gbps(device: str, nbytes: int, budget_s: float) -> float:
    """Copy bandwidth of a ``nbytes`` tensor on ``device``, GB/s of bytes read + written."""
    import torch

    n = max(1, nbytes // 4)
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = best_seconds(lambda: dst.copy_(src), budget_s, device_sync(device))
    return 2.0 * n * 4 / seconds / 1e9


def device_sync(device: str) -> Callable[[], None]:
    """A call that waits for the work queued on torch ``device`` ("cuda", "cuda:1"; on CPU
    nothing is queued)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


def _peer_class():
    """A tiny actor class, defined here so Ray pickles it by value (workers need no import path)."""

    class Peer:
        def echo(self, x):
            return x

        def sink(self, x):
            return int(x.nbytes)

        def round_trips(self, peer, nbytes: int, reps: int) -> list[float]:
            """Seconds of each ``peer.echo`` call with ``nbytes`` bytes (there and back)."""
            import numpy as _np

            return self._timed(peer.echo, _np.zeros(max(1, nbytes), dtype=_np.uint8), reps)

        def one_way(self, peer, nbytes: int, reps: int) -> list[float]:
            """Seconds of each ``peer.sink`` call with ``nbytes`` bytes (there only)."""
            import numpy as _np

            return self._timed(peer.sink, _np.ones(nbytes, dtype=_np.uint8), reps)

        @staticmethod
        def _timed(method, x, reps: int) -> list[float]:
            import time as _t

            import ray as _ray

            _ray.get(method.remote(x))  # warm-up
            out = []
            for _ in range(reps):
                t0 = _t.perf_counter()
                _ray.get(method.remote(x))
                out.append(_t.perf_counter() - t0)
            return out

    return Peer


def measure_link(nbytes: int, reps: int) -> tuple[float, float]:
    """(one-way latency s, one-way GB/s) between two Ray actor workers with ``num_cpus=0``."""
    from real.ray_env import ensure_ray

    ray = ensure_ray()
    actor = ray.remote(num_cpus=0)(_peer_class())
    a, b = actor.remote(), actor.remote()
    try:
        rtts = ray.get(a.round_trips.remote(b, 8, reps))
        big = ray.get(a.one_way.remote(b, nbytes, max(3, reps // 10)))
    finally:
        ray.kill(a)
        ray.kill(b)
    rtt = statistics.median(rtts)
    t_big = min(big)
    payload_s = t_big - rtt if t_big > 2 * rtt else t_big
    return rtt / 2, nbytes / payload_s / 1e9


def device_memory_gb(device: str, devices: int) -> float:
    """Memory of one device, GB: the CUDA device's total memory, or CPU RAM / ``devices``."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory / 1e9
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cgroup = Path("/sys/fs/cgroup/memory.max")
    try:
        limit = cgroup.read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total / devices / 1e9


def profile_devices(devices: int, gpu_name: str = "cpu-local", device: str = "cpu",
                    seconds: float = 6.0, quick: bool = False) -> ProfileResult:
    """Measure the local ``device`` kind; ``devices`` is how many such devices the cluster has
    (CPU RAM is split between them). ``seconds``: total time budget of the timed loops (the
    actors' start is extra). ``quick``: small sizes, for tests (well under 10 s in all)."""
    require(isinstance(devices, int) and not isinstance(devices, bool) and 1 <= devices <= MAX_DEVICES,
            "devices", devices, f"must be an integer in [1, {MAX_DEVICES}] (devices of one node)")
    require(device in DEVICE_KINDS, "device", device, f"must be one of {list(DEVICE_KINDS)}")
    require(isinstance(gpu_name, str) and gpu_name.strip() != "", "gpu_name", gpu_name,
            "must be a non-empty string")
    require(isinstance(seconds, int | float) and 0 < seconds <= 3600, "seconds", seconds,
            "must be in (0, 3600]")
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            raise HetrlError("device = 'cuda': no CUDA device is available here; use --device cpu")
        require(devices <= torch.cuda.device_count(), "devices", devices,
                f"this machine has {torch.cuda.device_count()} CUDA devices")
    sizes = _SIZES[(device, quick)]
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        tflops, dtype = measure_matmul_tflops(device, sizes.matmul_n, 0.4 * seconds)
        hbm = measure_copy_gbps(device, sizes.copy_bytes, 0.3 * seconds)
    finally:
        torch.set_num_threads(threads)
    latency, link = measure_link(sizes.link_bytes, sizes.link_reps)
    result = ProfileResult(
        matmul_tflops=tflops, hbm_gbps=hbm, link_latency_s=latency, link_gbps=link,
        memory_gb=device_memory_gb(device, devices), device=device, dtype=dtype,
        hostname=socket.gethostname(), date=date.today().isoformat())
    for key in ("matmul_tflops", "hbm_gbps", "link_latency_s", "link_gbps", "memory_gb"):
        value = getattr(result, key)
        if not (math.isfinite(value) and value > 0):
            raise SpecError(f"profile.{key}", value, "measurement is not a positive finite number")
    return result


def _sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (readable YAML)."""
    return float(f"{x:.{digits}g}")


def cluster_dict(result: ProfileResult, devices: int, name: str = "profiled",
                 gpu_name: str = "cpu-local") -> dict[str, Any]:
    """A ClusterSpec mapping (docs/specs.md): one ``gpu_types`` entry ``gpu_name`` with the
    measured figures and one node of ``devices`` of it in region ``local``.

    ``bf16_tflops`` is the measured matmul TFLOPS (in the dtype measured: float32 on CPU),
    ``intra_link_gbps`` the measured link GB/s and ``node_nic_gbps`` the same link in Gbit/s
    (a one-node cluster sends nothing over its NIC). The cost model's efficiency factors then
    scale these achieved figures (``hetrl calibrate`` fits them)."""
    require(isinstance(devices, int) and 1 <= devices <= MAX_DEVICES, "devices", devices,
            f"must be an integer in [1, {MAX_DEVICES}]")
    where = f"{result.hostname or socket.gethostname()} {result.date or date.today().isoformat()}"
    return {
        "schema_version": 1,
        "name": name,
        "gpu_types": [{
            "name": gpu_name,
            "bf16_tflops": min(_sig(result.matmul_tflops), 1e5),
            "memory_gb": min(_sig(result.memory_gb), 1e4),
            "hbm_gbps": min(_sig(result.hbm_gbps), 1e5),
            "intra_link": "pcie",
            "intra_link_gbps": _sig(result.link_gbps),
            "node_nic_gbps": min(_sig(result.link_gbps * 8), 1e5),
            "source": f"hetrl profile on {where} ({result.device}, {result.dtype} matmul)",
        }],
        "nodes": [{"name": "local", "gpu": gpu_name, "count": devices, "region": "local"}],
    }
