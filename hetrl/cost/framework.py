"""Per-step framework costs: what an RL framework's single controller spends on every task call
beyond the GPUs' work, whatever the plan's scale (docs/cost-model.md, "Framework costs").

- **A fixed cost per task call** (``task_call_s``): the driver's remote call to the task's
  worker group and the gather of its results (Ray round trips, worker-side dispatch, the
  framework's per-call set-up), paid by every task once per iteration.
- **Driver data movement per token** (``driver_s_per_token``): a single-controller framework
  (verl's ``DataProto``, OpenRLHF's and NeMo-RL's batch objects) moves the whole batch through
  its driver on every call -- split, serialised to the workers, gathered, concatenated --
  seconds per token of the batch as the driver holds it: padded to the configured maxima
  (verl pads prompts to ``max_prompt_length`` and responses to ``max_response_length``; packing
  happens inside the workers), so ``samples x (prompt max + response max)`` tokens per call.
- **Rule reward scoring** (``rule_reward_s_per_sequence``): a ``reward: rule`` workload scores
  each response on the CPU (answer extraction and checking), seconds per sequence, charged to
  the generation task it follows (verl's ``reward`` stage).

These do not shrink with more GPUs: doubling the GPUs of a co-located run shortens its GPU work,
not these. They are fitted on the public set's fit rows only (experiments/fit_public.py).
They are the RL framework's, not an engine's or a trainer's: the public set's component rows
(a serving benchmark, a pretraining run, a weight-sync test) are priced without them
(:func:`without_framework`), as their harnesses have no RL controller.
"""

from __future__ import annotations

from dataclasses import replace

from hetrl.cost.params import CostParams

#: The CostParams fields that are the RL framework's (its controller's and its worker loops'):
#: the per-call, per-token and per-micro-batch costs of a framework like verl, and its rollout
#: engine's host work per generated token.
FRAMEWORK_FIELDS = ("task_call_s", "driver_s_per_token", "rule_reward_s_per_sequence",
                    "micro_batch_overhead_s", "decode_s_per_token")


def task_framework_seconds(kind: str, sequences: float, tokens: float, rule_reward: bool,
                           params: CostParams) -> float:
    """Framework seconds of one call of a task of ``kind`` over a batch of ``sequences``
    holding ``tokens`` tokens (prompt + response); ``rule_reward``: the workload's rewards come
    from a rule, scored after generation."""
    out = params.task_call_s + params.driver_s_per_token * tokens
    if kind == "generation" and rule_reward:
        out += params.rule_reward_s_per_sequence * sequences
    return out


def batch_tokens(samples: int, prompt_max: int, response_max: int) -> int:
    """Tokens of one iteration's batch as the driver holds it (padded to the maxima)."""
    return samples * (prompt_max + response_max)


def without_framework(params: CostParams) -> CostParams:
    """``params`` with every RL-framework cost (:data:`FRAMEWORK_FIELDS`) at 0: a standalone
    engine's or trainer's own speed."""
    return replace(params, **dict.fromkeys(FRAMEWORK_FIELDS, 0.0))
