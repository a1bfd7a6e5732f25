"""Plan builders shared by the cost-model tests (plain functions and one hypothesis strategy)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from hetrl.plan import Plan, TaskGroup, make_placement, validate
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec


def split_plan(workload: WorkloadSpec, cluster: ClusterSpec,
               groups: Sequence[tuple[Sequence[str], Sequence[int], int]],
               pp: int = 1) -> Plan:
    """One task group per (tasks, devices, tp): every task of a group uses all of its devices
    with that tp, ``pp`` stages and dp = devices / (tp * pp)."""
    out_groups, placements = [], []
    for tasks, devices, tp in groups:
        out_groups.append(TaskGroup(tuple(tasks), tuple(devices)))
        for t in tasks:
            layers = workload.model(workload.task(t).role).layers
            placements.append(make_placement(t, list(devices), len(devices) // (tp * pp), pp, tp,
                                             layers))
    order = {t: i for i, t in enumerate(workload.task_names)}
    placements.sort(key=lambda p: order[p.task])
    plan = Plan(tuple(out_groups), tuple(placements))
    validate(plan, workload, cluster)
    return plan


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def random_plans(draw, workload: WorkloadSpec, cluster: ClusterSpec) -> Plan:
    """A random valid plan: a random task grouping, random disjoint device sets, per task a
    random (dp, pp, tp) over a subset of its group's devices in a random order, random layer
    splits and data weights."""
    names = list(workload.task_names)
    n_dev = cluster.num_devices
    n_groups = draw(st.integers(1, min(len(names), n_dev)))
    labels = [draw(st.integers(0, n_groups - 1)) for _ in names]
    used = sorted(set(labels))
    devices = draw(st.permutations(range(n_dev)))
    # cut points: each used group gets at least one device
    cuts = sorted(draw(st.lists(st.integers(1, n_dev - 1), min_size=len(used) - 1,
                                max_size=len(used) - 1, unique=True))) if len(used) > 1 else []
    bounds = [0, *cuts, draw(st.integers(cuts[-1] + 1 if cuts else 1, n_dev))]
    groups, placements = [], []
    for gi, label in enumerate(used):
        devs = list(devices[bounds[gi]:bounds[gi + 1]])
        tasks = [t for t, lab in zip(names, labels, strict=True) if lab == label]
        groups.append(TaskGroup(tuple(tasks), tuple(devs)))
        for t in tasks:
            model = workload.model(workload.task(t).role)
            tps = [d for d in _divisors(model.heads) if d <= len(devs)
                   and (model.kv_heads % d == 0 or d % model.kv_heads == 0)]
            tp = draw(st.sampled_from(tps))
            pp = draw(st.integers(1, min(len(devs) // tp, model.layers, 4)))
            dp = draw(st.integers(1, len(devs) // (tp * pp)))
            order = draw(st.permutations(devs))
            cut = sorted(draw(st.lists(st.integers(1, model.layers - 1), min_size=pp - 1,
                                       max_size=pp - 1, unique=True))) if pp > 1 else []
            edges = [0, *cut, model.layers]
            layers = [b - a for a, b in zip(edges, edges[1:], strict=False)]
            weights = [draw(st.sampled_from([1.0, 1.0, 2.0, 0.5, 3.0])) for _ in range(dp)]
            placements.append(make_placement(t, order[:dp * pp * tp], dp, pp, tp, model.layers,
                                             data_weights=weights, layers_per_stage=layers))
    return Plan(tuple(groups), tuple(placements))
