"""Plan: an execution plan as plain data (ids and numbers only), and its validation.

Levels of the HetRL search space, as stored here:
- level 1: ``groups[*].tasks`` -- which tasks share one set of GPUs (their models co-located);
- levels 2-3: ``groups[*].devices`` -- the group's concrete GPUs;
- level 4: per task ``dp``, ``pp``, ``tp``, ``ep`` (expert parallelism, mixture-of-experts
  models) and ``layers_per_stage``;
- level 5: per task ``devices[replica][stage][tp_rank]`` -- the tasklet-to-device map;
- load balancing: per task ``data_weights`` (a replica's share of the batch is its weight over the
  sum) and uneven ``layers_per_stage``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Any

from hetrl import __version__
from hetrl.errors import (
    SpecError,
    boolean,
    integer,
    is_int,
    one_of,
    require,
    string,
)
from hetrl.fingerprint import MadeFor, made_for
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.model import ModelShape
from hetrl.spec.tasks import COLOCATED_WITH
from hetrl.spec.workload import WorkloadSpec

SCHEMA_VERSION = 1

Grid = tuple[tuple[tuple[int, ...], ...], ...]
#: Training backends a placement may name (see TaskPlacement).
BACKENDS = ("megatron", "fsdp")


class _computed_once:
    """A lazily computed attribute stored in the instance's ``__dict__`` on first access, as
    ``functools.cached_property`` but without its lock (Python 3.11 takes one on every first
    access: placements are built by the thousand in searches)."""

    def __init__(self, fn: Any):
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass(frozen=True)
class TaskPlacement:
    """How one task is partitioned (dp x pp x tp) and where each tasklet runs.

    ``backend`` (training and inference tasks): ``megatron`` -- TP, PP and, in training, a
    distributed optimizer (ZeRO-1: optimizer states sharded over DP, full bf16 weights and
    gradients on every rank) -- or ``fsdp`` -- ZeRO-3: weights (and in training gradients and
    optimizer states) sharded over the DP group, each layer's weights all-gathered for forward
    (and backward) and its gradients reduce-scattered, per micro-batch (pp = tp = 1).
    ``offload`` (inference and training tasks): parameters, gradients and optimizer states live
    in host memory between the task's calls (verl's param_offload + optimizer_offload, for its
    FSDP and Megatron workers alike).
    ``ep`` (mixture-of-experts models): expert parallelism. Each run of ``ep`` consecutive
    replicas is one expert-parallel group: its replicas hold experts / ep of each MoE layer's
    routed experts each (sliced over tp) and exchange tokens with all-to-alls; the other weights
    are replicated as in data parallelism (Megatron's ``expert_model_parallel_size``, carved out
    of the data-parallel ranks; for generation vLLM's expert parallelism with data-parallel
    attention). Expert gradients are reduced over the ``dp / ep`` replicas that hold the same
    experts. ep divides dp and the model's experts. With ``fsdp`` (FSDP2 with expert
    parallelism, as torchtitan and NeMo AutoModel run MoE models) the non-expert weights are
    sharded over the dp ranks and each rank's experts over the ``dp / ep`` ranks that hold the
    same ones."""

    task: str
    dp: int
    pp: int
    tp: int
    devices: Grid
    layers_per_stage: tuple[int, ...]
    data_weights: tuple[float, ...]
    backend: str = "megatron"
    offload: bool = False
    ep: int = 1

    def __hash__(self) -> int:  # placements key the cost model's caches: hash once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.task, self.dp, self.pp, self.tp, self.devices, self.layers_per_stage,
                      self.data_weights, self.backend, self.offload, self.ep))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:  # string hashes differ between processes: drop the cached one
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @_computed_once
    def device_ids(self) -> tuple[int, ...]:
        """All devices of the task, replica-major, then stage, then tp rank."""
        return tuple(chain.from_iterable(chain.from_iterable(self.devices)))

    @_computed_once
    def device_array(self) -> Any:
        """:attr:`device_ids` as a read-only numpy array (the cost model's index arrays)."""
        import numpy as np

        out = np.array(self.device_ids, dtype=np.int64)  # (no type discovery: ~30% quicker)
        out.setflags(write=False)
        return out

    def replica(self, i: int) -> tuple[tuple[int, ...], ...]:
        return self.devices[i]

    @_computed_once
    def layer_bounds(self) -> tuple[int, ...]:
        """Layer boundaries of the stages: (0, l_0, l_0 + l_1, ..., layers); stage s holds
        layers [bounds[s], bounds[s + 1])."""
        out = [0]
        for n in self.layers_per_stage:
            out.append(out[-1] + n)
        return tuple(out)

    @_computed_once
    def data_shares(self) -> tuple[float, ...]:
        """Fraction of the batch each replica processes (sums to 1)."""
        total = sum(self.data_weights)
        return tuple([w / total for w in self.data_weights])

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "dp": self.dp,
            "pp": self.pp,
            "tp": self.tp,
            **({"ep": self.ep} if self.ep != 1 else {}),
            "devices": [[list(stage) for stage in replica] for replica in self.devices],
            "layers_per_stage": list(self.layers_per_stage),
            "data_weights": list(self.data_weights),
            # (written only when not the default: plans without them read as before)
            **({"backend": self.backend} if self.backend != "megatron" else {}),
            **({"offload": self.offload} if self.offload else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field_name: str = "placement") -> TaskPlacement:
        require(isinstance(data, Mapping), field_name, data, "must be a mapping")
        known = set(cls.__dataclass_fields__)
        for key in data:
            require(key in known, f"{field_name}.{key}", data[key],
                    f"unknown key; known keys: {sorted(known)}")
        for key in known - {"backend", "offload", "ep"}:
            require(key in data, f"{field_name}.{key}", None, "is required")
        grid = data["devices"]
        require(_is_grid(grid), f"{field_name}.devices", grid,
                "must be a list (replicas) of lists (stages) of lists (tp ranks) of device ids")
        require(isinstance(data["layers_per_stage"], list | tuple), f"{field_name}.layers_per_stage",
                data["layers_per_stage"], "must be a list of layer counts, one per stage")
        weights = data["data_weights"]
        require(isinstance(weights, list | tuple) and all(
            isinstance(w, int | float) and not isinstance(w, bool) for w in weights),
            f"{field_name}.data_weights", weights, "must be a list of numbers, one per replica")
        return cls(
            task=string(f"{field_name}.task", data["task"]),
            dp=data["dp"],
            pp=data["pp"],
            tp=data["tp"],
            devices=tuple(tuple(tuple(stage) for stage in replica) for replica in grid),
            layers_per_stage=tuple(data["layers_per_stage"]),
            data_weights=tuple(float(w) for w in data["data_weights"]),
            backend=one_of(f"{field_name}.backend", data.get("backend", "megatron"), BACKENDS),
            offload=boolean(f"{field_name}.offload", data.get("offload", False)),
            ep=data.get("ep", 1),
        )


def _is_grid(grid: Any) -> bool:
    return isinstance(grid, Sequence) and all(
        isinstance(rep, Sequence) and all(
            isinstance(st, Sequence) and all(isinstance(d, int) and not isinstance(d, bool)
                                             for d in st) for st in rep) for rep in grid)


@dataclass(frozen=True)
class TaskGroup:
    """Tasks that share one set of GPUs (their models co-located) and that set."""

    tasks: tuple[str, ...]
    devices: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"tasks": list(self.tasks), "devices": list(self.devices)}


@dataclass(frozen=True)
class Provenance:
    """Where a plan came from."""

    scheduler: str = "manual"
    seed: int | None = None
    version: str = __version__
    note: str = ""


@dataclass(frozen=True)
class Plan:
    """Task groups, per-task placements and provenance.

    ``sync_relay``: the weight sync sends one copy of the generation weights into each region
    that holds generation but no actor-training GPU, spread over that region's generation GPUs,
    which then pass it on to each other inside the region (docs/cost-model.md, "Weight sync");
    false: every generation GPU pulls its shard from the trainers.

    ``made_for``: the fingerprints of the workload and cluster the plan was made for
    (:mod:`hetrl.fingerprint`; None: not recorded). Metadata: two plans that differ only
    there are equal."""

    groups: tuple[TaskGroup, ...]
    placements: tuple[TaskPlacement, ...]
    provenance: Provenance = field(default_factory=Provenance)
    schema_version: int = SCHEMA_VERSION
    sync_relay: bool = False
    made_for: MadeFor | None = field(default=None, compare=False)

    def placement(self, task: str) -> TaskPlacement:
        for p in self.placements:
            if p.task == task:
                return p
        raise SpecError("placements", task, "no placement for this task")

    def group_of(self, task: str) -> TaskGroup:
        for g in self.groups:
            if task in g.tasks:
                return g
        raise SpecError("groups", task, "task is in no group")

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(sorted({d for g in self.groups for d in g.devices}))

    def with_placement(self, placement: TaskPlacement) -> Plan:
        return replace(self, placements=tuple(
            placement if p.task == placement.task else p for p in self.placements))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "provenance": {
                "scheduler": self.provenance.scheduler,
                "seed": self.provenance.seed,
                "version": self.provenance.version,
                "note": self.provenance.note,
            },
            # (written only when known: plans without it read as before, unchecked)
            **({"made_for": self.made_for.to_dict()} if self.made_for else {}),
            "groups": [g.to_dict() for g in self.groups],
            "placements": [p.to_dict() for p in self.placements],
            # (written only when set: plans without it read as before)
            **({"sync_relay": True} if self.sync_relay else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        require(isinstance(data, Mapping), "plan", type(data).__name__, "must be a mapping")
        known = {"schema_version", "provenance", "made_for", "groups", "placements",
                 "sync_relay"}
        for key in data:
            require(key in known, str(key), data[key], f"unknown key; known keys: {sorted(known)}")
        version = data.get("schema_version", SCHEMA_VERSION)
        require(is_int(version) and version == SCHEMA_VERSION, "schema_version", version,
                f"this hetrl reads plan version {SCHEMA_VERSION}")
        for key in ("groups", "placements"):
            require(isinstance(data.get(key), list), key, data.get(key), "must be a list")
        groups = []
        for i, g in enumerate(data["groups"]):
            require(isinstance(g, Mapping) and set(g) == {"tasks", "devices"}, f"groups[{i}]", g,
                    "must be a mapping with exactly 'tasks' and 'devices'")
            require(isinstance(g["tasks"], list | tuple) and all(
                isinstance(t, str) for t in g["tasks"]), f"groups[{i}].tasks", g["tasks"],
                "must be a list of task names")
            require(isinstance(g["devices"], list) and all(
                isinstance(d, int) and not isinstance(d, bool) for d in g["devices"]),
                f"groups[{i}].devices", g["devices"], "must be a list of device ids")
            groups.append(TaskGroup(tuple(str(t) for t in g["tasks"]), tuple(g["devices"])))
        placements = tuple(TaskPlacement.from_dict(p, f"placements[{i}]")
                           for i, p in enumerate(data["placements"]))
        prov = data.get("provenance")
        prov = {} if prov is None else prov
        require(isinstance(prov, Mapping), "provenance", prov, "must be a mapping")
        prov_known = set(Provenance.__dataclass_fields__)
        for key in prov:
            require(key in prov_known, f"provenance.{key}", prov[key],
                    f"unknown key; known keys: {sorted(prov_known)}")
        for key in ("scheduler", "version", "note"):
            if key in prov:
                string(f"provenance.{key}", prov[key], nonempty=False)
        if prov.get("seed") is not None:
            integer("provenance.seed", prov["seed"])
        relay = boolean("sync_relay", data.get("sync_relay", False))
        target = MadeFor.from_dict(data["made_for"]) if "made_for" in data else None
        return cls(tuple(groups), placements, Provenance(**prov), version, relay, target)


# --- validation ---------------------------------------------------------------------------------

def validate_layout(model: ModelShape, tp: int, pp: int, field_name: str) -> None:
    """tp must divide the attention heads (and the KV heads divide tp or tp divide them);
    pp must not exceed the layers."""
    require(model.heads % tp == 0, f"{field_name}.tp", tp,
            f"must divide {model.name}'s {model.heads} attention heads")
    require(model.kv_heads % tp == 0 or tp % model.kv_heads == 0, f"{field_name}.tp", tp,
            f"must divide {model.name}'s {model.kv_heads} KV heads or be a multiple of them")
    require(pp <= model.layers, f"{field_name}.pp", pp,
            f"must be <= {model.name}'s {model.layers} layers")


def validate_expert_parallel(model: ModelShape, ep: int, dp: int, field_name: str) -> None:
    """ep: 1 for a dense model; for a mixture-of-experts one it divides the routed experts (each
    rank holds whole experts) and dp (an expert-parallel group is ep whole replicas)."""
    require(is_int(ep) and ep >= 1, f"{field_name}.ep", ep, "must be an integer >= 1")
    if ep == 1:
        return
    require(model.moe is not None, f"{field_name}.ep", ep,
            f"must be 1: {model.name} is dense (no experts to split)")
    require(model.moe.experts % ep == 0, f"{field_name}.ep", ep,
            f"must divide {model.name}'s {model.moe.experts} experts")
    require(dp % ep == 0, f"{field_name}.ep", ep,
            f"must divide dp = {dp} (an expert-parallel group is ep whole data-parallel replicas)")


def validate(plan: Plan, workload: WorkloadSpec, cluster: ClusterSpec) -> None:
    """Raise :class:`SpecError` naming the first field of ``plan`` that does not fit."""
    tasks = workload.task_names
    boolean("sync_relay", plan.sync_relay)
    seen_tasks: dict[str, int] = {}
    seen_devices: dict[int, int] = {}
    require(len(plan.groups) >= 1, "groups", [], "need at least one task group")
    for gi, group in enumerate(plan.groups):
        f = f"groups[{gi}]"
        require(len(group.tasks) >= 1, f"{f}.tasks", [], "a group needs at least one task")
        require(len(group.devices) >= 1, f"{f}.devices", [], "a group needs at least one device")
        for t in group.tasks:
            require(t in tasks, f"{f}.tasks", t, f"not a task of {workload.algorithm}: {list(tasks)}")
            require(t not in seen_tasks, f"{f}.tasks", t,
                    f"task already in groups[{seen_tasks.get(t)}]")
            seen_tasks[t] = gi
        for d in group.devices:
            require(isinstance(d, int) and 0 <= d < cluster.num_devices, f"{f}.devices", d,
                    f"no such device in cluster {cluster.name!r} (ids 0..{cluster.num_devices - 1})")
            require(d not in seen_devices, f"{f}.devices", d,
                    f"device already in groups[{seen_devices.get(d)}]")
            seen_devices[d] = gi
    missing = [t for t in tasks if t not in seen_tasks]
    require(not missing, "groups", missing, "tasks missing from every group")
    for t, host in COLOCATED_WITH.items():
        if t in seen_tasks and host in seen_tasks:
            require(seen_tasks[t] == seen_tasks[host], f"groups[{seen_tasks[t]}].tasks", t,
                    f"must be in {host}'s group (groups[{seen_tasks[host]}]): it runs on the "
                    "trainer's weights")
    placed = [p.task for p in plan.placements]
    for i, t in enumerate(placed):  # a misspelt task is named as such, not as a missing one
        require(t in tasks, f"placements[{i}].task", t,
                f"not a task of {workload.algorithm}: {list(tasks)}")
    for t in tasks:
        require(placed.count(t) == 1, "placements", t,
                f"need exactly one placement per task, found {placed.count(t)}")
    for p in plan.placements:
        require(p.task in tasks, "placements", p.task, f"not a task of {workload.algorithm}")
        validate_placement(p, workload, cluster, plan.group_of(p.task))
    for t, host in COLOCATED_WITH.items():
        if t in tasks and host in tasks:
            outside = sorted(set(plan.placement(t).device_ids) - set(plan.placement(host).device_ids))
            require(not outside, f"placements[{t}].devices", outside,
                    f"not used by {host}: {t} runs on the trainer's weights, on its GPUs")


def validate_placement(p: TaskPlacement, workload: WorkloadSpec, cluster: ClusterSpec,
                       group: TaskGroup | None = None) -> None:
    f = f"placements[{p.task}]"
    model = workload.model(workload.task(p.task).role)
    require(p.backend in BACKENDS, f"{f}.backend", p.backend, f"must be one of {list(BACKENDS)}")
    require(isinstance(p.offload, bool), f"{f}.offload", p.offload, "must be true or false")
    if p.backend != "megatron":
        require(workload.task(p.task).kind != "generation", f"{f}.backend", p.backend,
                "generation runs on its rollout engine: only training and inference tasks have a "
                "backend choice")
        require(p.pp == 1 and p.tp == 1, f"{f}.backend", p.backend,
                f"fsdp shards over data parallelism only: needs pp = 1 and tp = 1 (got pp = "
                f"{p.pp}, tp = {p.tp})")
    require(not p.offload or workload.task(p.task).kind != "generation", f"{f}.offload",
            p.offload, "offload is an option of inference and training tasks (the rollout "
            "engine's sleep mode frees its memory instead)")
    for key in ("dp", "pp", "tp", "ep"):
        value = getattr(p, key)
        require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                f"{f}.{key}", value, "must be an integer >= 1")
    validate_layout(model, p.tp, p.pp, f)
    validate_expert_parallel(model, p.ep, p.dp, f)
    lacking = fp8_lacking(p, workload, cluster)
    if lacking is not None:
        raise SpecError(f"{f}.devices", *lacking)
    require(len(p.devices) == p.dp, f"{f}.devices", len(p.devices),
            f"must list dp = {p.dp} replicas")
    for i, replica in enumerate(p.devices):
        require(len(replica) == p.pp, f"{f}.devices[{i}]", len(replica),
                f"must list pp = {p.pp} stages")
        for j, stage in enumerate(replica):
            require(len(stage) == p.tp, f"{f}.devices[{i}][{j}]", len(stage),
                    f"must list tp = {p.tp} devices")
    ids = p.device_ids
    require(len(ids) == p.dp * p.pp * p.tp, f"{f}.devices", len(ids),
            f"dp*pp*tp = {p.dp * p.pp * p.tp} devices expected")
    seen: set[int] = set()
    group_devices = set(group.devices) if group is not None else None
    for d in ids:
        require(0 <= d < cluster.num_devices, f"{f}.devices", d,
                f"no such device in cluster {cluster.name!r} (ids 0..{cluster.num_devices - 1})")
        require(d not in seen, f"{f}.devices", d, "device used twice in one task's tasklet slots")
        seen.add(d)
        if group_devices is not None:
            require(d in group_devices, f"{f}.devices", d, "device is not in the task's group")
    require(len(p.layers_per_stage) == p.pp, f"{f}.layers_per_stage", list(p.layers_per_stage),
            f"must list pp = {p.pp} stages")
    for j, n in enumerate(p.layers_per_stage):
        require(is_int(n) and n >= 1, f"{f}.layers_per_stage[{j}]", n,
                "must be an integer >= 1 (not a boolean)")
    require(sum(p.layers_per_stage) == model.layers, f"{f}.layers_per_stage",
            list(p.layers_per_stage), f"must sum to {model.name}'s {model.layers} layers")
    require(len(p.data_weights) == p.dp, f"{f}.data_weights", list(p.data_weights),
            f"must list dp = {p.dp} weights")
    for i, w in enumerate(p.data_weights):
        require(math.isfinite(w) and w > 0, f"{f}.data_weights[{i}]", w, "must be finite and > 0")
    total = sum(p.data_weights)
    require(math.isfinite(total), f"{f}.data_weights", list(p.data_weights),
            "must have a finite sum (each replica's share is its weight over the sum)")


# --- constructors -------------------------------------------------------------------------------

def even_layers(layers: int, pp: int) -> tuple[int, ...]:
    """``layers`` split over ``pp`` stages as evenly as possible (earlier stages get the extra)."""
    base, extra = divmod(layers, pp)
    return (base + 1,) * extra + (base,) * (pp - extra)


def fp8_lacking(p: TaskPlacement, workload: WorkloadSpec, cluster: ClusterSpec
                ) -> tuple[int, str] | None:
    """Where a task in FP8 runs on a GPU without FP8 tensor cores: (its first such device, why),
    naming the task, the workload key that puts it in FP8, the device and its type; None where
    the task is not in FP8 or every device has the units (devices outside the cluster are
    :func:`validate_placement`'s to name)."""
    if not workload.fp8_for(workload.task(p.task).kind):
        return None
    for d in p.device_ids:
        if 0 <= d < cluster.num_devices and not cluster.devices[d].gpu.has_fp8:
            generation = workload.task(p.task).kind == "generation"
            key = "gen_precision" if generation and workload.gen_precision == "fp8" \
                else "precision"
            return d, (f"{p.task} runs in FP8 ({key}: fp8) but device {d} is a "
                       f"{cluster.devices[d].gpu.name}, which has no FP8 tensor cores "
                       "(fp8_tflops 0 in the GPU table)")
    return None


def make_placement(task: str, devices: Sequence[int], dp: int, pp: int, tp: int, layers: int,
                   data_weights: Sequence[float] | None = None,
                   layers_per_stage: Sequence[int] | None = None, backend: str = "megatron",
                   offload: bool = False, ep: int = 1) -> TaskPlacement:
    """Lay ``devices`` out replica-major, stage, then tp rank (tp innermost, so a tp group takes
    consecutive devices, usually inside one node)."""
    require(len(devices) == dp * pp * tp, "devices", len(devices),
            f"need dp*pp*tp = {dp * pp * tp} devices")
    devs = tuple(devices)
    stages = [devs[k:k + tp] for k in range(0, dp * pp * tp, tp)]
    grid = tuple([tuple(stages[r:r + pp]) for r in range(0, dp * pp, pp)])
    return TaskPlacement(
        task=task, dp=dp, pp=pp, tp=tp, devices=grid,
        layers_per_stage=tuple(layers_per_stage) if layers_per_stage else even_layers(layers, pp),
        data_weights=tuple(float(w) for w in data_weights) if data_weights else (1.0,) * dp,
        backend=backend, offload=offload, ep=ep,
    )


def colocated_plan(workload: WorkloadSpec, cluster: ClusterSpec, tp: int = 1, pp: int = 1,
                   dp: int | None = None, devices: Sequence[int] | None = None,
                   scheduler: str = "colocate", ep: int = 1) -> Plan:
    """All tasks in one group on ``devices`` (default: all), every task with the same layout.

    ``dp`` defaults to len(devices) / (tp * pp). ``ep``: the expert parallelism of every task
    whose model has experts (dense models' tasks keep 1).
    """
    ids = list(devices) if devices is not None else list(range(cluster.num_devices))
    if dp is None:
        require(len(ids) % (tp * pp) == 0, "tp*pp", tp * pp,
                f"must divide the {len(ids)} devices")
        dp = len(ids) // (tp * pp)
    require(dp * pp * tp == len(ids), "dp*pp*tp", dp * pp * tp,
            f"must equal the {len(ids)} devices of the group")
    placements = []
    for t in workload.tasks:
        model = workload.model(t.role)
        validate_layout(model, tp, pp, f"placements[{t.name}]")
        task_ep = ep if model.moe is not None else 1
        validate_expert_parallel(model, task_ep, dp, f"placements[{t.name}]")
        placements.append(make_placement(t.name, ids, dp, pp, tp, model.layers, ep=task_ep))
    plan = Plan((TaskGroup(workload.task_names, tuple(ids)),), tuple(placements),
                Provenance(scheduler=scheduler), made_for=made_for(workload, cluster))
    validate(plan, workload, cluster)
    return plan


def unbalanced(plan: Plan, workload: WorkloadSpec, cluster: ClusterSpec) -> Plan:
    """``plan`` without its load balancing: every placement's replicas take equal data shares and
    its layers are split evenly over its stages (:func:`even_layers`); groups, layouts and the
    tasklet-to-device map are unchanged. The load-balancing ablation compares a balanced plan
    with this one (fig4). Validated against ``workload`` and ``cluster``."""
    placements = []
    for p in plan.placements:
        layers = workload.model(workload.task(p.task).role).layers
        placements.append(replace(p, layers_per_stage=even_layers(layers, p.pp),
                                  data_weights=(1.0,) * p.dp))
    even = "even data shares and layer splits"
    note = plan.provenance.note if even in plan.provenance.note else "; ".join(
        filter(None, (plan.provenance.note, even)))
    out = replace(plan, placements=tuple(placements), provenance=replace(plan.provenance, note=note))
    validate(out, workload, cluster)
    return out
