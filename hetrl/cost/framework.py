"""Per-step framework costs: what an RL framework's single controller spends on every task call
beyond the GPUs' work, whatever the plan's scale (docs/cost-model.md, "Framework costs").

- **A fixed cost per task call** (``task_call_s``): the driver's remote call to the task's
  worker group and the gather of its results (Ray round trips, worker-side dispatch, the
  framework's per-call set-up), paid by every task once per iteration.
- **Driver data movement per token** (``driver_s_per_token``): a single-controller framework
  (verl's ``DataProto``, OpenRLHF's and NeMo-RL's batch objects) moves the whole batch through
  its driver on every call -- split, serialised to the workers, gathered, concatenated, padded
  and unpadded -- seconds per token of the batch (prompt + response), on every task call.
- **Rule reward scoring** (``rule_reward_s_per_sequence``): a ``reward: rule`` workload scores
  each response on the CPU (answer extraction and checking), seconds per sequence, charged to
  the generation task it follows (verl's ``reward`` stage).

These do not shrink with more GPUs: doubling the GPUs of a co-located run shortens its GPU work,
not these. They are fitted on the public set's fit rows only (experiments/fit_public.py).
"""

from __future__ import annotations

from hetrl.cost.params import CostParams


def task_framework_seconds(kind: str, sequences: float, tokens: float, rule_reward: bool,
                           params: CostParams) -> float:
    """Framework seconds of one call of a task of ``kind`` over a batch of ``sequences``
    holding ``tokens`` tokens (prompt + response); ``rule_reward``: the workload's rewards come
    from a rule, scored after generation."""
    out = params.task_call_s + params.driver_s_per_token * tokens
    if kind == "generation" and rule_reward:
        out += params.rule_reward_s_per_sequence * sequences
    return out
