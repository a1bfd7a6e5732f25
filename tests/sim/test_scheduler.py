"""The generation scheduler (sim.scheduler) as vLLM's V1 policy: admission while the KV cache
holds the prompt, chunked prefill mixed into running decode steps, preemption by recompute of the
latest admitted sequence when the next step's tokens do not fit. A recording stand-in for the
step durations makes every call checkable by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetrl.cost.model import CostModel
from hetrl.plan import colocated_plan
from sim.ops import NO_PREFILL, PrefillWork, ReplicaOps
from sim.scheduler import GenerationStats, generate
from tests.hand_params import HAND_PARAMS
from tests.sim.tiny import one_node, tiny_workload


class RecordingOps:
    """Each separate prefill takes 1 s, each decode step 1 s; the calls are recorded."""

    def __init__(self):
        self.calls: list[tuple] = []

    def prefill(self, tokens: float, sq_sum: float, prompts: int) -> float:
        self.calls.append(("prefill", tokens, prompts))
        return 1.0

    def decode_mixed(self, batch: int, ctx_sum: float, steps: int, prefill: PrefillWork):
        self.calls.append(("decode", batch, ctx_sum, steps, prefill.tokens))
        return float(steps), None


def run(prompts, responses, max_seqs, capacity):
    ops, stats = RecordingOps(), GenerationStats()
    pieces = list(generate(ops, np.array(prompts), np.array(responses), max_seqs, capacity,
                           stats))
    return ops.calls, stats, pieces


def test_a_prompt_admitted_while_others_decode_joins_their_steps():
    # max 2 at once: sequences 0 and 1 prefilled together on their own; after 2 steps sequence
    # 0 ends and 2 is admitted: its 4 prompt tokens ride in the next decode steps, which run
    # until 1 and 2 both end at step 5.
    calls, stats, pieces = run([4, 4, 4], [2, 5, 3], 2, math.inf)
    assert calls == [("prefill", 8.0, 2),
                     ("decode", 2, 10.0, 2, 0.0),  # contexts 4 + 4, plus the step's 2 tokens
                     ("decode", 2, 4 + 2 + 4 + 2, 3, 4.0)]
    assert [separate for _, separate in pieces] == [True, False, False]
    assert stats.steps == 5 and stats.peak_batch == 2 and stats.preemptions == 0
    assert stats.prompt_tokens == 12


def test_the_latest_admitted_is_preempted_and_recomputed_when_the_cache_is_full():
    # 20 tokens of KV, two sequences of prompt 4 and response 10: after 6 steps they hold 20
    # tokens and the next step's 2 do not fit: sequence 1 (admitted last) is preempted with 6
    # tokens generated; sequence 0 runs alone to step 10; then 1 is admitted again into the idle
    # replica and prefills its prompt and its 6 tokens (recompute) before its last 4 steps.
    calls, stats, _ = run([4, 4], [10, 10], 2, 20.0)
    assert calls == [("prefill", 8.0, 2),
                     ("decode", 2, 10.0, 6, 0.0),
                     ("decode", 1, 11.0, 4, 0.0),
                     ("prefill", 10.0, 1),
                     ("decode", 1, 11.0, 4, 0.0)]
    assert stats.preemptions == 1 and stats.steps == 14
    assert stats.prompt_tokens == 18


def test_admission_waits_for_room_in_the_cache():
    # 12 tokens hold both 4-token prompts and their 2 generated tokens each
    calls, stats, _ = run([4, 4], [2, 2], 4, 12.0)
    assert calls[0] == ("prefill", 8.0, 2)
    assert stats.preemptions == 0 and stats.steps == 2
    # 7 tokens hold one prompt of 4 but not two: the second waits for the first to end
    calls, stats, _ = run([4, 4], [2, 2], 4, 7.0)
    assert calls == [("prefill", 4.0, 1), ("decode", 1, 5.0, 2, 0.0),
                     ("prefill", 4.0, 1), ("decode", 1, 5.0, 2, 0.0)]


def test_a_lone_sequence_over_the_cache_is_never_preempted():
    calls, stats, _ = run([4], [10], 2, 5.0)
    assert calls == [("prefill", 4.0, 1), ("decode", 1, 5.0, 10, 0.0)]
    assert stats.preemptions == 0


def test_mixed_prefill_costs_its_flops_and_reads_the_weights_once():
    # a real replica of the tiny model: without prefill decode_mixed is decode; with it the
    # steps take at least as long and at most as long as a separate prefill plus the decode
    wl = tiny_workload()
    cluster = one_node(1)
    plan = colocated_plan(wl, cluster)
    model = CostModel(wl, cluster, HAND_PARAMS)
    gen = next(p for p in plan.placements if p.task == "actor_generation")
    ops = ReplicaOps(model.shapes(gen.task, gen), model.hw(gen.devices[0]), HAND_PARAMS)
    plain, left = ops.decode_mixed(8, 8 * 20, 5, NO_PREFILL)
    assert left is None and plain == pytest.approx(ops.decode(8, 8 * 20, 5), rel=1e-12)
    work = PrefillWork(64.0, 4 * 16.0**2, 4.0)
    mixed, left = ops.decode_mixed(8, 8 * 20, 5, work)
    assert left is None
    assert plain <= mixed <= plain + ops.prefill(64.0, 4 * 16.0**2, 4)
