"""HetRL (ILP): an exact search with OR-tools CP-SAT over a symmetric, block-aligned space.

Read it in the phases of OR-tools' job-shop example:

- ``data``: each task's candidates (device set, layout), priced alone by the cost model.
- ``model``: the variables and constraints both solvers share (one choice per task, memory per
  device, the weight sync) and the way back from chosen candidates to a plan.
- ``monolithic``: one model with a start, duration and end per task and NoOverlap per device;
  it serves every workflow.
- ``phased``: one small model per sharing pattern for sync workflows whose stages are barriers
  (PPO, GRPO); the default there. Helped by ``pairwise`` (bounds that prune a pattern's
  candidates before its model is built) and ``local`` (a local search for a first incumbent).
- ``scheduler``: the scheduler registered as ``ilp``.

Units: durations in integer milliseconds (``SCALE`` per second), memory in whole MB; results
in seconds. docs/baselines.md says what the model leaves out and how it was measured.
"""

from hetrl.search.ilp.data import (
    SCALE,
    Candidate,
    candidates,
    device_sets,
    node_blocks,
    prune_dominated,
)
from hetrl.search.ilp.model import greedy_fallback, plan_from, sync_ms
from hetrl.search.ilp.monolithic import solve
from hetrl.search.ilp.phased import phased_objective_ms, solve_phased, solve_staged, stages_of
from hetrl.search.ilp.scheduler import EVAL_DETERMINISTIC_S, ILPScheduler

__all__ = [
    "EVAL_DETERMINISTIC_S",
    "SCALE",
    "Candidate",
    "ILPScheduler",
    "candidates",
    "device_sets",
    "greedy_fallback",
    "node_blocks",
    "phased_objective_ms",
    "plan_from",
    "prune_dominated",
    "solve",
    "solve_phased",
    "solve_staged",
    "stages_of",
    "sync_ms",
]
