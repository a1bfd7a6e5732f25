"""Fault scenarios: parsing errors name the field; stragglers, link degradation and device loss
(stall, or re-plan on the remaining devices) change the simulated run as they should."""

from __future__ import annotations

import pytest

from hetrl.errors import SpecError
from hetrl.plan import Plan, TaskGroup, colocated_plan, make_placement
from sim import simulate
from sim.driver import without_devices
from sim.faults import FaultScenario
from tests.sim.tiny import tiny_workload, two_nodes

REGIONS = ("r0", "r1")


def parse(events, replan=None, devices=4):
    data = {"events": events} if replan is None else {"events": events, "replan": replan}
    return FaultScenario.from_dict(data, devices, REGIONS)


@pytest.mark.parametrize("event,field", [
    ({"at_s": 1, "kind": "meteor"}, "faults.events[1].kind"),
    ({"at_s": 1, "kind": "device_lost", "device": 4}, "faults.events[1].device"),
    ({"at_s": 1, "kind": "device_lost", "device": -1}, "faults.events[1].device"),
    ({"at_s": 1, "kind": "straggler", "device": 0, "slowdown": 0.5}, "faults.events[1].slowdown"),
    ({"at_s": 1, "kind": "link_degraded", "regions": ["r0", "r1"], "bandwidth_factor": 1.5},
     "faults.events[1].bandwidth_factor"),
    ({"at_s": 1, "kind": "link_degraded", "regions": ["r0", "mars"]}, "faults.events[1].regions"),
    ({"at_s": 1, "kind": "link_degraded", "regions": ["r0", "r0"]}, "faults.events[1].regions"),
    ({"at_s": -1, "kind": "device_lost", "device": 0}, "faults.events[1].at_s"),
    ({"at_s": 1, "kind": "device_lost", "device": 0, "slowdown": 2}, "faults.events[1].slowdown"),
])
def test_bad_events_name_the_field(event, field):
    # the bad event comes second, after a good one: the index in the field is its own
    with pytest.raises(SpecError) as exc:
        parse([{"at_s": 0, "kind": "straggler", "device": 1, "slowdown": 2}, event])
    assert exc.value.field == field
    assert str(exc.value).startswith(field)


def test_bad_scenario_keys_name_the_field():
    with pytest.raises(SpecError, match=r"^faults\.extra"):
        FaultScenario.from_dict({"events": [], "extra": 1}, 4, REGIONS)
    with pytest.raises(SpecError, match=r"^faults\.replan\.budget"):
        parse([], replan={"budget": 3})
    with pytest.raises(SpecError, match=r"^faults\.replan\.budget_evals"):
        parse([], replan={"budget_evals": 0})
    # an unknown scheduler is an error when the file loads, not when the fault fires
    with pytest.raises(SpecError, match=r"^faults\.replan\.scheduler = 'nosuch': unknown"):
        parse([], replan={"scheduler": "nosuch"})


def test_good_scenario_parses_sorted_by_time():
    sc = parse([{"at_s": 5, "kind": "device_lost", "device": 3},
                {"at_s": 1, "kind": "link_degraded", "regions": ["r1", "r0"],
                 "bandwidth_factor": 0.25, "extra_latency_ms": 20},
                {"at_s": 0, "kind": "straggler", "device": 2, "slowdown": 1.5}],
               replan={"scheduler": "random", "budget_evals": 10, "delay_s": 3})
    assert [e.kind for e in sc.events] == ["straggler", "link_degraded", "device_lost"]
    assert sc.events[1].regions == ("r1", "r0") and sc.events[1].bandwidth_factor == 0.25
    assert sc.replan is not None and sc.replan.delay_s == 3 and sc.replan.scheduler == "random"


# --- effects ----------------------------------------------------------------------------------

WL = tiny_workload(n_prompts=4, responses=2, prompt=64, response=32)


def split_plan(cluster):
    """Generation dp=2 on node a (0, 1), every other task dp=2 on node b (2, 3): rollout data
    and weight sync cross between the nodes (and regions, when b is in r1)."""
    rest = tuple(t for t in WL.task_names if t != "actor_generation")
    return Plan((TaskGroup(("actor_generation",), (0, 1)), TaskGroup(rest, (2, 3))),
                tuple(make_placement(t, [0, 1] if t == "actor_generation" else [2, 3], 2, 1, 1, 2)
                      for t in WL.task_names))


def test_a_straggler_slows_the_iteration():
    cluster = two_nodes(gpus=2)
    plan = split_plan(cluster)
    base = simulate(plan, WL, cluster, 2)
    slow = simulate(plan, WL, cluster, 2, faults=parse(
        [{"at_s": 0, "kind": "straggler", "device": 0, "slowdown": 2}]))
    assert slow.iteration_s > base.iteration_s
    # generation waits for its slowest replica: device 0 at half speed doubles that replica
    g0 = [s.duration_s for s in base.trace.spans_of("tasklet", "actor_generation") if 0 in s.devices]
    g1 = [s.duration_s for s in slow.trace.spans_of("tasklet", "actor_generation") if 0 in s.devices]
    assert g1 == pytest.approx([2 * x for x in g0], rel=1e-9)
    assert slow.metrics["tasks"]["actor_training"] == pytest.approx(
        base.metrics["tasks"]["actor_training"], rel=1e-9)  # training does not use device 0
    assert any(s.kind == "fault" and s.name == "straggler" for s in slow.trace.spans)


def test_link_degradation_slows_a_cross_region_plan():
    cluster = two_nodes(gpus=2, region_b="r1", link_ms=10.0, link_gbps=0.8)
    plan = split_plan(cluster)
    base = simulate(plan, WL, cluster, 2)
    bad = simulate(plan, WL, cluster, 2, faults=parse(
        [{"at_s": 0, "kind": "link_degraded", "regions": ["r0", "r1"], "bandwidth_factor": 0.1,
          "extra_latency_ms": 50}]))
    assert bad.iteration_s > base.iteration_s
    # the weight sync pulls 2 x 3.39 MB over the link: at 0.1x its rate it takes much longer
    assert bad.metrics["tasks"]["weight_sync"] > 5 * base.metrics["tasks"]["weight_sync"]
    # a plan inside one region does not notice the degraded link
    local = colocated_plan(WL, cluster, devices=[0, 1])
    a = simulate(local, WL, cluster, 2)
    b = simulate(local, WL, cluster, 2, faults=parse(
        [{"at_s": 0, "kind": "link_degraded", "regions": ["r0", "r1"], "bandwidth_factor": 0.1}]))
    assert a.iteration_s == pytest.approx(b.iteration_s, rel=1e-12)


def lost_at(cluster, plan, fraction=0.5, iteration=1):
    """A time in the middle of ``iteration`` of the fault-free run."""
    its = simulate(plan, WL, cluster, 3).trace.iterations
    start, end = its[iteration]
    return start + fraction * (end - start)


def test_device_lost_without_replan_stalls():
    cluster = two_nodes(gpus=2)
    plan = split_plan(cluster)
    t = lost_at(cluster, plan, fraction=0.9)  # generation of iteration 1 has finished
    r = simulate(plan, WL, cluster, 3, faults=parse([{"at_s": t, "kind": "device_lost",
                                                      "device": 3}]))
    f = r.faults
    assert f.stalled and f.stalled_at_s == t and f.lost_devices == [3]
    assert r.metrics["completed_iterations"] == 1 < 3 == r.metrics["requested_iterations"]
    assert r.metrics["stalled"] is True
    assert f.lost_work_s == pytest.approx(t - r.trace.iterations[0][1], rel=1e-12)
    assert f.lost_work_s > 0 and f.aborted_iterations == [1]
    assert any(s.kind == "fault" and s.name == "device lost" for s in r.trace.spans)
    # spans of the cut-short iteration are marked aborted; task_seconds leaves them out
    cut = [s for s in r.trace.spans if s.iteration == 1 and s.kind != "fault"]
    assert cut and all(s.meta.get("aborted") for s in cut)
    assert any(s.task == "actor_generation" and s.kind == "task" for s in cut)
    assert not any(s.meta.get("aborted") for s in r.trace.spans if s.iteration == 0)


def test_losing_an_unused_device_changes_nothing():
    cluster = two_nodes(gpus=3)  # device 5 is in no group
    plan = split_plan(cluster)
    base = simulate(plan, WL, cluster, 2)
    r = simulate(plan, WL, cluster, 2, faults=parse(
        [{"at_s": 0.001, "kind": "device_lost", "device": 5}], devices=6))
    assert not r.faults.stalled and r.faults.lost_devices == []
    assert r.iteration_s == pytest.approx(base.iteration_s, rel=1e-12)


def test_device_lost_with_replan_completes_on_the_others():
    cluster = two_nodes(gpus=2)
    plan = split_plan(cluster)
    t = lost_at(cluster, plan)
    calls = []

    def hook(workload, remaining):
        calls.append(remaining.num_devices)
        return colocated_plan(workload, remaining)  # dp = 3 on what is left

    sc = parse([{"at_s": t, "kind": "device_lost", "device": 2}], replan={"delay_s": 0.5})
    r = simulate(plan, WL, cluster, 3, faults=sc, replan=hook)
    f = r.faults
    assert calls == [3]
    assert not f.stalled and f.lost_devices == [2] and len(f.replans) == 1
    assert f.replans[0]["at_s"] == t and f.replans[0]["delay_s"] == 0.5
    assert f.lost_work_s > 0
    assert r.metrics["completed_iterations"] == 3
    restart = t + 0.5
    later = [s for s in r.trace.spans if s.start_s >= restart and s.kind != "fault"]
    assert later and all(2 not in s.devices for s in later)
    # the new plan's devices 0, 1, 2 are the old 0, 1, 3: device 3 works after the re-plan
    assert any(3 in s.devices for s in later)
    assert r.trace.iterations[1][0] >= restart


def test_replan_from_the_scenario_uses_a_scheduler():
    cluster = two_nodes(gpus=2)
    plan = split_plan(cluster)
    t = lost_at(cluster, plan)
    sc = parse([{"at_s": t, "kind": "device_lost", "device": 0}],
               replan={"scheduler": "random", "budget_evals": 20, "seed": 1, "delay_s": 1})
    r = simulate(plan, WL, cluster, 3, faults=sc)
    assert r.metrics["completed_iterations"] == 3
    assert r.faults.replans[0]["scheduler"] == "random"
    assert all(0 not in s.devices for s in r.trace.spans if s.start_s >= t + 1)


def test_without_devices_keeps_the_rest_in_order():
    cluster = two_nodes(gpus=2)
    rest, mapping = without_devices(cluster, {1})
    assert rest.num_devices == 3 and mapping == [0, 2, 3]
    assert [n.count for n in rest.nodes] == [1, 2]
    rest, mapping = without_devices(cluster, {0, 1})  # a whole node goes
    assert [n.name for n in rest.nodes] == ["b"] and mapping == [2, 3]


NODES = {"a": [0, 1], "b": [2, 3]}


def test_node_lost_is_every_device_of_the_node():
    sc = FaultScenario.from_dict({"events": [{"at_s": 2, "kind": "node_lost", "node": "b"}]}, 4,
                                 REGIONS, NODES)
    assert [(e.kind, e.device, e.at_s) for e in sc.events] == [("device_lost", 2, 2.0),
                                                               ("device_lost", 3, 2.0)]
    with pytest.raises(SpecError) as exc:
        FaultScenario.from_dict({"events": [{"at_s": 2, "kind": "node_lost", "node": "z"}]}, 4,
                                REGIONS, NODES)
    assert exc.value.field == "faults.events[0].node"


def test_node_lost_with_replan_leaves_the_node_out():
    cluster = two_nodes(gpus=2)
    plan = split_plan(cluster)
    t = lost_at(cluster, plan)
    sc = FaultScenario.from_dict({"events": [{"at_s": t, "kind": "node_lost", "node": "a"}],
                                  "replan": {"delay_s": 0}}, 4, REGIONS, NODES)
    r = simulate(plan, WL, cluster, 3, faults=sc,
                 replan=lambda wl, rest: colocated_plan(wl, rest))
    assert sorted(r.faults.lost_devices) == [0, 1] and len(r.faults.replans) == 1
    assert r.faults.replans[0]["devices"] == 2
    assert r.metrics["completed_iterations"] == 3
    later = [s for s in r.trace.spans if s.start_s >= t and s.kind != "fault"]
    assert later and all(d in (2, 3) for s in later for d in s.devices)
