"""The run's Ray actors as one object, as verl's ``RayWorkerGroup``: it creates one
:class:`real.worker.DeviceWorker` per planned device (each in its own bundle of one placement
group), joins them into one torch.distributed world (gloo; on GPUs also NCCL) with a group per
DP all-reduce (torch trainers) and
megatron-core's groups of each megatron trainer's (dp, pp, tp) grid, hands out their handles,
waits for their results, names the device, GPU type and task when one dies or fails, and kills
them at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hetrl.errors import HetrlError
from hetrl.plan import Plan
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec
from hetrl.trace import Span
from real.algos import AlgoConfig
from real.config import RunConfig
from real.engines.megatron_parallel import MegatronGrid
from real.placement import (
    Tasklet,
    device_bundles,
    emulated_resources,
    expert_groups,
    missing_resources,
)
from real.ray_env import ensure_ray, free_port
from real.worker import DeviceWorker
from real.worker_spec import worker_specs

#: Seconds a worker may take to start and build its engines (imports of torch and transformers
#: take tens of seconds on a loaded 2-core machine).
SETUP_TIMEOUT_S = 900.0
#: What a pending call is about, for messages: (device, task, iteration index; -1: set-up).
Job = tuple[int, str, int]


class RunError(HetrlError):
    """A run stopped: a worker died or weights did not sync."""


def where(it: int) -> str:
    """An iteration index (0-based, as in traces and ``RunConfig.kill_at``) in words, counted
    from 1 as every message and the progress line count it; -1 is the set-up."""
    return f"iteration {it + 1}" if it >= 0 else "set-up"


def dp_groups(plan: Plan, workload: WorkloadSpec,
              skip: tuple[str, ...] = ()) -> dict[str, tuple[int, ...]]:
    """Gradient all-reduce groups of the torch trainers: per training task (not in ``skip``: the
    megatron engine's tasks have their grids' groups) and stage, the devices of its replicas;
    with expert parallelism also its expert groups (:func:`real.placement.expert_groups`)."""
    out = {}
    for p in plan.placements:
        if workload.task(p.task).kind == "training" and p.dp > 1 and p.task not in skip:
            for s in range(p.pp):
                out[f"{p.task}/stage{s}"] = tuple(r[s][0] for r in p.devices)
            out.update(expert_groups(p))
    return out


class WorkerGroup:
    """The workers of ``tasklets``' devices; :meth:`start` them, index by device id for the
    actor handle, :meth:`get` results, :meth:`stop` at the end."""

    def __init__(self, workload: WorkloadSpec, cluster: ClusterSpec, plan: Plan,
                 tasklets: Sequence[Tasklet], checkpoint_dir: str | None = None,
                 grids: Mapping[str, MegatronGrid] | None = None):
        self.workload, self.cluster, self.plan = workload, cluster, plan
        self.tasklets = tuple(tasklets)
        self.grids = dict(grids or {})  # task -> grid of its megatron trainer
        self.devices = tuple(sorted({t.device for t in tasklets}))
        self.checkpoint_dir = checkpoint_dir  # named in the message of a lost worker
        self.workers: dict[int, Any] = {}
        self.pids: dict[int, int] = {}
        self._pg = None

    def __getitem__(self, device: int) -> Any:
        return self.workers[device]

    # --- life cycle ---
    def start(self, t0: float, algo: AlgoConfig, config: RunConfig,
              states: Mapping[int, Mapping[str, Any]] | None) -> None:
        """Create the placement group, one worker per device, the world with the torch
        trainers' DP groups and the megatron trainers' grid groups, then every engine (trainers
        restored from ``states`` = device -> task -> saved state). ``t0``: the run's epoch
        (``time.time()``, s); each worker gets its :class:`real.worker_spec.WorkerSpec`."""
        gpu = config.device == "cuda"
        ray = ensure_ray(None if gpu else emulated_resources(self.devices, self.cluster),
                         emulate=not gpu)
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundles = device_bundles(self.devices, self.cluster, gpu)
        need: dict[str, float] = {}
        for b in bundles:
            for k, v in b.items():
                need[k] = need.get(k, 0.0) + v
        short = missing_resources(need, ray.cluster_resources())
        if short:
            raise RunError(f"the Ray cluster lacks resources for this plan: {short} "
                           f"(has {ray.cluster_resources()}); start Ray with these custom resources")
        self._pg = placement_group(bundles, strategy="PACK")
        ray.get(self._pg.ready(), timeout=60)
        remote = ray.remote(DeviceWorker)
        specs = worker_specs(self.workload, self.cluster, self.tasklets, algo, config, t0,
                             self.grids)
        for i, d in enumerate(self.devices):
            opts = {"num_cpus": 0, "max_restarts": 0, "num_gpus": 1 if gpu else 0,
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(self._pg, i)}
            self.workers[d] = remote.options(**opts).remote(specs[d])
        groups = dp_groups(self.plan, self.workload, tuple(self.grids))
        for g in self.grids.values():
            groups.update(g.groups())
        if groups:  # before the engines: a megatron trainer is built on its groups
            rank = {d: i for i, d in enumerate(self.devices)}
            port = free_port()
            self.get({self.workers[d].init_distributed.remote(
                rank[d], len(self.devices), f"tcp://127.0.0.1:{port}",
                {k: [rank[x] for x in devs] for k, devs in groups.items()}, SETUP_TIMEOUT_S):
                (d, "setup", -1) for d in self.devices}, timeout_s=SETUP_TIMEOUT_S)
        pids = self.get({self.workers[d].setup.remote((states or {}).get(d)): (d, "setup", -1)
                         for d in self.devices}, timeout_s=SETUP_TIMEOUT_S)
        self.pids = dict(zip(self.devices, pids, strict=True))

    def stop(self) -> None:
        import ray

        for w in self.workers.values():
            ray.kill(w, no_restart=True)
        self.workers = {}
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
            self._pg = None

    # --- calls on every worker ---
    def drain_spans(self, it: int) -> list[Span]:
        """Every worker's spans recorded since the last drain (``it``: for messages)."""
        spans: list[Span] = []
        for d in self.devices:
            spans += self.get({self.workers[d].drain_spans.remote(): (d, "trace", it)})[0]
        return spans

    def trainer_states(self) -> dict[int, dict[str, Any]]:
        """Every trainer's weights and optimizer state: device -> task -> state."""
        refs = {self.workers[t.device].save_state.remote(t.task): (t.device, t.task, -1)
                for t in self.tasklets if t.kind == "training"}
        out: dict[int, dict[str, Any]] = {}
        for (d, task, _), st in zip(refs.values(), self.get(refs), strict=True):
            out.setdefault(d, {})[task] = st
        return out

    # --- results and diagnosis ---
    def get(self, refs: Mapping[Any, Job], timeout_s: float | None = None) -> list[Any]:
        """Results of ``refs`` (ref -> (device, task, iteration)) in order, taken as they finish.
        A dead worker becomes a RunError naming its device, GPU type and task; so does a task that
        failed (naming a dead peer when one is why) or a wait beyond ``timeout_s``."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        results: dict[Any, Any] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
            if not ready:
                d, task, _ = refs[pending[0]]
                raise RunError(f"device {d} ({self.cluster.device(d).gpu.name}) did not finish "
                               f"{task} within {timeout_s:.0f} s")
            ref = ready[0]
            try:
                results[ref] = ray.get(ref)
            except RayActorError:
                raise self.lost(*refs[ref]) from None
            except RayTaskError as exc:
                d, task, it = refs[ref]
                dead = self.dead_devices()
                if dead:  # a peer's death broke this task's collective
                    raise self.lost(dead[0], task, it) from None
                cause = str(exc).strip().splitlines()[-1][:300]
                raise RunError(f"device {d} ({self.cluster.device(d).gpu.name}) failed during "
                               f"{task} of {where(it)}: {cause}") from None
        return [results[r] for r in refs]

    def lost(self, d: int, task: str, it: int) -> RunError:
        ckpt = self.checkpoint_dir
        hint = (f"; finished iterations are checkpointed in {ckpt}: rerun with --resume"
                if ckpt else "; run with a checkpoint directory to be able to resume")
        return RunError(f"device {d} ({self.cluster.device(d).gpu.name}, worker pid "
                        f"{self.pids.get(d, '?')}) was lost during {task} of {where(it)}: its "
                        f"worker died{hint}")

    def dead_devices(self) -> list[int]:
        """Devices whose worker has died (a call on a dead actor fails at once; a live one busy in
        a broken collective answers within the wait or is taken as alive)."""
        import ray
        from ray.exceptions import RayActorError

        dead = []
        for d, w in self.workers.items():
            ref = w.__ray_ready__.remote()
            ready, _ = ray.wait([ref], timeout=2.0)
            if ready:
                try:
                    ray.get(ready[0])
                except RayActorError:
                    dead.append(d)
        return dead


