"""The cost model's fast paths equal their plain definitions: the symmetric cluster memo, the
closed-form generation drain, one generation replica priced per class, and memoised vs fresh
estimates (the compiled kernels: test_kernels.py)."""

from __future__ import annotations

import numpy as np
import pytest

from hetrl.cost.flops import stage_shapes
from hetrl.cost.lengths import length_stats
from hetrl.cost.model import CostModel
from hetrl.cost.params import DEFAULT_PARAMS
from hetrl.cost.primitives import (
    _canonical,
    _group_links,
    _rename,
    all_reduce_time,
    group_links,
    node_symmetry,
)
from hetrl.cost.replica import _replica_hw, replica_hw
from hetrl.cost.tasks import _drain, generation_engine
from hetrl.plan import Plan, TaskGroup, make_placement
from hetrl.spec.presets import cluster_preset, workload_preset


@pytest.fixture(scope="module")
def paper64():
    return cluster_preset("paper64-multi-country")


def _random_replica(rng, n_devices: int) -> tuple[tuple[int, ...], ...]:
    tp, pp = int(rng.choice([1, 2, 4, 8])), int(rng.choice([1, 2, 3]))
    devs = [int(d) for d in rng.permutation(n_devices)[:tp * pp]]
    return tuple(tuple(devs[j * tp:(j + 1) * tp]) for j in range(pp))


def test_symmetric_memo_matches_direct(paper64):
    assert node_symmetry(paper64) is not None  # nodes of interchangeable devices
    rng = np.random.default_rng(3)
    for _ in range(300):
        replica = _random_replica(rng, paper64.num_devices)
        assert replica_hw(paper64, replica) == _replica_hw(paper64, replica)
        for stage in replica:
            assert group_links(paper64, stage) == _group_links(paper64, stage)


def test_devices_renamed_within_nodes_share_one_answer(paper64):
    # devices 24..31 are one L40S node: a replica on 24..27 and one on 31, 29, 30, 28 (the same
    # node, other devices) have the same hardware, so the memo answers with the same object
    a = replica_hw(paper64, ((24, 25, 26, 27),))
    b = replica_hw(paper64, ((31, 29, 30, 28),))
    assert a is b


def test_canonical_renaming_equals_the_general_one(paper64):
    # the flat pass for a device set or grid gives the recursive renaming's key, and keys with
    # a repeated device (which must keep one name) take the general path
    node_of, members = node_symmetry(paper64)
    rng = np.random.default_rng(5)
    for _ in range(3000):
        replica = _random_replica(rng, paper64.num_devices)
        devices = tuple(int(d) for d in rng.integers(0, paper64.num_devices, rng.integers(1, 9)))
        for key in ((replica,), (replica[0],), (devices,), ((devices, devices[::-1]),)):
            assert _canonical(key, node_of, members) == _rename(key, node_of, members, {}, {})


def test_replica_hardware_by_node_sequence_equals_per_replica(paper64):
    # the node-sequence memo answers every replica as the per-replica (renaming) memo does,
    # with the very same objects; a grid with a repeated device takes the per-replica path
    wl = workload_preset("qwen3-8b-ppo-sync")
    cm = CostModel(wl, paper64)
    rng = np.random.default_rng(9)
    for trial in range(300):
        tp, pp = int(rng.choice([1, 2, 4])), int(rng.choice([1, 2, 3]))
        dp = int(rng.integers(1, 64 // (tp * pp) + 1))
        devs = [int(d) for d in rng.permutation(paper64.num_devices)[:dp * pp * tp]]
        if trial % 7 == 0 and len(devs) > 1:
            devs[-1] = devs[0]  # a repeated device (an invalid plan, estimated unchecked)
        p = make_placement("actor_training", devs, dp, pp, tp, 36)
        got = list(cm.replica_hws(p))
        want = [cm.hw(replica) for replica in p.devices]
        assert all(a is b for a, b in zip(got, want, strict=True))
        assert got == [_replica_hw(paper64, replica) for replica in p.devices]


def _stepwise_drain(shapes, hw, m, L, params):
    """The drain as a step-by-step sum (the definition in docs/cost-model.md)."""
    h, bpv = shapes[0].model.hidden, shapes[0].bytes_per_value
    link_eff = params.efficiency(hw.stages[0].gpu, "link")
    weight = L.prob_any_alive(m)
    batch = m * L.survival / np.maximum(weight, 1e-300)
    comp = mem = tp = pp = 0.0
    for k, w in enumerate(weight.tolist()):
        b, ctx = float(batch[k]), float(L.ctx[k])
        for s, st in zip(shapes, hw.stages, strict=True):
            hb = (s.weight_bytes + b * ctx * s.kv_bytes_per_token) / (
                st.hbm_Bps * params.efficiency(st.gpu, "decode_hbm"))
            fl = b * (s.matmul_flops_per_token + s.attn_flops_per_token_ctx * ctx) / (
                st.flops * params.efficiency(st.gpu, "decode_flops"))
            comp += w * (fl if fl >= hb else 0.0)
            mem += w * (0.0 if fl >= hb else hb)
            tp += w * 2 * s.layers * all_reduce_time(b * h * bpv, st.tp,
                                                     params.efficiency(st.gpu, "link"))
        for lat, bw in hw.boundaries:
            pp += w * (lat + b * h * bpv / (bw * link_eff))
    return comp, mem, tp, pp, float(weight.sum())


@pytest.mark.parametrize("m", [0.5, 3.0, 37.3, 200.0])
def test_closed_form_drain_equals_stepwise_sum(paper64, m):
    wl = workload_preset("qwen3-8b-ppo-sync")
    L = length_stats(wl)
    rng = np.random.default_rng(int(m * 10))
    for _ in range(4):
        replica = _random_replica(rng, paper64.num_devices)
        layers = [36 // len(replica)] * len(replica)
        layers[-1] += 36 - sum(layers)
        shapes = stage_shapes(wl.model("actor"), tuple(layers), len(replica[0]), True,
                              wl.bytes_per_value)
        hw = replica_hw(paper64, replica)
        got = _drain(shapes, hw, m, L, DEFAULT_PARAMS)
        want = _stepwise_drain(shapes, hw, m, L, DEFAULT_PARAMS)
        assert got == pytest.approx(want, rel=1e-12, abs=0.0)


def test_fresh_and_shared_models_agree(paper64):
    wl = workload_preset("qwen3-8b-ppo-sync")
    a100, gen = list(range(24)), list(range(24, 64))
    inference = ("reward_inference", "reference_inference", "critic_inference")
    training = ("actor_training", "critic_training")
    rng = np.random.default_rng(11)
    shared = CostModel(wl, paper64)
    for _ in range(6):
        def w(dp):
            return [float(x) for x in rng.uniform(0.5, 1.5, dp)]
        g, i, t = ([int(d) for d in rng.permutation(x)] for x in (gen, a100[:8], a100[8:]))
        placements = [make_placement("actor_generation", g, 10, 1, 4, 36, data_weights=w(10))]
        placements += [make_placement(x, i, 2, 1, 4, 36, data_weights=w(2)) for x in inference]
        placements += [make_placement(x, t, 2, 2, 4, 36, data_weights=w(2)) for x in training]
        plan = Plan((TaskGroup(("actor_generation",), tuple(gen)),
                     TaskGroup(inference, tuple(a100[:8])), TaskGroup(training, tuple(a100[8:]))),
                    tuple(placements))
        assert CostModel(wl, paper64).estimate(plan).to_dict() == shared.estimate_uncached(plan).to_dict()


def test_makespan_replay_equals_merging():
    from hetrl.cost.workflow import stage_makespan

    rng = np.random.default_rng(5)
    memo: dict = {}
    for _ in range(200):
        names = [f"t{i}" for i in range(int(rng.integers(1, 6)))]
        devices = {n: frozenset(int(d) for d in rng.choice(8, int(rng.integers(1, 4)),
                                                          replace=False)) for n in names}
        for _ in range(3):  # the same device sets with new times: replayed from the memo
            seconds = {n: float(rng.uniform(0.1, 10.0)) for n in names}
            assert (stage_makespan(names, seconds, devices, None, memo)
                    == stage_makespan(names, seconds, devices, None))


def test_generation_replica_time_rises_with_its_sequences(paper64):
    # the premise of pricing one replica per (hardware, KV budget): for a given engine and
    # budget, more sequences never take less time (prefill chunks, saturated steps, drain)
    wl = workload_preset("qwen3-8b-ppo-sync")
    L = length_stats(wl)
    rng = np.random.default_rng(13)
    for tp, pp in ((1, 1), (2, 1), (4, 1), (2, 2)):
        replica = _random_replica(rng, paper64.num_devices)
        devs = [d for stage in replica for d in stage][:tp * pp]
        replica = tuple(tuple(devs[j * tp:(j + 1) * tp]) for j in range(pp))
        if len(devs) < tp * pp:
            continue
        hw = replica_hw(paper64, replica)
        total = wl.model("actor").layers
        layers = (total - (pp - 1) * (total // pp),) + (total // pp,) * (pp - 1)
        shapes = stage_shapes(wl.model("actor"), layers, tp, True, wl.bytes_per_value)
        for budget_gb in (4.0, 20.0, 60.0):
            budget = (budget_gb * 1e9,) * pp
            engine = generation_engine(shapes, hw, L, DEFAULT_PARAMS)
            ns = np.sort(rng.uniform(0.5, 900.0, 60))
            times = [engine.replica(float(n), budget, wl.gen_max_concurrency).seconds for n in ns]
            assert all(b >= a for a, b in zip(times, times[1:], strict=False)), (tp, pp, budget_gb)


def test_generation_prices_the_slowest_replica(paper64):
    # pricing one replica per class gives the task time (and parts) of pricing every replica
    wl = workload_preset("qwen3-8b-ppo-sync")
    gen = list(range(24, 64))
    rng = np.random.default_rng(17)
    for _ in range(20):
        devices = [int(d) for d in rng.permutation(gen)] if rng.random() < 0.5 else gen
        weights = [float(x) for x in rng.uniform(0.5, 1.5, 10)]
        p = make_placement("actor_generation", devices, 10, 1, 4, 36, data_weights=weights)
        model = CostModel(wl, paper64)
        budget = np.where(np.isin(np.arange(64), devices), 30e9, 0.0)
        got = model.generation_cost(p, budget)
        shapes = model.shapes(p.task, p)
        each = [generation_engine(shapes, model.hw(r), model.L, DEFAULT_PARAMS).replica(
            wl.samples * s, (30e9,), wl.gen_max_concurrency, wl.samples)
            for s, r in zip(p.data_shares, p.devices, strict=True)]
        slowest = max(each, key=lambda rc: rc.seconds)  # the first of equals, as the model
        # (the task adds its framework cost per call to the slowest replica's)
        fw = model.framework_seconds("generation")
        assert got.seconds == slowest.seconds + fw
        assert got.parts == {**slowest.parts, "framework": fw}
        assert model.generation_cost(p, budget) is got  # memoised per (placement, KV budgets)


def test_budgets_allowing_the_same_concurrency_share_one_price(paper64):
    # a generation replica's price depends on its KV budget only through the concurrency (and
    # the violations) the budget allows: the memo keyed by those gives a fresh engine's answer
    wl = workload_preset("qwen3-8b-ppo-sync")
    L = length_stats(wl)
    shapes = stage_shapes(wl.model("actor"), (36,), 2, True, wl.bytes_per_value)
    hw = replica_hw(paper64, ((0, 1),))
    engine = generation_engine(shapes, hw, L, DEFAULT_PARAMS)
    rng = np.random.default_rng(19)
    for budget_gb in rng.uniform(0.05, 70.0, 40).tolist() + [30.0, 30.0001, 0.0]:
        n = float(rng.choice([64.0, 307.2, 3072.0]))
        got = engine.replica(n, (budget_gb * 1e9,), wl.gen_max_concurrency)
        fresh = type(engine)(shapes, hw, L, DEFAULT_PARAMS).replica(
            n, (budget_gb * 1e9,), wl.gen_max_concurrency)
        assert (got.seconds, got.parts, got.concurrency, got.violations) == (
            fresh.seconds, fresh.parts, fresh.concurrency, fresh.violations)


def test_lazy_memory_report_pickles_and_reads_like_the_estimate(paper64):
    # peak memory and violation messages are built when first read; an estimate sent to another
    # process (pickled) reads the same, and estimates compare by their numbers
    import pickle

    wl = workload_preset("qwen3-8b-ppo-sync")
    placements = [make_placement(t, list(range(8)), 8, 1, 1, 36) for t in wl.task_names]
    plan = Plan((TaskGroup(tuple(wl.task_names), tuple(range(8))),), tuple(placements))
    est = CostModel(wl, paper64).estimate(plan)
    assert not est.feasible and est.violations[0].startswith("device 0 (A100-80GB): needs ")
    copy = pickle.loads(pickle.dumps(est))
    assert copy == est and copy.to_dict() == est.to_dict()
    assert copy.violations == est.violations and copy.peak_memory_gb == est.peak_memory_gb
    assert list(est.peak_memory_gb) == list(range(8))
