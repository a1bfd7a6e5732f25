"""Plans: construction, exact round trip through files, validation errors, properties."""

from __future__ import annotations

import copy
import json
from functools import cache

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from hetrl.errors import SpecError
from hetrl.io import load_plan, save_plan
from hetrl.plan import (
    Plan,
    Provenance,
    TaskGroup,
    colocated_plan,
    even_layers,
    make_placement,
    validate,
)
from hetrl.spec.presets import WORKLOAD_PRESETS, cluster_preset, workload_preset
from hetrl.spec.random_cluster import random_cluster

# --- construction ------------------------------------------------------------------------------


def test_colocated_plan_on_64_gpus(ppo8b, paper_clusters):
    cluster = paper_clusters["multi-continent"]
    plan = colocated_plan(ppo8b, cluster, tp=4, pp=2)
    assert len(plan.groups) == 1 and plan.groups[0].tasks == ppo8b.task_names
    assert plan.device_ids == tuple(range(64))
    p = plan.placement("actor_training")
    assert (p.dp, p.pp, p.tp) == (8, 2, 4)
    assert p.devices[0] == ((0, 1, 2, 3), (4, 5, 6, 7))   # tp innermost: one tp group per node
    assert p.devices[7][1] == (60, 61, 62, 63)
    assert p.layers_per_stage == (18, 18)
    assert p.data_shares == (0.125,) * 8
    assert plan.provenance.scheduler == "colocate"
    validate(plan, ppo8b, cluster)


def test_colocated_plan_on_a_device_subset(grpo4b, a100x8):
    plan = colocated_plan(grpo4b, a100x8, tp=2, devices=[4, 5, 6, 7])
    assert plan.device_ids == (4, 5, 6, 7)
    assert [p.dp for p in plan.placements] == [2, 2, 2, 2]
    with pytest.raises(SpecError) as err:
        colocated_plan(grpo4b, a100x8, tp=3)
    assert err.value.field == "tp*pp"
    with pytest.raises(SpecError) as err:
        colocated_plan(grpo4b, a100x8, tp=2, dp=3)
    assert err.value.field == "dp*pp*tp"


def test_even_layers_puts_the_extra_layers_first():
    assert even_layers(36, 5) == (8, 7, 7, 7, 7)
    assert even_layers(40, 4) == (10, 10, 10, 10)
    assert sum(even_layers(37, 6)) == 37


def test_data_shares_follow_the_weights():
    p = make_placement("actor_generation", [0, 1, 2], 3, 1, 1, 36, data_weights=[2, 1, 1])
    assert p.data_shares == (0.5, 0.25, 0.25)
    assert p.data_weights == (2.0, 1.0, 1.0)


def test_placement_and_group_lookup(grpo4b, a100x8):
    plan = colocated_plan(grpo4b, a100x8)
    assert plan.group_of("reward_inference") is plan.groups[0]
    with pytest.raises(SpecError):
        plan.placement("critic_training")
    with pytest.raises(SpecError):
        plan.group_of("critic_training")
    moved = make_placement("actor_training", list(range(8)), 1, 2, 4, 36)
    assert plan.with_placement(moved).placement("actor_training").pp == 2


# --- round trip --------------------------------------------------------------------------------

def _disaggregated(workload, cluster):
    """Generation alone on devices 0-3, the other tasks together on 4-7 (a100x8, GRPO)."""
    gen = make_placement("actor_generation", [0, 1, 2, 3], 2, 1, 2, 36, data_weights=[0.6, 0.4])
    rest = [4, 5, 6, 7]
    placements = [gen] + [make_placement(t, rest, 4, 1, 1, 36)
                          for t in ("reward_inference", "reference_inference")]
    placements.append(make_placement("actor_training", rest, 1, 2, 2, 36,
                                      layers_per_stage=[20, 16]))
    plan = Plan((TaskGroup(("actor_generation",), (0, 1, 2, 3)),
                 TaskGroup(("reward_inference", "reference_inference", "actor_training"),
                           tuple(rest))),
                tuple(placements), Provenance("manual", seed=7, note="hand-made"))
    validate(plan, workload, cluster)
    return plan


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_file_round_trip_exact(grpo4b, a100x8, tmp_path, suffix):
    for plan in (colocated_plan(grpo4b, a100x8, tp=2), _disaggregated(grpo4b, a100x8)):
        path = tmp_path / f"plan{suffix}"
        save_plan(plan, path)
        back = load_plan(path)
        assert back == plan
        assert back.to_dict() == plan.to_dict()
        validate(back, grpo4b, a100x8)
    assert list(tmp_path.iterdir()) == [path]  # atomic write leaves no temporary file


def test_plan_dict_is_plain_data(grpo4b, a100x8):
    d = _disaggregated(grpo4b, a100x8).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["provenance"] == {"scheduler": "manual", "seed": 7, "version": "0.1.0",
                               "note": "hand-made"}
    assert d["placements"][0]["devices"] == [[[0, 1]], [[2, 3]]]


def test_load_plan_errors(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("groups: [\n")
    with pytest.raises(SpecError, match="malformed yaml"):
        load_plan(path)
    path.write_text(yaml.safe_dump({"groups": [], "placements": [], "schema_version": 9}))
    with pytest.raises(SpecError) as err:
        load_plan(path)
    assert err.value.field == "p.yaml: schema_version"


# --- validation errors -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base():
    """A valid PPO plan on the 64-GPU single-region cluster, as a dict to mutate."""
    workload, cluster = workload_preset("qwen3-8b-ppo-sync"), cluster_preset("paper64-single-region")
    plan = colocated_plan(workload, cluster, tp=2, devices=range(16))
    return workload, cluster, plan.to_dict()


def _placement(d, task):
    return next(p for p in d["placements"] if p["task"] == task)


def _set_layout(p, dp, pp, tp, devices, layers=None):
    it = iter(devices)
    p.update(dp=dp, pp=pp, tp=tp,
             devices=[[[next(it) for _ in range(tp)] for _ in range(pp)] for _ in range(dp)],
             layers_per_stage=layers or list(even_layers(36, pp)), data_weights=[1.0] * dp)


def _mut_tp3(d):
    _set_layout(_placement(d, "actor_training"), 5, 1, 3, range(15))


def _mut_pp37(d):
    d["groups"][0]["devices"] = list(range(37))
    p = _placement(d, "critic_training")
    _set_layout(p, 1, 37, 1, range(37), layers=[1] * 37)


def _mut_layers(d):
    _placement(d, "actor_training")["layers_per_stage"] = [35]


def _mut_dp(d):
    _placement(d, "actor_generation")["dp"] = 9        # the grid still lists 8 replicas


def _mut_tp_width(d):
    _placement(d, "actor_generation")["devices"][0][0] = [0]   # tp = 2 but one device


def _mut_twice(d):
    _placement(d, "reward_inference")["devices"][1][0] = [0, 1]  # devices 0, 1 in replica 0 too


def _mut_two_groups(d):
    d["groups"] = [{"tasks": ["actor_generation"], "devices": [0, 1]},
                   {"tasks": [t for t in d["groups"][0]["tasks"] if t != "actor_generation"],
                    "devices": list(range(1, 16))}]


def _mut_missing_device(d):
    d["groups"][0]["devices"].append(64)


def _mut_missing_device_in_placement(d):
    _placement(d, "critic_inference")["devices"][3][0] = [6, 99]


def _mut_missing_task(d):
    d["groups"][0]["tasks"].remove("critic_inference")


def _mut_task_in_two_groups(d):
    d["groups"][0]["devices"] = list(range(8))
    d["groups"].append({"tasks": ["actor_generation"], "devices": list(range(8, 16))})


def _mut_outside_group(d):
    d["groups"][0]["devices"] = list(range(15))        # device 15 is still used by placements


def _mut_weight(d):
    _placement(d, "actor_generation")["data_weights"][2] = 0.0


def _mut_weight_negative(d):
    _placement(d, "actor_generation")["data_weights"][0] = -1.0


def _mut_unknown_task(d):
    d["groups"][0]["tasks"].append("reward_training")


def _mut_two_placements(d):
    d["placements"].append(copy.deepcopy(_placement(d, "actor_training")))


@pytest.mark.parametrize(("mutate", "field", "problem"), [
    (_mut_tp3, "placements[actor_training].tp", "must divide Qwen3-8B's 32 attention heads"),
    (_mut_pp37, "placements[critic_training].pp", "must be <= Qwen3-8B's 36 layers"),
    (_mut_layers, "placements[actor_training].layers_per_stage", "must sum to Qwen3-8B's 36"),
    (_mut_dp, "placements[actor_generation].devices", "must list dp = 9 replicas"),
    (_mut_tp_width, "placements[actor_generation].devices[0][0]", "must list tp = 2 devices"),
    (_mut_twice, "placements[reward_inference].devices", "device used twice"),
    (_mut_two_groups, "groups[1].devices", "device already in groups[0]"),
    (_mut_missing_device, "groups[0].devices", "no such device in cluster"),
    (_mut_missing_device_in_placement, "placements[critic_inference].devices",
     "no such device in cluster"),
    (_mut_missing_task, "groups", "tasks missing from every group"),
    (_mut_task_in_two_groups, "groups[1].tasks", "task already in groups[0]"),
    (_mut_outside_group, "placements[actor_generation].devices", "not in the task's group"),
    (_mut_weight, "placements[actor_generation].data_weights[2]", "must be finite and > 0"),
    (_mut_weight_negative, "placements[actor_generation].data_weights[0]", "> 0"),
    (_mut_unknown_task, "groups[0].tasks", "not a task of ppo"),
    (_mut_two_placements, "placements", "exactly one placement per task, found 2"),
])
def test_validate_errors_name_the_field(base, mutate, field, problem):
    workload, cluster, d = base
    validate(Plan.from_dict(d), workload, cluster)    # the base plan is valid
    bad = copy.deepcopy(d)
    mutate(bad)
    with pytest.raises(SpecError) as err:
        validate(Plan.from_dict(bad), workload, cluster)
    assert err.value.field == field
    assert problem in str(err.value)


@pytest.mark.parametrize(("change", "field"), [
    ({"colour": 1}, "colour"),
    ({"groups": {}}, "groups"),
    ({"groups": [{"tasks": ["actor_generation"]}]}, "groups[0]"),
    ({"groups": [{"tasks": "actor_generation", "devices": [0]}]}, "groups[0].tasks"),
    ({"groups": [{"tasks": [], "devices": ["0"]}]}, "groups[0].devices"),
    ({"provenance": {"author": "me"}}, "provenance.author"),
])
def test_from_dict_errors_name_the_field(base, change, field):
    with pytest.raises(SpecError) as err:
        Plan.from_dict({**base[2], **change})
    assert err.value.field == field


@pytest.mark.parametrize(("key", "value"), [
    ("devices", [[0, 1]]),                 # two levels, not three
    ("data_weights", ["heavy"]),
    ("data_weights", None),
    ("layers_per_stage", 36),
    ("hidden", 1),
])
def test_placement_from_dict_errors_name_the_field(base, key, value):
    d = copy.deepcopy(base[2])
    d["placements"][0][key] = value
    with pytest.raises(SpecError) as err:
        Plan.from_dict(d)
    assert err.value.field == f"placements[0].{key}"


# --- properties ----------------------------------------------------------------------------------

@cache
def _workload(name):
    return workload_preset(name)


@cache
def _cluster(seed, nodes, regions):
    return random_cluster(seed, num_nodes=nodes, num_regions=regions)


@st.composite
def valid_cases(draw):
    """A random cluster, a paper workload and a random valid plan for it."""
    cluster = _cluster(draw(st.integers(0, 50)), draw(st.integers(1, 4)), draw(st.integers(1, 3)))
    workload = _workload(draw(st.sampled_from(sorted(WORKLOAD_PRESETS))))
    tasks = list(workload.task_names)
    n = cluster.num_devices
    # Level 1: a random partition of the tasks into at most n groups.
    labels = draw(st.lists(st.integers(0, min(len(tasks), n) - 1),
                           min_size=len(tasks), max_size=len(tasks)))
    names = sorted(set(labels))
    members = [[t for t, lab in zip(tasks, labels, strict=True) if lab == g] for g in names]
    # Levels 2-3: disjoint random device sets, one per group (some devices may stay idle).
    order = draw(st.permutations(range(n)))
    used = draw(st.integers(len(members), n))
    cuts = sorted(draw(st.lists(st.integers(1, used - 1), unique=True,
                                min_size=len(members) - 1, max_size=len(members) - 1))
                  ) if len(members) > 1 else []
    bounds = [0, *cuts, used]
    groups = [tuple(order[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    placements = []
    for group_tasks, devices in zip(members, groups, strict=True):
        for task in group_tasks:
            model = workload.model(workload.task(task).role)
            # Levels 4-5: a feasible (dp, pp, tp), uneven layers, a random device order.
            # (tp dividing the heads, and the KV heads or a multiple of them: tiny-qwen3 has 4)
            tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if t <= len(devices)
                                       and model.heads % t == 0
                                       and (model.kv_heads % t == 0 or t % model.kv_heads == 0)]))
            pp = draw(st.integers(1, min(len(devices) // tp, model.layers)))
            dp = draw(st.integers(1, len(devices) // (tp * pp)))
            chosen = draw(st.permutations(devices))[:dp * pp * tp]
            stage_cuts = sorted(draw(st.lists(st.integers(1, model.layers - 1), unique=True,
                                              min_size=pp - 1, max_size=pp - 1))) if pp > 1 else []
            edges = [0, *stage_cuts, model.layers]
            layers = [b - a for a, b in zip(edges, edges[1:], strict=False)]
            weights = draw(st.lists(st.floats(0.01, 100), min_size=dp, max_size=dp))
            placements.append(make_placement(task, chosen, dp, pp, tp, model.layers,
                                             data_weights=weights, layers_per_stage=layers))
    plan = Plan(tuple(TaskGroup(tuple(m), g) for m, g in zip(members, groups, strict=True)),
                tuple(placements), Provenance("random", seed=draw(st.integers(0, 9))))
    return workload, cluster, plan


@given(valid_cases())
def test_random_valid_plans_validate_and_round_trip(case):
    workload, cluster, plan = case
    validate(plan, workload, cluster)
    d = plan.to_dict()
    assert Plan.from_dict(json.loads(json.dumps(d))) == plan
    assert Plan.from_dict(yaml.safe_load(yaml.safe_dump(d))) == plan
    assert set(plan.device_ids) <= set(range(cluster.num_devices))
    for p in plan.placements:
        assert sum(p.data_shares) == pytest.approx(1.0)


@given(valid_cases(), st.data())
def test_an_out_of_range_device_is_always_rejected(case, data):
    workload, cluster, plan = case
    d = plan.to_dict()
    bad = data.draw(st.one_of(st.integers(-1000, -1),
                              st.integers(cluster.num_devices, cluster.num_devices + 1000)))
    # Every slot that holds a device id: group members and tasklet slots.
    slots = [("group", gi, k) for gi, g in enumerate(d["groups"]) for k in range(len(g["devices"]))]
    slots += [("placement", pi, (r, s, t)) for pi, p in enumerate(d["placements"])
              for r, rep in enumerate(p["devices"]) for s, st_ in enumerate(rep)
              for t in range(len(st_))]
    kind, i, where = data.draw(st.sampled_from(slots))
    if kind == "group":
        d["groups"][i]["devices"][where] = bad
    else:
        r, s, t = where
        d["placements"][i]["devices"][r][s][t] = bad
    with pytest.raises(SpecError) as err:
        validate(Plan.from_dict(d), workload, cluster)
    assert err.value.value == bad
    assert "no such device" in str(err.value)


def test_actor_inference_outside_the_trainers_group_is_named(grpo4b, a100x8):
    """actor_inference runs on the trainer's weights: a plan that puts it in another task group
    is rejected, naming the group, the task and where it must go."""
    wl = grpo4b.with_(recompute_logprobs=True)
    good = colocated_plan(wl, a100x8, tp=1, pp=1)
    validate(good, wl, a100x8)
    ai = good.placement("actor_inference")
    moved = make_placement("actor_inference", (7,), 1, 1, 1, wl.model("actor").layers)
    rest = tuple(t for t in wl.task_names if t != "actor_inference")
    bad = Plan((TaskGroup(rest, tuple(range(7))), TaskGroup(("actor_inference",), (7,))),
               tuple(moved if p is ai else p for p in good.placements))
    with pytest.raises(SpecError, match=r"groups\[1\]\.tasks.*actor_inference.*actor_training"):
        validate(bad, wl, a100x8)
