"""End-to-end runs of the real backend on CPU: a local Ray with emulated A100 and L4 resources,
a tiny Qwen3 model, 4-device plans over two GPU types and two task groups.

Each run costs ~30-60 s on 2 cores (four worker processes import torch and transformers), so
runs are shared by module-scoped fixtures and every test reads several facts off them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("ray")

from hetrl.io import load_plan  # noqa: E402
from hetrl.spec.cluster import ClusterSpec, RegionLink  # noqa: E402
from hetrl.spec.presets import cluster_preset, workload_preset  # noqa: E402
from hetrl.trace import Trace  # noqa: E402
from real.network import NetworkEmulator  # noqa: E402
from real.report import per_iteration_tasks  # noqa: E402
from real.runner import RunConfig, RunError, run_plan  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(workload: str, cluster: str, plan: str, **config):
    wl, cl = workload_preset(workload), cluster_preset(cluster)
    p = load_plan(EXAMPLES / plan)
    return wl, cl, p, run_plan(wl, cl, p, RunConfig(**config))


def far_apart() -> ClusterSpec:
    """tiny4's two nodes 250 ms apart one way at 1 Gbps: the crossings of one iteration add
    ~2 s, well above the timing noise of a loaded 2-core machine (~0.7 s per iteration)."""
    base = cluster_preset("tiny4-two-region")
    return replace(base, name="tiny4-250ms",
                   region_links=(RegionLink("us-east-1", "eu-west-1", 250.0, 1.0),))


@pytest.fixture(scope="module")
def cross_region():
    """The same GRPO plan (training pipelined across the two nodes) on one region and on two."""
    wl = workload_preset("tiny-grpo-sync")
    plan = load_plan(EXAMPLES / "plan-tiny-grpo-cross-region.yaml")
    config = RunConfig(iterations=4, reward="target-byte", lr=3e-2, seed=1)
    return {name: (wl, cl, plan, run_plan(wl, cl, plan, config))
            for name, cl in (("one", cluster_preset("tiny4-single-region")), ("two", far_apart()))}


def test_grpo_trace_is_complete_and_loadable(cross_region):
    wl, _, plan, res = cross_region["one"]
    trace = res.trace
    assert len(trace.iterations) == 4
    for i, tasks in enumerate(per_iteration_tasks(trace)):
        for task in wl.task_names:  # every planned task, every iteration
            assert tasks.get(task, 0.0) > 0, (i, task)
        assert tasks.get("weight_sync", 0.0) > 0
    # tasklets of the pipelined training name each stage's device
    stages = {s.meta.get("stage"): s.devices for s in trace.spans_of("tasklet", "actor_training")
              if "stage" in s.meta}
    assert stages == {0: (1,), 1: (2,)}
    # a task span occupies its task's devices, not those its input came from (training
    # receives rollouts from the generation devices 0 and 3)
    for s in trace.spans_of("task"):
        if s.task in wl.task_names:
            assert set(s.devices) == set(plan.placement(s.task).device_ids), s
    assert {s.devices for s in trace.spans_of("task", "actor_training")} == {(1, 2)}
    # each generation tasklet holds its prefill then its decode as phase spans
    gen = trace.spans_of("tasklet", "actor_generation")
    phases = trace.spans_of("phase", "actor_generation")
    assert len(phases) == 2 * len(gen) > 0
    for t in gen:
        mine = sorted((p for p in phases if p.iteration == t.iteration and p.devices == t.devices),
                      key=lambda p: p.start_s)
        assert [p.name for p in mine] == ["prefill", "decode"]
        prefill, decode = mine
        assert t.start_s <= prefill.start_s <= prefill.end_s <= decode.start_s
        assert decode.end_s <= t.end_s
        assert prefill.meta["sequences"] == t.meta["sequences"] and prefill.meta["prompt_tokens"] > 0
        assert decode.meta["batch"] == t.meta["sequences"]
        assert 0 <= decode.meta["steps"] < wl.response_length.max
        assert 0 <= decode.meta["tokens"] <= decode.meta["steps"] * decode.meta["batch"]
    assert set(trace.phase_seconds("actor_generation")) == {"prefill", "decode"}
    # the simulator's tooling reads it: round trip through JSON and Chrome export
    again = Trace.from_dict(json.loads(json.dumps(trace.to_dict())))
    assert again.task_seconds() == trace.task_seconds()
    assert trace.to_chrome()["traceEvents"]
    assert {"workload_spec", "cluster_spec", "plan"} <= set(trace.meta)


def test_weight_sync_verified_every_iteration(cross_region):
    _, _, plan, res = cross_region["two"]
    gen_replicas = plan.placement("actor_generation").dp
    assert res.weights_verified == 4 * gen_replicas


def test_learnable_reward_rises(cross_region):
    rewards = cross_region["one"][3].rewards
    assert rewards[-1] > rewards[0], rewards


def test_two_regions_slower_by_the_emulated_delays(cross_region):
    _, one_cl, plan, one = cross_region["one"]
    wl, two_cl, _, two = cross_region["two"]
    # fastest iteration after the first: the least disturbed by other work on the machine
    diff = min(two.iteration_seconds()[1:]) - min(one.iteration_seconds()[1:])
    # The delays the topology implies on the critical path of one iteration, from the emulator:
    # every pipeline micro-batch crosses the stage boundary (devices 1 -> 2) forward and back.
    # (Generation data and weight sync cross too; they are left out of this lower bound.)
    micro = -(-wl.samples // wl.micro_batch_size)
    per_crossing = (NetworkEmulator(two_cl).transfer_s(1, 2, 0)
                    - NetworkEmulator(one_cl).transfer_s(1, 2, 0))
    expected = 2 * micro * per_crossing
    assert per_crossing > 0.24  # 250 ms one way
    assert diff > 0.6 * expected, (diff, expected)
    # and not wildly more: all cross-region transfers of an iteration, plus noise
    transfers = sum(s.duration_s for s in two.trace.spans_of("transfer")) / len(two.trace.iterations)
    assert diff < transfers + 1.0, (diff, transfers)


def test_ppo_fault_names_device_and_task_then_resumes(tmp_path):
    ckpt = tmp_path / "ckpt"
    # kill_at's iteration is an index (from 0); the message counts from 1, as the progress does
    with pytest.raises(RunError, match=r"device 2 \(L4.*critic_training of iteration 2"):
        _run("tiny-ppo-sync", "tiny4-single-region", "plan-tiny-ppo-tiny4.yaml", iterations=3,
             checkpoint_dir=str(ckpt), kill_at=("critic_training", 1, 2))
    assert (ckpt / "checkpoint.pt").exists()
    wl, _, _, res = _run("tiny-ppo-sync", "tiny4-single-region", "plan-tiny-ppo-tiny4.yaml",
                         iterations=3, checkpoint_dir=str(ckpt), resume=True)
    assert res.resumed_from == 1
    assert len(res.trace.iterations) == 3  # the finished iteration 0 is kept, 1-2 run now
    starts = [a for a, _ in res.trace.iterations]
    assert starts == sorted(starts)
    for tasks in per_iteration_tasks(res.trace):
        for task in wl.task_names:
            assert tasks.get(task, 0.0) > 0
    assert {s.iteration for s in res.trace.spans_of("task")} == {0, 1, 2}
    assert all(k.startswith(("actor_training/", "critic_training/")) for k in res.stats[-1])


def test_async_generation_overlaps_training():
    wl, _, _, res = _run("tiny-grpo-async", "tiny4-single-region", "plan-tiny-grpo-tiny4.yaml",
                         iterations=3)
    assert wl.staleness == 1
    gen = {s.iteration: s for s in res.trace.spans_of("task", "actor_generation")}
    train = {s.iteration: s for s in res.trace.spans_of("task", "actor_training")}
    sync = {s.iteration: s for s in res.trace.spans_of("task", "weight_sync")}
    for i in range(2):
        # generation of iteration i + 1 runs ahead on its own devices: it starts before
        # iteration i's training, with weights at most one update old (staleness 1)
        assert gen[i + 1].start_s < train[i].start_s, (i, gen[i + 1], train[i])
        if i >= 1:
            assert gen[i + 1].start_s >= sync[i - 1].start_s
    assert res.weights_verified == 3 * 2


def test_unsupported_layout_is_a_clear_error():
    from hetrl.errors import SpecError
    from hetrl.plan import colocated_plan

    wl, cl = workload_preset("tiny-grpo-sync"), cluster_preset("tiny4-single-region")
    with pytest.raises(SpecError, match=r"placements\[actor_generation\]\.tp"):
        run_plan(wl, cl, colocated_plan(wl, cl, tp=2))
    plan = colocated_plan(wl, cl)
    fsdp = plan.with_placement(replace(plan.placement("actor_training"), backend="fsdp"))
    with pytest.raises(SpecError, match=r"placements\[actor_training\]\.backend = 'fsdp'"):
        run_plan(wl, cl, fsdp)
    big = workload_preset("qwen3-4b-grpo-sync")
    with pytest.raises(SpecError, match="models.actor"):
        run_plan(big, cluster_preset("a100x8"), colocated_plan(big, cluster_preset("a100x8")))


def test_calibration_on_cpu_traces_reduces_the_error(cross_region):
    from hetrl.calibrate import CalibrationRun, fit_params

    runs = [CalibrationRun.from_trace(cross_region[k][3].trace) for k in ("one", "two")]
    result = fit_params(runs)
    print(f"iteration-time error before {result.error_before:.1%}, after {result.error_after:.1%}")
    # the defaults describe real A100s and L4s, not this CPU (measured 40-71% off)
    assert result.error_before > 0.3
    assert result.error_after < 0.5 * result.error_before


def test_a_replica_without_sequences_is_a_clear_error():
    from dataclasses import replace as dc_replace

    from hetrl.errors import SpecError
    from real.runner import RealRun

    wl, cl = workload_preset("tiny-grpo-sync"), cluster_preset("tiny4-single-region")
    plan = load_plan(EXAMPLES / "plan-tiny-grpo-tiny4.yaml")
    gen = dc_replace(plan.placement("actor_generation"), data_weights=(1000.0, 1.0))
    run = RealRun(wl, cl, plan.with_placement(gen))  # no Ray until run()
    with pytest.raises(SpecError, match=r"placements\[actor_generation\]\.data_weights"):
        run._split("actor_generation", wl.samples)


def test_a_rule_reward_job_runs_without_a_reward_model():
    """reward: rule -- no reward model on any worker, no reward_inference task; the rule alone
    scores the responses and the trace has no reward span."""
    from hetrl.plan import Plan, TaskGroup

    base = workload_preset("tiny-grpo-sync")
    wl = base.with_(name="tiny-grpo-rule", reward="rule",
                    models=tuple((r, m) for r, m in base.models if r != "reward"))
    cl = cluster_preset("tiny4-single-region")
    full = load_plan(EXAMPLES / "plan-tiny-grpo-tiny4.yaml")
    plan = Plan(tuple(TaskGroup(tuple(t for t in g.tasks if t != "reward_inference"), g.devices)
                      for g in full.groups if set(g.tasks) != {"reward_inference"}),
                tuple(p for p in full.placements if p.task != "reward_inference"))
    res = run_plan(wl, cl, plan, RunConfig(iterations=2, reward="target-byte", seed=2))
    assert not res.trace.spans_of("task", "reward_inference")
    assert len(res.trace.spans_of("task", "actor_training")) == 2
    assert res.trace.task_seconds()["actor_training"] > 0


def test_recomputed_old_logprobs_come_from_the_trainers_weights():
    """recompute_logprobs: an actor_inference task in actor_training's group takes the
    trainer's weights after every iteration, verified by digest, and its log-probs are the PPO
    ratio's denominator. In sync mode they must equal the trainer's own forward (every
    micro-batch's forward runs before the step): approx_kl 0 in iteration 1 too, which holds
    only if actor_inference got the weights of step 0 (stale weights give a non-zero KL)."""
    from hetrl.plan import Plan, TaskGroup, TaskPlacement

    wl = workload_preset("tiny-grpo-sync").with_(name="tiny-grpo-old-logp", recompute_logprobs=True)
    cl = cluster_preset("tiny4-single-region")
    full = load_plan(EXAMPLES / "plan-tiny-grpo-tiny4.yaml")
    dp2 = (((2,),), ((3,),))
    plan = Plan(tuple(TaskGroup(g.tasks + ("actor_inference",), g.devices)
                      if "actor_training" in g.tasks else g for g in full.groups),
                tuple(p for p in full.placements if p.task != "actor_training") + (
                    TaskPlacement("actor_inference", 2, 1, 1, dp2, (4,), (1.0, 1.0)),
                    TaskPlacement("actor_training", 2, 1, 1, dp2, (4,), (1.0, 1.0))))
    res = run_plan(wl, cl, plan, RunConfig(iterations=2, reward="target-byte", seed=3))
    assert len(res.trace.spans_of("task", "actor_inference")) == 2
    # each iteration: both generation replicas and both actor_inference replicas verified
    assert res.weights_verified == 2 * (2 + 2)
    for stats in res.stats:
        assert stats["actor_training/approx_kl"] == pytest.approx(0.0, abs=1e-5)


def test_megatron_tp2_pp2_ppo_runs_checkpoints_and_resumes(tmp_path):
    """PPO with actor and critic training at tp = 2, pp = 2 on the megatron engine (gloo): the
    run dies at the start of iteration 3's critic training on device 3, then resumes from the
    checkpoint of iteration 2 and finishes; every weight sync is verified by digest."""
    pytest.importorskip("megatron.core")
    ckpt = tmp_path / "ckpt"
    run = {"iterations": 3, "checkpoint_dir": str(ckpt), "engines": (("training", "megatron"),)}
    with pytest.raises(RunError, match=r"device 3 \(L4.*critic_training of iteration 3"):
        _run("tiny-ppo-sync", "tiny4-two-region", "plan-tiny-ppo-megatron-tiny4.yaml",
             kill_at=("critic_training", 2, 3), **run)
    wl, _, plan, res = _run("tiny-ppo-sync", "tiny4-two-region",
                            "plan-tiny-ppo-megatron-tiny4.yaml", resume=True, **run)
    assert res.resumed_from == 2 and len(res.trace.iterations) == 3
    # 2 generation replicas + 2 critic-inference replicas per iteration, and again on resume
    assert res.weights_verified == 4 * 3 + 4
    for tasks in per_iteration_tasks(res.trace):
        for task in wl.task_names:
            if task in {p.task for p in plan.placements}:
                assert tasks.get(task, 0.0) > 0, task
    for stats in res.stats:
        assert {"actor_training/loss", "critic_training/loss", "actor_training/kl"} <= set(stats)
    for task in ("actor_training", "critic_training"):
        ranks = {(s.devices[0], s.meta["stage"], s.meta["tp_rank"])
                 for s in res.trace.spans_of("tasklet", task) if s.iteration == 2}
        assert ranks == {(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)}
        # pipeline activations and gradients cross the regions, each tp rank with its peer
        crossings = {s.devices for s in res.trace.spans_of("transfer", task) if s.iteration == 2}
        assert {(0, 2), (1, 3), (2, 0), (3, 1)} <= crossings
        assert set(next(s for s in res.trace.spans_of("task", task)).devices) == {0, 1, 2, 3}
