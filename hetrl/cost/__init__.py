"""The analytical cost model: hardware primitives, per-task costs, memory, workflow aggregation."""

from hetrl.cost.bound import lower_bound
from hetrl.cost.model import CostModel, Estimate, cost_model, estimate
from hetrl.cost.params import DEFAULT_PARAMS, KERNEL_KINDS, CostParams

__all__ = ["DEFAULT_PARAMS", "KERNEL_KINDS", "CostModel", "CostParams", "Estimate", "cost_model",
           "estimate", "lower_bound"]
