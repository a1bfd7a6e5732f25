"""The simulator cannot livelock (issue 28): a transfer shorter than the clock's resolution
completes, a run that would pass the horizon (1e9 s) stops with one error naming the link,
device or fault, and extreme fault values are refused when the scenario is read."""

from __future__ import annotations

import pytest

from hetrl.errors import SpecError
from hetrl.plan import colocated_plan
from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink
from sim import engine, simulate
from sim.engine import Simulation
from sim.faults import FaultScenario
from sim.guards import HORIZON_S, SimulationLimitError, below_resolution, check_horizon
from tests.sim.test_faults import WL, split_plan
from tests.sim.tiny import two_nodes

REGIONS = ("r0", "r1")


def degraded(factor: float) -> FaultScenario:
    return FaultScenario.from_dict({"events": [
        {"at_s": 0, "kind": "link_degraded", "regions": ["r0", "r1"],
         "bandwidth_factor": factor}]}, 4, REGIONS)


def test_below_resolution_and_horizon_by_hand():
    assert below_resolution(1e8, 1e-9) and not below_resolution(1e8, 1e-7)  # ulp(1e8) = 1.5e-8
    assert not below_resolution(0.0, 1e-300)
    check_horizon(0.0, HORIZON_S, "a step")  # exactly at the horizon: allowed
    for seconds in (HORIZON_S * 1.01, float("inf"), float("nan")):
        with pytest.raises(SimulationLimitError, match="a step needs .* past the simulator's "
                                                       "horizon of 1e\\+09 s"):
            check_horizon(0.0, seconds, "a step")


def test_a_link_degraded_a_billionfold_finishes():
    """Simulated time reaches 4e7 s, where transfers of the other flows end below the clock's
    resolution: before the guard this spun forever."""
    cluster = two_nodes(gpus=2, region_b="r1", link_ms=10.0, link_gbps=0.8)
    r = simulate(split_plan(cluster), WL, cluster, 3, faults=degraded(1e-9))
    assert r.metrics["completed_iterations"] == 3
    assert 4e7 < r.trace.iterations[-1][1] < HORIZON_S
    assert all(s > 1e7 for s in r.metrics["iterations"])


@pytest.mark.parametrize("factor", [1e-12, 1e-300])
def test_a_link_too_slow_for_the_horizon_names_the_link_and_the_fault(factor):
    cluster = two_nodes(gpus=2, region_b="r1", link_ms=10.0, link_gbps=0.8)
    with pytest.raises(SimulationLimitError) as info:
        simulate(split_plan(cluster), WL, cluster, 3, faults=degraded(factor))
    msg = str(info.value)
    assert "(a, r0)" in msg and "(b, r1)" in msg and "B/s" in msg
    assert f"link_degraded r0/r1 bandwidth_factor {factor:g}" in msg
    assert "horizon of 1e+09 s" in msg


def test_a_region_link_of_1e_300_gbps_names_the_link():
    nodes = (NodeSpec("a", "A100-80GB", 2, "r0"), NodeSpec("b", "A100-80GB", 2, "r1"))
    cluster = ClusterSpec("crawl", nodes, (RegionLink("r0", "r1", 10.0, 1e-300),))
    with pytest.raises(SimulationLimitError, match=r"from device \d \((a|b), r[01]\) to device "
                                                   r"\d \((a|b), r[01]\)"):
        simulate(split_plan(cluster), WL, cluster, 2)


def test_a_step_that_jumps_past_the_horizon_names_the_straggler():
    cluster = two_nodes(gpus=1)
    sim = Simulation(colocated_plan(WL, cluster), WL, cluster)
    sim.slowdown[1] = 1e300  # (the scenario file caps it at 1e6: see below)
    with pytest.raises(SimulationLimitError, match="jumped to .* stragglers: device 1 "
                                                   "slowdown 1e\\+300"):
        sim.run(2)


def test_no_progress_is_detected(monkeypatch):
    monkeypatch.setattr(engine, "STUCK_EVENTS", 3)  # (real runs have far fewer at one instant)
    cluster = two_nodes(gpus=1)
    with pytest.raises(SimulationLimitError, match="stopped advancing at .* no fault in effect"):
        simulate(colocated_plan(WL, cluster), WL, cluster, 2)


def test_progress_is_reported_in_simulated_seconds_and_iterations(monkeypatch):
    monkeypatch.setattr(engine, "PROGRESS_EVERY", 50)
    cluster = two_nodes(gpus=1)
    seen: list[tuple[float, int]] = []
    r = simulate(colocated_plan(WL, cluster), WL, cluster, 3,
                 progress=lambda now, done: seen.append((now, done)))
    assert len(seen) == r.metrics["events"] // 50
    assert seen == sorted(seen) and seen[-1][0] <= r.trace.iterations[-1][1]
    assert {d for _, d in seen} <= {0, 1, 2, 3}


@pytest.mark.parametrize("data,field,limit", [
    ({"events": [{"at_s": 0, "kind": "straggler", "device": 0, "slowdown": 1e300}]},
     "faults.events[0].slowdown", "[1, 1e+06]"),
    ({"events": [{"at_s": float("inf"), "kind": "device_lost", "device": 0}]},
     "faults.events[0].at_s", "[0, 1e+09]"),
    ({"events": [], "replan": {"delay_s": float("inf")}}, "faults.replan.delay_s", "[0, 1e+09]"),
    ({"events": [], "replan": {"delay_s": float("nan")}}, "faults.replan.delay_s", "[0, 1e+09]"),
])
def test_extreme_fault_values_are_refused_with_the_limit(data, field, limit):
    with pytest.raises(SpecError) as info:
        FaultScenario.from_dict(data, 4, REGIONS)
    assert info.value.field == field and limit in info.value.problem
