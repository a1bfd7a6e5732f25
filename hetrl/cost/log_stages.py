"""An estimate in the stage names RL frameworks log, so it can be held against a log line.

verl prints ``timing_s/<stage>`` per step: ``gen`` (the rollout, including the hybrid engine's
wake-up and the reshard of the trainer's weights into the rollout engine), ``reward``,
``old_log_prob`` (the actor's recomputed log-probs), ``ref``, ``values``, ``adv``,
``update_critic``, ``update_actor`` and ``step``. hetrl's tasks map onto them one to one, except
that verl's ``gen`` holds the weight sync: in a synchronous co-located run the trainer's weights
are loaded into the engine as it wakes (verl's ``sharding_manager``), so ``weight_sync`` is
counted in ``gen``; elsewhere the sync is its own line (``weight_sync``, no verl name).
"""

from __future__ import annotations

from collections.abc import Mapping

#: hetrl task -> the ``timing_s/<stage>`` name verl logs for it
VERL_STAGE = {
    "actor_generation": "gen",
    "reward_inference": "reward",
    "actor_inference": "old_log_prob",
    "reference_inference": "ref",
    "critic_inference": "values",
    "critic_training": "update_critic",
    "actor_training": "update_actor",
}


def verl_stages(tasks: Mapping[str, float], present: tuple[str, ...], iteration_s: float,
                sync_in_gen: bool) -> dict[str, float]:
    """verl's stage name -> seconds for the workload's ``present`` tasks (``tasks``: seconds per
    hetrl task, ``weight_sync`` among them), plus ``step`` (the iteration). ``sync_in_gen``:
    the weight sync is part of verl's ``gen`` (a synchronous co-located plan)."""
    out = {VERL_STAGE[t]: float(tasks[t]) for t in present if t in VERL_STAGE}
    sync = float(tasks.get("weight_sync", 0.0))
    if sync_in_gen:
        out["gen"] = out.get("gen", 0.0) + sync
    else:
        out["weight_sync"] = sync
    out["step"] = float(iteration_s)
    return out
