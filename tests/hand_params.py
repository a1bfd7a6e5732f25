"""The cost-model constants that the hand-computed tests derive their numbers from.

They are the first defaults (before the fit of docs/validation.md), pinned here with no matmul
size curve (``flops_half_hidden`` 0), no per-step framework costs (hetrl.cost.framework) and the
eager launch at its first default, 60 us per layer, so that a test's arithmetic in its comments stays exact
when the fitted defaults of ``hetrl.cost.params`` move. Tests of the defaults themselves read
``DEFAULT_PARAMS``.
"""

from __future__ import annotations

from hetrl.cost.params import CostParams

#: infer_flops 0.5, train_flops 0.4, decode_flops 0.4, decode_hbm 0.7, hbm 0.8, link 0.8
HAND_PARAMS = CostParams(
    defaults=(("train_flops", 0.40), ("infer_flops", 0.50), ("decode_flops", 0.40),
              ("decode_hbm", 0.70), ("hbm", 0.80), ("link", 0.80)),
    flops_half_hidden=0.0, eager_launch_s_per_layer=60e-6, task_call_s=0.0,
    driver_s_per_token=0.0, rule_reward_s_per_sequence=0.0, decode_s_per_token=0.0,
    micro_batch_overhead_s=0.0)
