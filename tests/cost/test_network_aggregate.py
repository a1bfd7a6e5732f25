"""The network as links behave (issue 37, item 7): a region pair's aggregate bandwidth beside
its per-flow limit (``RegionLink.aggregate_gbps``), in the cost model and the simulator alike,
and the weight sync's relay (``Plan.sync_relay``: one copy per remote region, then a fan-out
inside it), priced in seconds and egress bytes and chosen by the search."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from hetrl.cost.flows import iteration_flows, region_flows
from hetrl.cost.model import CostModel
from hetrl.cost.money import money
from hetrl.cost.sync import weight_sync_transfers
from hetrl.errors import SpecError
from hetrl.io import load_plan, save_plan
from hetrl.plan import Plan
from hetrl.search.base import Budget, get_scheduler
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.presets import cluster_preset, workload_preset
from sim.engine import Simulation
from sim.network import Network
from tests.cli_helpers import assert_user_error, run
from tests.cost.plans import split_plan

GRPO = "qwen3-8b-grpo-sync"


def _two_regions(aggregate: float | None = None, **link) -> dict:
    """Training on 8 A100 in us-east-1, generation on 8 A100 in eu-west-1 (nodes of 8), one
    link of 40 ms one way and 5 Gbit/s per flow, with ``aggregate`` Gbit/s for the pair (None:
    the key left out)."""
    entry = {"a": "us-east-1", "b": "eu-west-1", "latency_ms": 40, "bandwidth_gbps": 5, **link}
    if aggregate is not None:
        entry["aggregate_gbps"] = aggregate
    return {"name": "two-regions",
            "nodes": [{"name": "us", "gpu": "A100", "count": 8, "region": "us-east-1"},
                      {"name": "eu", "gpu": "A100", "count": 8, "region": "eu-west-1"}],
            "region_links": [entry]}


def _split(workload, cluster) -> Plan:
    """Every task but generation on the 8 GPUs in us-east-1 (tp 4), generation on the 8 in
    eu-west-1 (tp 4, dp 2: two full copies cross the Atlantic each sync)."""
    rest = [t for t in workload.task_names if t != "actor_generation"]
    return split_plan(workload, cluster, [(rest, range(8), 4),
                                          (["actor_generation"], range(8, 16), 4)])


def _sim_sync_s(plan, workload, cluster) -> float:
    sim = Simulation(plan, workload, cluster)
    sim.run(1)
    (span,) = [s for s in sim.spans if s.name == "weight_sync"]
    return span.duration_s


def _cross_sync_bytes(plan, workload, cluster) -> float:
    flows = region_flows(iteration_flows(plan, workload, cluster), cluster)
    return sum(kinds.get("weight sync", 0.0) for kinds in flows.values())


# --- the aggregate ----------------------------------------------------------------------------

def test_a_32_gb_sync_over_a_pair_capped_at_10_gbits_takes_at_least_bytes_over_the_cap():
    wl = workload_preset(GRPO)
    capped = ClusterSpec.from_dict(_two_regions(aggregate=10))
    plan = _split(wl, capped)
    moved = _cross_sync_bytes(plan, wl, capped)
    assert moved >= 32e9  # two copies of Qwen3-8B's 16.4 GB in bf16
    est = CostModel(wl, capped).estimate(plan)
    data_s = est.parts["weight_sync"]["data"]
    assert data_s >= 32e9 * 8 / 10e9 and data_s >= moved * 8 / 10e9
    # without the cap the 16 flows (5 Gbit/s each) take a fraction of that
    free = ClusterSpec.from_dict(_two_regions())
    assert CostModel(wl, free).estimate(plan).parts["weight_sync"]["data"] < data_s / 3
    # the simulator's pair resource agrees within 10%
    sim_s = _sim_sync_s(plan, wl, capped)
    assert sim_s >= 32e9 * 8 / 10e9
    assert sim_s == pytest.approx(est.tasks["weight_sync"], rel=0.10)


def test_without_a_cap_the_numbers_are_those_of_a_cluster_without_the_field():
    """No ``aggregate_gbps`` (absent, or null) is today's network: the same estimate to the
    bit, and a cap far above what the flows reach changes nothing either."""
    wl = workload_preset(GRPO)
    absent = ClusterSpec.from_dict(_two_regions())
    null = ClusterSpec.from_dict(_two_regions(**{"aggregate_gbps": None}))
    assert "aggregate_gbps" not in json.dumps(null.to_dict())
    assert not absent.topology.has_aggregate and not null.topology.has_aggregate
    plan = _split(wl, absent)
    want = CostModel(wl, absent).estimate(plan)
    assert CostModel(wl, null).estimate(plan) == want
    wide = ClusterSpec.from_dict(_two_regions(aggregate=1e5))
    got = CostModel(wl, wide).estimate(plan)
    assert got.iteration_s == want.iteration_s and got.tasks == want.tasks
    assert _sim_sync_s(plan, wl, wide) == _sim_sync_s(plan, wl, absent)


def test_the_cap_bounds_the_rollout_data_too():
    """Rollout data crosses the pair as well: its bound is the bytes over the cap."""
    wl = workload_preset(GRPO)
    tight = ClusterSpec.from_dict(_two_regions(aggregate=5))
    free = ClusterSpec.from_dict(_two_regions())
    plan = _split(wl, free)
    nbytes = sum(f.nbytes for f in iteration_flows(plan, wl, tight)
                 if f.kind == "rollout data" and f.task == "actor_training")
    train = plan.placement("actor_training")
    gen = plan.placement("actor_generation")
    tight_s = CostModel(wl, tight).rollout_transfer_seconds(gen, train)
    assert tight_s >= nbytes * 8 / 5e9
    assert tight_s >= CostModel(wl, free).rollout_transfer_seconds(gen, train)


def test_flows_share_a_capped_pair_max_min_fairly():
    """Four flows of 5 Gbit/s each over a pair capped at 10 Gbit/s: 2.5 Gbit/s each (x the
    link efficiency); the other direction has a capacity of its own."""
    import simpy

    cluster = ClusterSpec.from_dict(_two_regions(aggregate=10))
    env = simpy.Environment()
    net = Network(env, cluster, lambda d: 0.8)
    procs = [net.transfer(a, 8 + a, 1e9) for a in range(4)]
    back = net.transfer(12, 4, 1e9)
    env.run(until=0.05)  # after the 40 ms latency: all five flows running
    rates = sorted(f.rate for f in net.flows)
    assert rates[:4] == pytest.approx([10e9 / 8 * 0.8 / 4] * 4)
    assert rates[4] == pytest.approx(5e9 / 8 * 0.8)  # alone in its direction: per-flow limit
    env.run(simpy.AllOf(env, procs + [back]))
    assert env.now == pytest.approx(net.path_latency(0, 8) + 1e9 / (10e9 / 8 * 0.8 / 4), rel=1e-9)


@pytest.mark.parametrize("value, problem", [
    (0, "must be > 0"), (-10, "must be > 0"), ("10", "must be a number"),
    (True, "must be a number"), (float("inf"), "must be finite"),
    (1e6, "must be <= 100000 Gbit/s"), (2, "must be >= the link's bandwidth_gbps (5 Gbit/s)"),
])
def test_bad_aggregate_values_name_the_field(value, problem):
    with pytest.raises(SpecError) as exc:
        ClusterSpec.from_dict(_two_regions(aggregate=value))
    assert exc.value.field == "region_links[0].aggregate_gbps"
    assert problem in str(exc.value)
    # built in code, the same check
    link = ClusterSpec.from_dict(_two_regions()).region_links[0]
    with pytest.raises(SpecError, match=r"region_links\[0\]\.aggregate_gbps"):
        ClusterSpec("x", ClusterSpec.from_dict(_two_regions()).nodes,
                    region_links=(replace(link, aggregate_gbps=value),))


def test_the_cap_round_trips_and_describe_shows_it(capsys, tmp_path):
    cluster = ClusterSpec.from_dict(_two_regions(aggregate=10))
    assert cluster.region_links[0].aggregate_gbps == 10.0
    assert ClusterSpec.from_dict(cluster.to_dict()) == cluster
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cluster.to_dict()))
    code, out, err = run(capsys, "describe", path)
    assert code == 0, err
    assert "aggregate caps (Gbit/s, each direction): us-east-1<->eu-west-1 10" in out
    code, out, _ = run(capsys, "describe", path, "--json")
    assert json.loads(out)["region_links"][0]["aggregate_gbps"] == 10.0
    code, out, _ = run(capsys, "describe", "paper64-multi-country")
    assert "no aggregate caps" in out  # the shipped AWS matrix has no aggregate data
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_two_regions(aggregate=0)))
    code, _, err = run(capsys, "describe", bad)
    assert_user_error(code, err, "region_links[0].aggregate_gbps = 0", "must be > 0")


def test_a_route_over_two_pairs_uses_both_caps():
    """A region without a direct link is reached through another: both pairs' caps apply."""
    data = {"name": "chain", "nodes": [
        {"name": f"n{i}", "gpu": "A100", "count": 8, "region": r}
        for i, r in enumerate(("r0", "r1", "r2"))],
        "region_links": [{"a": "r0", "b": "r1", "latency_ms": 5, "bandwidth_gbps": 5,
                          "aggregate_gbps": 10},
                         {"a": "r1", "b": "r2", "latency_ms": 5, "bandwidth_gbps": 5,
                          "aggregate_gbps": 20}]}
    topo = ClusterSpec.from_dict(data).topology
    assert topo.pairs_between(0, 16) == [0, 2]  # r0 -> r1, then r1 -> r2
    assert topo.pairs_between(16, 0) == [3, 1]
    assert topo.pairs_between(0, 1) == [] and topo.pairs_between(0, 8) == [0]


# --- the relay --------------------------------------------------------------------------------

def _bench_plan() -> Plan:
    """The cost-model benchmark's plan: generation on the 40 L40S + L4 GPUs (tp 4, dp 10),
    inference on A100 0-7, training on A100 8-23."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
    from bench_cost_model import make_plan

    return make_plan()


def test_relay_moves_one_copy_per_remote_region():
    """On paper64-multi-continent the benchmark plan's generation replicas sit two per node in
    five regions without training: the relay sends one copy into each instead of two, so half
    the weight-sync bytes cross regions, for half the egress dollars of the sync."""
    wl = workload_preset("qwen3-8b-ppo-sync")
    cl = cluster_preset("paper64-multi-continent")
    model = CostModel(wl, cl)
    direct = _bench_plan()
    relay = replace(direct, sync_relay=True)
    d_bytes, r_bytes = _cross_sync_bytes(direct, wl, cl), _cross_sync_bytes(relay, wl, cl)
    assert r_bytes == pytest.approx(d_bytes / 2, rel=1e-12)
    d_money = money(model, direct, model.estimate(direct).iteration_s)
    r_money = money(model, relay, model.estimate(relay).iteration_s)
    assert r_money.bytes_by_kind["weight_sync"] == pytest.approx(r_bytes)
    assert r_money.egress_dollars < d_money.egress_dollars
    # the same bytes arrive: every generation GPU ends with its whole shard
    gen, train = direct.placement("actor_generation"), direct.placement("actor_training")
    shapes = model.shapes(gen.task, gen)
    pulls, fan_out, _ = weight_sync_transfers(gen, shapes, train, cl, model.params, True, True)
    into: dict[int, float] = {}
    for _, d, b in pulls:
        into[d] = into.get(d, 0.0) + b
    for _, d, b in fan_out:
        into[d] = into.get(d, 0.0) + b
    want = {d: s.weight_bytes for r in gen.devices for s, st in zip(shapes, r, strict=True)
            for d in st}
    assert into == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("preset", ["paper64-multi-continent", "paper64-multi-country"])
def test_relay_sync_is_faster_and_the_simulator_agrees(preset):
    wl = workload_preset("qwen3-8b-ppo-sync")
    cl = cluster_preset(preset)
    model = CostModel(wl, cl)
    direct = _bench_plan()
    relay = replace(direct, sync_relay=True)
    d_est, r_est = model.estimate(direct), model.estimate(relay)
    assert r_est.tasks["weight_sync"] < 0.7 * d_est.tasks["weight_sync"]
    assert r_est.iteration_s < d_est.iteration_s
    for plan, est in ((direct, d_est), (relay, r_est)):
        assert _sim_sync_s(plan, wl, cl) == pytest.approx(est.tasks["weight_sync"], rel=0.10)


def test_relay_changes_nothing_where_no_region_holds_a_shard_twice():
    """One generation replica in the remote region: its one copy is the relay's (the plain
    pulls, the same seconds)."""
    wl = workload_preset(GRPO)
    cl = ClusterSpec.from_dict(_two_regions(aggregate=10))
    rest = [t for t in wl.task_names if t != "actor_generation"]
    plan = split_plan(wl, cl, [(rest, range(8), 4), (["actor_generation"], range(8, 16), 8)])
    model = CostModel(wl, cl)
    assert model.estimate(replace(plan, sync_relay=True)).tasks == model.estimate(plan).tasks


def test_relay_under_a_cap_is_bounded_by_one_copy():
    """Capped at 10 Gbit/s, the relay moves one copy (16.4 GB) across instead of two."""
    wl = workload_preset(GRPO)
    cl = ClusterSpec.from_dict(_two_regions(aggregate=10))
    plan = replace(_split(wl, cl), sync_relay=True)
    moved = _cross_sync_bytes(plan, wl, cl)
    assert 16e9 < moved < 17e9
    est = CostModel(wl, cl).estimate(plan)
    assert est.parts["weight_sync"]["data"] >= moved * 8 / 10e9
    direct = CostModel(wl, cl).estimate(replace(plan, sync_relay=False))
    assert est.tasks["weight_sync"] < 0.6 * direct.tasks["weight_sync"]
    assert _sim_sync_s(plan, wl, cl) == pytest.approx(est.tasks["weight_sync"], rel=0.10)


# --- plan files and commands ------------------------------------------------------------------

def test_plans_round_trip_sync_relay(tmp_path):
    plan = replace(_bench_plan(), sync_relay=True)
    data = plan.to_dict()
    assert data["sync_relay"] is True
    assert Plan.from_dict(data) == plan
    plain = replace(plan, sync_relay=False)
    assert "sync_relay" not in plain.to_dict()  # old files, and files written without it
    assert Plan.from_dict(plain.to_dict()).sync_relay is False
    for ext in ("json", "yaml"):
        save_plan(plan, tmp_path / f"p.{ext}")
        assert load_plan(tmp_path / f"p.{ext}") == plan
    with pytest.raises(SpecError) as exc:
        Plan.from_dict({**data, "sync_relay": "yes"})
    assert exc.value.field == "sync_relay"


def test_commands_take_a_relay_plan(capsys, tmp_path):
    wl, cl = "qwen3-8b-ppo-sync", "paper64-multi-continent"
    path = tmp_path / "relay.json"
    save_plan(replace(_bench_plan(), sync_relay=True), path)
    code, out, err = run(capsys, "validate", "-w", wl, "-c", cl, "-p", path)
    assert code == 0 and "weight sync relayed" in out, err
    code, out, err = run(capsys, "estimate", "-w", wl, "-c", cl, "-p", path, "--json")
    assert code == 0, err
    relay_s = json.loads(out)["tasks"]["weight_sync"]
    model = CostModel(workload_preset(wl), cluster_preset(cl))
    assert relay_s == model.estimate(load_plan(path)).tasks["weight_sync"]
    code, out, err = run(capsys, "simulate", "-w", wl, "-c", cl, "-p", path, "-n", "1", "--json")
    assert code == 0, err
    code, out, err = run(capsys, "show", "-w", wl, "-c", cl, "-p", path, "-o",
                         tmp_path / "p.svg", "--json")
    assert code == 0, err
    code, out, err = run(capsys, "export", "--to", "verl", "-w", wl, "-c", cl, "-p", path,
                         "--out", tmp_path / "o.yaml", "--closest-plan", tmp_path / "c.json",
                         "--max-slowdown", "inf")  # (verl's closest plan does not fit here)
    assert code == 0, err
    assert "verl has no relay" in out
    assert load_plan(tmp_path / "c.json").sync_relay is False  # priced without it


# --- the search -------------------------------------------------------------------------------

def test_the_search_finds_and_keeps_the_relay_where_it_helps():
    """GRPO async on paper64-multi-continent: the search puts generation on other continents
    than training, where the relay's one copy per region cuts the sync that bounds the
    iteration; flipping the found plan's relay back makes it slower. Same seed, same plan."""
    wl = workload_preset("qwen3-8b-grpo-async")
    cl = cluster_preset("paper64-multi-continent")
    found = get_scheduler("hetrl").search(wl, cl, Budget(evaluations=300, seed=0))
    assert found.plan.sync_relay is True
    without = CostModel(wl, cl).estimate(replace(found.plan, sync_relay=False))
    assert without.iteration_s > found.estimate.iteration_s * 1.05
    again = get_scheduler("hetrl").search(wl, cl, Budget(evaluations=300, seed=0))
    assert again.plan == found.plan
    # and with p_relay = 0 it never tries it
    off = get_scheduler("hetrl", p_relay=0.0).search(wl, cl, Budget(evaluations=300, seed=0))
    assert off.plan.sync_relay is False


def test_one_region_searches_draw_nothing_for_the_relay():
    """On one region the relay is no gene: the search's draws (and plans) are unchanged by it."""
    wl = workload_preset("qwen3-4b-grpo-sync")
    cl = cluster_preset("paper24-a100-single-region")
    a = get_scheduler("hetrl").search(wl, cl, Budget(evaluations=150, seed=3))
    b = get_scheduler("hetrl", p_relay=0.0).search(wl, cl, Budget(evaluations=150, seed=3))
    assert a.plan == b.plan and a.plan.sync_relay is False
    assert np.isfinite(a.estimate.iteration_s)
