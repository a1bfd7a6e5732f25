"""The driver-side pieces of a run without Ray: each worker's frozen spec, and the training
dispatchers' calls and arithmetic on a fake worker group (calls recorded in order)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from hetrl.io import load_plan
from hetrl.spec.presets import cluster_preset, workload_preset
from real.algos import AlgoConfig
from real.config import RunConfig
from real.placement import megatron_grids, tasklets
from real.training import GPipe, MegatronStep, ReplicaInput, SingleStage, dispatcher, train_step
from real.worker_spec import ROLE_SEED, worker_specs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _specs(plan: str, workload: str, **config):
    wl, cl = workload_preset(workload), cluster_preset("tiny4-two-region")
    p = load_plan(EXAMPLES / plan)
    cfg = RunConfig(**config)
    grids = megatron_grids(p, wl, dict(cfg.engines))
    return p, worker_specs(wl, cl, tasklets(p, wl), AlgoConfig(), cfg, 12.5, grids)


def test_worker_specs_hold_each_devices_engines_seeds_and_fault():
    _, specs = _specs("plan-tiny-ppo-tiny4.yaml", "tiny-ppo-sync", seed=7,
                      kill_at=("critic_training", 1, 3), engines=(("generation", "vllm"),))
    assert sorted(specs) == [0, 1, 2, 3]
    s0 = specs[0]
    assert list(s0.tasklets) == ["actor_generation", "actor_training"]
    assert {e.tasklet.task: e.engine for e in s0.engines} == {"actor_generation": "vllm",
                                                               "actor_training": "torch"}
    assert all(e.seed == 7 + ROLE_SEED[e.tasklet.role] for s in specs.values() for e in s.engines)
    assert [s.kill_at for s in specs.values()] == [None, None, None, ("critic_training", 1)]
    assert s0.t0 == 12.5 and s0.grids == {} and s0.torch_device == "cpu"
    with pytest.raises(dataclasses.FrozenInstanceError):
        s0.device = 1  # type: ignore[misc]


def test_megatron_specs_carry_the_grid_of_their_trainers():
    pytest.importorskip("megatron.core")
    _, specs = _specs("plan-tiny-ppo-megatron-tiny4.yaml", "tiny-ppo-sync",
                      engines=(("training", "megatron"),))
    for d, s in specs.items():
        assert set(s.grids) == {"actor_training", "critic_training"}
        assert all(any(d in st for r in g.devices for st in r) for g in s.grids.values())


class _Ref:
    def __init__(self, log, call):
        self.call = call
        log.append(call)


class _Worker:
    def __init__(self, log, d):
        self.log, self.d = log, d

    def __getattr__(self, name):
        log, d = self.log, self.d
        return type("M", (), {"remote": staticmethod(lambda *a: _Ref(log, (d, name, a)))})


class _Group:
    """Stands in for a WorkerGroup: ``[d]`` gives a worker whose calls are logged; ``get``
    answers each call by ``answer``."""

    def __init__(self, answer):
        self.log, self.answer = [], answer

    def __getitem__(self, d):
        return _Worker(self.log, d)

    def get(self, refs, timeout_s=None):
        return [self.answer(r.call) for r in refs]


def _rep(r, n, sources=None):
    micro = [(type("B", (), {"input_ids": f"ids{r}.{m}"})(), {}) for m in range(n)]
    return ReplicaInput(r, micro, [0.25] * n, sources or {})


def test_gpipe_runs_forwards_backwards_then_clips_by_the_replicas_norm():
    plan = load_plan(EXAMPLES / "plan-tiny-grpo-tiny4.yaml")  # actor_training: pp 2 on 2, 3
    p = plan.placement("actor_training")
    answers = {"stage_forward": 0.5, "stage_reduce": 4.0}
    g = _Group(lambda call: answers.get(call[1]))
    disp = dispatcher(g, p, megatron=False)
    assert isinstance(disp, GPipe)
    stats = train_step(g, 3, [(disp, [_rep(0, 2, {0: 10.0})])])
    calls = [(d, name) for d, name, _ in g.log]
    assert calls == [(2, "stage_forward"), (3, "stage_forward"), (2, "stage_forward"),
                     (3, "stage_forward"), (3, "stage_backward"), (2, "stage_backward"),
                     (3, "stage_backward"), (2, "stage_backward"), (2, "stage_reduce"),
                     (3, "stage_reduce"), (2, "stage_step"), (3, "stage_step")]
    steps = [a for _, name, a in g.log if name == "stage_step"]
    assert all(a == ("actor_training", 3, math.sqrt(8.0)) for a in steps)
    assert stats == {"actor_training/loss": 2 * 0.5 * 0.25}
    first = [a for _, name, a in g.log if name == "stage_forward"]
    assert first[0][-1] == {0: 10.0} and first[2][-1] is None  # data before micro-batch 0 only


def test_single_stage_and_megatron_dispatch_and_sum_statistics():
    plan = load_plan(EXAMPLES / "plan-tiny-ppo-tiny4.yaml")
    g = _Group(lambda call: {"loss": 1.0})
    disp = dispatcher(g, plan.placement("actor_training"), megatron=False)
    assert isinstance(disp, SingleStage)
    assert train_step(g, 0, [(disp, [_rep(0, 1), _rep(1, 1)])]) == {"actor_training/loss": 2.0}
    assert [(d, a[5], a[6]) for d, _, a in g.log] == [
        (0, "actor_training/stage0", (0, 1)), (1, "actor_training/stage0", (0, 1))]
    mplan = load_plan(EXAMPLES / "plan-tiny-ppo-megatron-tiny4.yaml")
    assert isinstance(dispatcher(g, mplan.placement("critic_training"), megatron=True),
                      MegatronStep)
