"""Pool-based baselines: the systems HetRL is compared with, each with its own published design.

``verl`` (sync; Sheng et al. 2025, HybridFlow): heterogeneity-unaware. Its placement is either
every task co-located on all GPUs (verl's default hybrid engine) or its split placement (the
actor's tasks on one pool, critic and reward on another). One layout for the training-side tasks
and one rollout layout for generation, uniform data split, even layer split. The layouts and pool
sizes come from a search that believes every GPU is the cluster's most common type and the
network is uniform (one zone); devices are taken in id order. As a verl user tunes a job, the
``k_best`` (default 5) believed-best configurations that fit the real cluster's memory are
measured on it (the true cost model) and the fastest is kept; configurations that do not fit
are skipped (a user would move on from one that does not run).
``verl-async``: generation and everything else in two pools, sized by the same belief.

``streamrl`` (async; Zhong et al. 2025): disaggregated -- generation in one pool, all other tasks
in another, each pool homogeneous (one GPU type) and inside one data centre (a region's zone); it
profiles the real hardware, so pool choice, pool sizes (whole nodes) and layouts are chosen with
the true cost model. Only the two-pool structure restricts it.
"""

from __future__ import annotations

import itertools
from typing import Any

from hetrl.cost.model import CostModel
from hetrl.plan import Plan, TaskGroup, make_placement
from hetrl.search.base import INFEASIBLE_PENALTY_S, Evaluator, Scheduler, register
from hetrl.search.options import NoOptions, VerlOptions
from hetrl.search.space import Layout, layout_key, layouts, placement_fields, with_backends
from hetrl.spec.cluster import ClusterSpec, NodeSpec
from hetrl.spec.workload import WorkloadSpec


def believed_cluster(cluster: ClusterSpec) -> ClusterSpec:
    """The cluster as a heterogeneity-unaware scheduler sees it: same nodes and sizes, every GPU
    of the most common type (ties: the first seen), one region and zone."""
    counts = cluster.gpu_counts()
    common = max(counts, key=lambda g: counts[g])
    nodes = tuple(NodeSpec(n.name, common, n.count, "belief") for n in cluster.nodes)
    return ClusterSpec(f"{cluster.name}-as-{common}", nodes, gpu_types=cluster.gpu_types)


def exact_layouts(workload: WorkloadSpec, task: str, n: int) -> list[Layout]:
    """Layouts of ``task`` using all ``n`` GPUs, FSDP ones included (verl's default training
    backend; see :func:`~hetrl.search.space.with_backends`)."""
    info = workload.task(task)
    model = workload.model(info.role)
    return [x for x in with_backends(info.kind, layouts(model, n), workload.backends, model)
            if x[0] * x[1] * x[2] == n]


def _megatron(options: list[Layout]) -> list[Layout]:
    """The Megatron layouts among ``options`` (all of them if there is none): where the
    baselines' descents start, as they did before the FSDP variants joined the space (expert
    parallelism, an int fourth element, is Megatron's)."""
    return [x for x in options if placement_fields(x)[3] == "megatron"] or options


def _middle(options: list[Layout]) -> Layout:
    return options[len(options) // 2]


def pool_plan(workload: WorkloadSpec, pools: list[tuple[tuple[str, ...], tuple[int, ...]]],
              lay: dict[str, Layout]) -> Plan:
    """Tasks in pools (task names, devices), each task using its pool with layout ``lay``."""
    groups, placements = [], []
    for tasks, devices in pools:
        groups.append(TaskGroup(tasks, devices))
        for t in tasks:
            dp, pp, tp, backend, offload, ep = placement_fields(lay[t])
            placements.append(make_placement(t, devices[: dp * pp * tp], dp, pp, tp,
                                             workload.model(workload.task(t).role).layers,
                                             backend=backend, offload=offload, ep=ep))
    order = {t: i for i, t in enumerate(workload.task_names)}
    placements.sort(key=lambda p: order[p.task])
    return Plan(tuple(groups), tuple(placements))


def verl_pools(workload: WorkloadSpec, n: int, node: int, mode: str) -> list[list[tuple[tuple[str, ...], tuple[int, ...]]]]:
    tasks = workload.task_names
    out = [[(tasks, tuple(range(n)))]] if mode == "sync" else []
    if mode == "sync":
        pool_a = tuple(t for t in tasks if t in ("actor_generation", "actor_training",
                                                 "reference_inference", "actor_inference"))
    else:
        pool_a = ("actor_generation",)
    pool_b = tuple(t for t in tasks if t not in pool_a)
    if not pool_b:  # e.g. GRPO with a rule reward: the split leaves nothing for a second pool
        return out
    for k in range(node, n, node):
        out.append([(pool_a, tuple(range(k))), (pool_b, tuple(range(k, n)))])
    return out


def streamrl_pools(workload: WorkloadSpec, cluster: ClusterSpec
                   ) -> list[tuple[tuple[tuple[str, ...], tuple[int, ...]], ...]]:
    """StreamRL's pool structures: generation on whole nodes of one (GPU type, data centre)
    class, every other task on whole nodes of another class (or of the same class, the rest of
    its nodes), largest pools first (if the budget is short, it goes to the most capable ones).
    A data centre is a (region, zone) pair (docs/baselines.md: each of StreamRL's two stages
    runs on one GPU type inside one data centre; the stages may be in different ones)."""
    classes: dict[tuple[str, str, str], list[tuple[int, ...]]] = {}
    start = 0
    for node in cluster.nodes:
        ids = tuple(range(start, start + node.count))
        start += node.count
        classes.setdefault((node.gpu, node.region, node.zone), []).append(ids)
    gen_tasks = ("actor_generation",)
    rest = tuple(t for t in workload.task_names if t not in gen_tasks)
    candidates = []
    for ca, cb in itertools.product(classes, repeat=2):
        na, nb = classes[ca], classes[cb]
        for ka in range(1, len(na) + 1):
            for kb in range(1, len(nb) + 1):
                if ca == cb and ka + kb > len(na):
                    continue
                gen_nodes = na[:ka]
                rest_nodes = nb[ka:ka + kb] if ca == cb else nb[:kb]
                candidates.append(((gen_tasks, sum(gen_nodes, ())), (rest, sum(rest_nodes, ()))))
    candidates.sort(key=lambda c: -(len(c[0][1]) + len(c[1][1])))
    return candidates


#: verl configures one parallel layout per model: the rollout engine's, the actor's (shared with
#: the reference, as in verl's actor_rollout_ref config), the critic's and the reward model's.
VERL_MODELS = {
    "rollout": ("actor_generation",),
    "actor": ("actor_training", "reference_inference", "actor_inference"),
    "critic": ("critic_inference", "critic_training"),
    "reward": ("reward_inference",),
}


class _VerlBase(Scheduler):
    mode = "sync"
    Options = VerlOptions

    def run(self, ev: Evaluator) -> dict[str, Any]:
        """Coordinate descent over each model's layout, per pool structure, on the believed
        (homogeneous) cluster; believed evaluations count against the budget (up to half of it).
        Then, as a verl user would, the ``k_best`` believed-best configurations that fit in
        the real cluster's memory are measured on it (estimated by the true cost model) and the
        fastest is kept (the evaluator keeps the best it saw)."""
        wl = ev.workload
        belief = believed_cluster(ev.cluster)
        believed = CostModel(wl, belief, self.params)
        node = max(n.count for n in ev.cluster.nodes)
        ranked: dict[Any, tuple[float, Plan]] = {}
        structures = verl_pools(wl, ev.cluster.num_devices, node, self.mode)
        try:  # round robin: every pool structure from one start, then from further starts
            for start in range(64):
                if not any([self._descend(ev, believed, pools, ranked, start)
                            for pools in structures]):
                    break
        except _RankingDone:
            pass
        order = sorted(ranked.values(), key=lambda x: x[0])
        measured = 0
        for _, plan in order:  # the believed-best ones that run on the real cluster
            if measured >= self.options.k_best:
                break
            if ev.evaluate(plan) < INFEASIBLE_PENALTY_S:
                measured += 1
        return {"belief": belief.name, "believed_configurations": len(ranked),
                "measured_configurations": measured}

    def _descend(self, ev: Evaluator, believed: CostModel, pools, ranked, start: int) -> bool:
        """Coordinate descent from the ``start``-th rollout layout; False if there is none."""
        wl = ev.workload
        size = {t: len(devices) for tasks, devices in pools for t in tasks}
        options = {}
        for m, tasks in VERL_MODELS.items():
            present = [t for t in tasks if t in size]
            if not present:
                continue
            common = None
            for t in present:
                lay = set(exact_layouts(wl, t, size[t]))
                common = lay if common is None else common & lay
            options[m] = (present, sorted(common or (), key=layout_key))
        if any(not opts for _, opts in options.values()):
            return False
        # start in the middle of the Megatron layouts, as before FSDP joined them (the FSDP
        # variants, appended, are reached by the descent)
        choice = {m: _middle(_megatron(opts)) for m, (_, opts) in options.items()}
        rollout = options.get("rollout", options.get("actor"))[1]
        if start >= len(rollout):
            return False
        choice["rollout" if "rollout" in options else "actor"] = rollout[start]

        def price(ch: dict[str, Layout]) -> float:
            key = (tuple((tasks, devices) for tasks, devices in pools), tuple(sorted(ch.items())))
            if key in ranked:
                return ranked[key][0]
            if ev.remaining_fraction() < 0.5:
                raise _RankingDone
            ev.evaluations += 1  # a believed evaluation is still an evaluation
            lay = {t: ch[m] for m, (tasks, _) in options.items() for t in tasks}
            plan = pool_plan(wl, pools, lay)
            est = believed.estimate(plan, check=False)
            f = est.iteration_s if est.feasible else float("inf")
            if est.feasible:
                ranked[key] = (f, plan)
            return f

        best = price(choice)
        for _ in range(3):
            improved = False
            for m, (_, opts) in options.items():
                for x in opts:
                    trial = {**choice, m: x}
                    f = price(trial)
                    if f < best:
                        best, choice, improved = f, trial, True
            if not improved:
                break
        return True


class _RankingDone(Exception):
    """The ranking phase used its share of the budget."""


@register
class VerlScheduler(_VerlBase):
    name = "verl"
    description = "verl: co-located or split placement chosen believing the GPUs homogeneous"


@register
class VerlAsyncScheduler(_VerlBase):
    name = "verl-async"
    description = "verl async: generation and training pools sized believing the GPUs homogeneous"
    mode = "async"


@register
class StreamRLScheduler(Scheduler):
    name = "streamrl"
    description = "StreamRL: generation and training in two homogeneous single-region pools"
    Options = NoOptions

    def run(self, ev: Evaluator) -> dict[str, Any]:
        candidates = streamrl_pools(ev.workload, ev.cluster)
        for pools in candidates:
            self._tune(ev, list(pools))
        return {"pool_candidates": len(candidates)}

    def _tune(self, ev: Evaluator, pools) -> None:
        """Coordinate descent over each task's layout with the true cost model (StreamRL profiles
        the hardware it runs on)."""
        wl = ev.workload
        lay: dict[str, Layout] = {}
        for tasks, devices in pools:
            for t in tasks:
                lay[t] = _megatron(exact_layouts(wl, t, len(devices)))[-1]
        best = ev.evaluate(pool_plan(wl, pools, lay))
        for _ in range(2):
            improved = False
            for tasks, devices in pools:
                for t in tasks:
                    for x in exact_layouts(wl, t, len(devices)):
                        if x == lay[t]:
                            continue
                        trial = {**lay, t: x}
                        f = ev.evaluate(pool_plan(wl, pools, trial))
                        if f < best:
                            best, lay, improved = f, trial, True
            if not improved:
                break
