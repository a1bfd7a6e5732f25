"""The ILP (CP-SAT) against brute-force enumeration of its own candidates on tiny instances.

Sync GRPO has four tasks: generation -> {reward, reference inference} -> actor training. Over one
candidate (device set, layout) per task the ILP's objective is, in integer milliseconds,

    gen + Phi(reward, reference) + train + sync

with Phi the sum of the two inference tasks when their device sets overlap (they cannot run at
once) and their max otherwise, and ``sync`` the linearised weight-sync term: zero when generation
and training pick the same devices and layout (weights shared in place), else for every node the
generation uses, the quickest pull of its shard from a node the training uses, maximised over
the generation's nodes. Memory: on every device the chosen candidates' needs (whole MB) must fit
its usable memory (whole MB). The brute force below enumerates every combination with numpy.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hetrl.cost.model import CostModel
from hetrl.plan import validate
from hetrl.search import Budget, get_scheduler
from hetrl.search.ilp import (
    SCALE,
    candidates,
    device_sets,
    node_blocks,
    phased_objective_ms,
    plan_from,
    prune_dominated,
    solve,
    solve_phased,
    solve_staged,
    stages_of,
)
from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink
from hetrl.spec.hardware import GPUType
from hetrl.spec.lengths import LengthDist
from hetrl.spec.model import ModelShape
from hetrl.spec.presets import workload_preset
from hetrl.spec.workload import WorkloadSpec

SMALL = ModelShape("small-190m", layers=8, hidden=1024, ffn=4096, heads=8, kv_heads=4,
                   head_dim=128, vocab=32000)
#: Made-up GPUs with little memory, so that the memory constraint decides some choices: a fast
#: 4 GB one (A100-like compute and bandwidth) and a slow 3 GB one.
FAST_GPU = GPUType("Fast-4GB", bf16_tflops=312, memory_gb=4, hbm_gbps=2000, intra_link="nvlink",
                   intra_link_gbps=300, node_nic_gbps=400)
SLOW_GPU = GPUType("Slow-3GB", bf16_tflops=100, memory_gb=3, hbm_gbps=500)


def tiny_workload() -> WorkloadSpec:
    lengths = LengthDist(mean=256, max=512, min=16, std=64)
    return WorkloadSpec("tiny-grpo", "grpo", "sync",
                        tuple((r, SMALL) for r in ("actor", "reference", "reward")),
                        batch_prompts=64, responses_per_prompt=4, prompt_length=lengths,
                        response_length=lengths)


def tiny_cluster(two_regions: bool) -> ClusterSpec:
    """2 nodes x 2 GPUs: fast and slow GPUs, in one region or in two (20 ms, 1 Gbps)."""
    second = "r2" if two_regions else "r1"
    return ClusterSpec(
        f"tiny-{'two' if two_regions else 'one'}-region",
        (NodeSpec("a", "Fast-4GB", 2, "r1"), NodeSpec("b", "Slow-3GB", 2, second)),
        region_links=(RegionLink("r1", "r2", 20.0, 1.0),) if two_regions else (),
        gpu_types=(FAST_GPU, SLOW_GPU))


def ms(seconds: float) -> int:
    return int(round(seconds * SCALE))


def pull_ms(model: CostModel, gen, src_node: int, dst_node: int) -> int:
    """Milliseconds for ``dst_node``'s generation GPUs to pull their shard from ``src_node``:
    the node's largest shard, first GPU to first GPU (the second GPU inside one node)."""
    topo = model.cluster.topology
    shapes = model.shapes(gen.task, gen.placement)
    nbytes = max(s.weight_bytes for replica in gen.placement.devices
                 for s, stage in zip(shapes, replica, strict=True) for d in stage
                 if topo.node_of[d] == dst_node)
    first = [[d for d in range(model.cluster.num_devices) if topo.node_of[d] == n]
             for n in range(len(model.cluster.nodes))]
    dst = first[dst_node][0]
    src = first[src_node][1] if src_node == dst_node else first[src_node][0]
    eff = model.params.efficiency(model.cluster.devices[dst].gpu.name, "link")
    return ms(topo.latency_s[src, dst] + nbytes / (topo.bandwidth_Bps[src, dst] * eff))


def sync_ms(model: CostModel, gen, train) -> int:
    same = (gen.devices == train.devices
            and gen.placement.layers_per_stage == train.placement.layers_per_stage
            and (gen.placement.dp, gen.placement.pp, gen.placement.tp)
            == (train.placement.dp, train.placement.pp, train.placement.tp))
    if same:
        return 0
    node_of = model.cluster.topology.node_of
    gen_nodes = {int(node_of[d]) for d in gen.devices}
    train_nodes = {int(node_of[d]) for d in train.devices}
    return max(min(pull_ms(model, gen, m, n) for m in train_nodes) for n in gen_nodes)


def brute_force(model: CostModel, cands,
                memory: bool = True) -> tuple[int, tuple[int, int, int, int]]:
    """The minimum objective (ms) over every feasible combination (every combination with
    ``memory=False``), and its indices."""
    gen, rew, ref, train = (cands[t] for t in ("actor_generation", "reward_inference",
                                                "reference_inference", "actor_training"))
    usable = model.cluster.topology.memory_bytes * model.params.usable_memory_fraction
    cap = np.array([int(u // 1e6) for u in usable]) if memory else np.full(len(usable), 10**12)

    def mem(cs):  # whole MB per device, as the ILP counts them
        return np.array([[int(x // 1e6) if x > 0 else 0 for x in c.need] for c in cs])

    m_gen, m_rew, m_ref, m_train = mem(gen), mem(rew), mem(ref), mem(train)
    d_rew = np.array([ms(c.seconds) for c in rew])
    d_ref = np.array([ms(c.seconds) for c in ref])
    overlap = np.array([[bool(set(a.devices) & set(b.devices)) for b in ref] for a in rew])
    phi = np.where(overlap, d_rew[:, None] + d_ref[None, :],
                   np.maximum(d_rew[:, None], d_ref[None, :]))
    best, arg = None, None
    for g, a in itertools.product(range(len(gen)), range(len(train))):
        base = m_gen[g] + m_train[a]
        if np.any(base > cap):
            continue
        total = base[None, None, :] + m_rew[:, None, :] + m_ref[None, :, :]
        ok = np.all(total <= cap, axis=2)
        if not ok.any():
            continue
        inner = np.where(ok, phi, np.iinfo(np.int64).max)
        r, f = np.unravel_index(int(np.argmin(inner)), inner.shape)
        value = (ms(gen[g].seconds) + int(inner[r, f]) + ms(train[a].seconds)
                 + sync_ms(model, gen[g], train[a]))
        if best is None or value < best:
            best, arg = value, (g, int(r), int(f), a)
    assert best is not None
    return best, arg


def test_node_blocks_and_device_sets():
    cl = tiny_cluster(False)
    assert node_blocks(cl) == [[(0, 1), (0,), (1,)], [(2, 3), (2,), (3,)]]
    sets = device_sets(cl)
    assert len(sets) == 4 * 4 - 1  # per node: nothing, both, or one of two GPUs
    assert len(set(sets)) == len(sets)


@pytest.mark.parametrize("preset", ["hetero8-two-region", "hetero16-two-region"])
def test_symmetric_device_sets_are_priced_once_and_renamed_exactly(preset, monkeypatch):
    from hetrl.search import ilp
    from hetrl.spec.presets import cluster_preset

    cl = cluster_preset(preset)
    wl = workload_preset("qwen3-4b-grpo-sync")
    priced = []
    alone = CostModel.task_alone
    monkeypatch.setattr(CostModel, "task_alone",
                        lambda self, p: priced.append(p) or alone(self, p))
    reused = ilp.candidates(CostModel(wl, cl))
    n_reused = len(priced)
    fresh = ilp.candidates(CostModel(wl, cl), reuse_symmetric=False)
    assert n_reused < len(priced) - n_reused  # fewer pricings
    for task in fresh:  # the same candidates, in the same order, bit for bit
        assert len(reused[task]) == len(fresh[task])
        for a, b in zip(reused[task], fresh[task], strict=True):
            assert a.devices == b.devices and a.placement == b.placement
            assert a.seconds == b.seconds and np.array_equal(a.need, b.need)


def test_device_sets_are_all_priced_without_node_symmetry(monkeypatch):
    from hetrl.search import ilp

    cl, wl = tiny_cluster(False), tiny_workload()
    priced = []
    alone = CostModel.task_alone
    monkeypatch.setattr(CostModel, "task_alone",
                        lambda self, p: priced.append(p) or alone(self, p))
    ilp.candidates(CostModel(wl, cl))
    symmetric = len(priced)  # the tiny nodes' GPUs are interchangeable
    priced.clear()
    ilp.candidates(CostModel(wl, cl), reuse_symmetric=False)
    every_set = len(priced)
    priced.clear()
    monkeypatch.setattr(ilp.data, "node_symmetry", lambda cluster: None)
    ilp.candidates(CostModel(wl, cl))
    assert symmetric < every_set == len(priced)


@pytest.mark.parametrize("two_regions", [False, True])
def test_ilp_optimum_equals_brute_force(two_regions):
    wl, cl = tiny_workload(), tiny_cluster(two_regions)
    model = CostModel(wl, cl)
    cands = candidates(model)
    assert all(len(cs) > 10 for cs in cands.values())
    out = solve(model, cands, time_limit_s=60, deterministic_time=None, seed=0, workers=1)
    assert out["status"] == "OPTIMAL"
    assert out["bound_s"] == pytest.approx(out["objective_s"], abs=1e-9)
    best, arg = brute_force(model, cands)
    assert round(out["objective_s"] * SCALE) == best
    # The ILP's own choice scores its objective under the brute-force formula too.
    chosen = out["chosen"]
    index = {t: cands[t].index(chosen[t]) for t in cands}
    value = (ms(chosen["actor_generation"].seconds) + ms(chosen["actor_training"].seconds)
             + sync_ms(model, chosen["actor_generation"], chosen["actor_training"]))
    rew, ref = chosen["reward_inference"], chosen["reference_inference"]
    if set(rew.devices) & set(ref.devices):
        value += ms(rew.seconds) + ms(ref.seconds)
    else:
        value += max(ms(rew.seconds), ms(ref.seconds))
    assert value == best, (index, arg)
    plan = plan_from(wl, chosen)
    validate(plan, wl, cl)


@pytest.mark.parametrize("two_regions", [False, True])
def test_memory_binds_on_the_tiny_instance(two_regions):
    """Without the memory constraint a faster (infeasible) combination exists, so the brute force
    above really checks the ILP's memory constraint."""
    model = CostModel(tiny_workload(), tiny_cluster(two_regions))
    cands = candidates(model)
    with_memory, _ = brute_force(model, cands)
    without, _ = brute_force(model, cands, memory=False)
    assert without < with_memory


def test_ilp_accepts_a_hint_and_the_scheduler_reports_optimality():
    wl, cl = tiny_workload(), tiny_cluster(True)
    model = CostModel(wl, cl)
    cands = candidates(model)
    first = solve(model, cands, 60, None, 0, 1)
    hint = plan_from(wl, first["chosen"])
    again = solve(model, cands, 60, None, 0, 1, hint=hint)
    assert again["status"] == "OPTIMAL"
    assert again["objective_s"] == pytest.approx(first["objective_s"])
    # Through the scheduler (hint as an option), with a wall-clock budget.
    result = get_scheduler("ilp", hint=hint).search(wl, cl, Budget(seconds=30, seed=0))
    assert result.extra["ilp_status"] == "OPTIMAL"
    assert result.extra["ilp_gap"] == pytest.approx(0.0, abs=1e-9)
    assert result.extra["ilp_objective_s"] == pytest.approx(first["objective_s"])
    validate(result.plan, wl, cl)
    assert result.estimate.feasible
    # The full cost model prices the ILP's plan close to the ILP's own (linearised) objective
    # here (one-node pulls), once the rollout engine's sleep/wake and the sync's per-call
    # overhead, which the ILP's objective leaves out, are taken off.
    ws = result.estimate.parts["weight_sync"]
    assert result.estimate.iteration_s - ws["overhead"] == pytest.approx(first["objective_s"],
                                                                         rel=0.1)


def test_ilp_without_a_solution_falls_back_to_a_valid_plan(small_workload, small_cluster):
    """A deterministic solver budget too small to find a solution: the greedy fallback plan."""
    result = get_scheduler("ilp").search(small_workload, small_cluster,
                                         Budget(evaluations=1, seed=0))
    assert "greedy fallback" in result.extra["ilp_status"] or result.extra["ilp_status"] in (
        "OPTIMAL", "FEASIBLE")
    validate(result.plan, small_workload, small_cluster)
    assert result.estimate.feasible


@pytest.mark.parametrize("two_regions", [False, True])
def test_ilp_fallback_plan_fits_in_memory(two_regions):
    """With a solver budget too small to find a solution (5 ms of deterministic time) the ILP
    returns a greedy plan; on GPUs this small, putting every task on every GPU does not fit, so
    the fallback must respect memory too."""
    wl, cl = tiny_workload(), tiny_cluster(two_regions)
    result = get_scheduler("ilp", phased=False).search(wl, cl, Budget(evaluations=1, seed=0))
    assert "greedy fallback" in result.extra["ilp_status"]
    assert result.extra["ilp_method"] == "monolithic"
    assert result.estimate.feasible
    validate(result.plan, wl, cl)
    # The phased solve (the default for sync GRPO) proves the optimum within 100 ms of
    # deterministic time.
    phased = get_scheduler("ilp").search(wl, cl, Budget(evaluations=20, seed=0))
    assert phased.extra["ilp_method"] == "phased"
    assert phased.extra["ilp_status"] == "OPTIMAL"
    assert phased.estimate.feasible


@pytest.mark.parametrize("two_regions", [False, True])
def test_phased_solve_equals_brute_force(two_regions):
    """One model per sharing pattern of the inference stage: the same optimum as the brute
    force, and its choice scores that optimum under the stage formula."""
    wl, cl = tiny_workload(), tiny_cluster(two_regions)
    model = CostModel(wl, cl)
    cands = candidates(model)
    stages = stages_of(wl)
    assert stages == (("actor_generation",), ("reward_inference", "reference_inference"),
                      ("actor_training",))
    out = solve_phased(model, cands, stages, 60, None, 0, 1)
    best, _ = brute_force(model, cands)
    assert out["status"] == "OPTIMAL"
    assert out["patterns"] == 2
    assert round(out["objective_s"] * SCALE) == best == round(out["bound_s"] * SCALE)
    assert phased_objective_ms(model, out["chosen"], stages) == best
    validate(plan_from(wl, out["chosen"]), wl, cl)


def tiny_ppo() -> WorkloadSpec:
    lengths = LengthDist(mean=256, max=512, min=16, std=64)
    return WorkloadSpec("tiny-ppo", "ppo", "sync",
                        tuple((r, SMALL) for r in ("actor", "critic", "reference", "reward")),
                        batch_prompts=64, responses_per_prompt=2, prompt_length=lengths,
                        response_length=lengths)


def test_phased_solve_equals_the_monolithic_model_on_ppo():
    """PPO: three inference tasks (8 sharing patterns) and two training tasks (2), so 16
    models; both exact solves agree on the optimum."""
    wl, cl = tiny_ppo(), tiny_cluster(True)
    model = CostModel(wl, cl)
    cands = prune_dominated(candidates(model))
    stages = stages_of(wl)
    assert [len(s) for s in stages] == [1, 3, 2]
    whole = solve(model, cands, 120, None, 0, 1)
    phased = solve_phased(model, cands, stages, 120, None, 0, 1)
    assert whole["status"] == phased["status"] == "OPTIMAL"
    assert phased["patterns"] == 16
    assert phased["objective_s"] == pytest.approx(whole["objective_s"], abs=1e-9)
    assert phased_objective_ms(model, phased["chosen"], stages) == round(
        phased["objective_s"] * SCALE)


def test_stages_of_needs_barriers_and_sync_mode():
    assert stages_of(workload_preset("qwen3-8b-ppo-sync")) == (
        ("actor_generation",),
        ("reward_inference", "reference_inference", "critic_inference"),
        ("actor_training", "critic_training"))
    assert stages_of(workload_preset("qwen3-8b-ppo-async")) is None


def test_staged_solve_hands_an_open_phased_solve_to_the_monolithic_model():
    """With no time for the phased models (share 0) only the greedy incumbent and the patterns'
    first bounds come out of them; the monolithic model then proves the same optimum, and the
    merged result keeps a bound no higher than its objective."""
    wl, cl = tiny_ppo(), tiny_cluster(True)
    model = CostModel(wl, cl)
    cands = prune_dominated(candidates(model))
    stages = stages_of(wl)
    whole = solve(model, cands, 120, None, 0, 1)
    opened = solve_phased(model, cands, stages, 0.0, None, 0, 1, kicks=0)
    assert opened["status"] == "FEASIBLE" and opened["incumbent"] == "hint or greedy"
    assert opened["bound_s"] <= whole["objective_s"] <= opened["objective_s"]
    staged = solve_staged(model, cands, stages, 120, None, 0, 1, phased_share=0.0)
    assert staged["status"] == "OPTIMAL"
    assert staged["objective_s"] == pytest.approx(whole["objective_s"], abs=1e-9)
    assert staged["bound_s"] == pytest.approx(staged["objective_s"], abs=1e-9)


def test_phased_solve_says_infeasible_when_no_plan_fits():
    """Two 3 GB GPUs: every (Megatron) task fits alone, no plan fits whole (enumerated); the phased solve
    proves that (every pattern settled above the longest possible plan) as the monolithic model
    does."""
    from hetrl.search.ilp.model import NoSolution, fits

    wl = tiny_workload()
    cl = ClusterSpec("tiny-slow", (NodeSpec("b", "Slow-3GB", 2, "r1"),),
                     gpu_types=(FAST_GPU, SLOW_GPU))
    model = CostModel(wl, cl)
    # Megatron layouts only: sharded FSDP ones (with offload) make a plan fit on these GPUs
    cands = {t: [c for c in cs if c.placement.backend == "megatron"]
             for t, cs in candidates(model).items()}
    assert all(cands.values())
    assert not any(fits(model, dict(zip(cands, combo, strict=True)))
                   for combo in itertools.product(*cands.values()))
    with pytest.raises(NoSolution, match="INFEASIBLE"):
        solve_phased(model, cands, stages_of(wl), 30, None, 0, 1)
    with pytest.raises(NoSolution, match="INFEASIBLE"):
        solve(model, cands, 30, None, 0, 1)
