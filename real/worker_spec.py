"""What one :class:`real.worker.DeviceWorker` is given: a frozen :class:`WorkerSpec`, built once
on the driver from the workload, cluster, plan and run config (:func:`worker_specs`), so the
actor receives parsed objects (no dicts to parse again) and every choice made for its engines
(engine name, model shape, weights seed, megatron grid) is visible in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.model import ModelShape
from hetrl.spec.workload import WorkloadSpec
from real.algos import AlgoConfig
from real.config import RunConfig
from real.engines import DEFAULT_ENGINE
from real.engines.megatron_parallel import MegatronGrid
from real.placement import Tasklet, by_device

#: Seed offsets per role: the reference starts as an exact copy of the actor (same seed).
ROLE_SEED = {"actor": 0, "reference": 0, "critic": 1, "reward": 2}


@dataclass(frozen=True)
class EngineSpec:
    """One tasklet's engine: ``engine`` names it (a key of ``real.engines.ENGINES``), ``model``
    is its role's shape, ``seed`` its initial weights' seed (the run's seed + ``ROLE_SEED``),
    ``grid`` its task's (dp, pp, tp) grid when it is a megatron trainer."""

    tasklet: Tasklet
    engine: str
    model: ModelShape
    seed: int
    grid: MegatronGrid | None = None


@dataclass(frozen=True)
class WorkerSpec:
    """Everything the worker of ``device`` needs. ``t0``: the run's epoch (``time.time()``, s)
    that span times count from; ``kill_at``: (task, iteration index) at whose start the worker
    exits (fault injection), or None; ``torch_device``: where its engines run (cpu, cuda,
    cuda:N)."""

    device: int
    cluster: ClusterSpec
    engines: tuple[EngineSpec, ...]
    algo: AlgoConfig
    t0: float
    emulate_network: bool = True
    emulate_speed: bool = True
    torch_device: str = "cpu"
    kill_at: tuple[str, int] | None = None

    @property
    def tasklets(self) -> dict[str, Tasklet]:
        """Task -> this device's tasklet of it, in plan order."""
        return {e.tasklet.task: e.tasklet for e in self.engines}

    @property
    def grids(self) -> dict[str, MegatronGrid]:
        """Task -> grid, for this device's megatron trainers."""
        return {e.tasklet.task: e.grid for e in self.engines if e.grid is not None}


def engine_specs(workload: WorkloadSpec, tasklets: Sequence[Tasklet], seed: int,
                 engines: Mapping[str, str] | None = None,
                 grids: Mapping[str, MegatronGrid] | None = None) -> tuple[EngineSpec, ...]:
    """The engine of each of ``tasklets``: ``engines`` (task kind -> engine name; kinds left
    out use torch), ``grids`` (task -> grid of its megatron trainer)."""
    engines, grids = dict(engines or {}), dict(grids or {})
    return tuple(EngineSpec(t, engines.get(t.kind, DEFAULT_ENGINE), workload.model(t.role),
                            seed + ROLE_SEED[t.role], grids.get(t.task)) for t in tasklets)


def worker_specs(workload: WorkloadSpec, cluster: ClusterSpec, tasklets: Sequence[Tasklet],
                 algo: AlgoConfig, config: RunConfig, t0: float,
                 grids: Mapping[str, MegatronGrid] | None = None) -> dict[int, WorkerSpec]:
    """Device -> the spec of its worker, for every device of ``tasklets`` (ascending)."""
    kill = config.kill_at
    return {d: WorkerSpec(d, cluster, engine_specs(workload, ts, config.seed,
                                                   dict(config.engines), grids),
                          algo, t0, config.emulate_network, config.emulate_speed, config.device,
                          (kill[0], kill[1]) if kill and kill[2] == d else None)
            for d, ts in by_device(tuple(tasklets)).items()}
