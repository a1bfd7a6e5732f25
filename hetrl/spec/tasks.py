"""The RL workflow's tasks and their dependencies, derived from the algorithm.

PPO: actor generation -> {reward, reference, critic, actor inference} -> {actor, critic
training}. GRPO drops the critic (tasks critic_inference and critic_training); a rule reward
(``reward: rule``) drops the reward model (reward_inference); ``recompute_logprobs: false`` drops
the actor's forward that recomputes the rollouts' old log-probs (actor_inference: verl's
``old_log_prob``, NeMo-RL's previous log-probs); ``kl: none`` drops the reference model and its
forward (reference_inference: verl's ``ref``), as DAPO and GPG run. Weight sync (actor training -> generation
engine) is a cost item of every plan, not a task with devices of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

TASK_NAMES = (
    "actor_generation",
    "reward_inference",
    "reference_inference",
    "critic_inference",
    "actor_inference",
    "actor_training",
    "critic_training",
)
WEIGHT_SYNC = "weight_sync"
#: Every task name an estimate reports, in order (``weight_sync`` last).
REPORTED_TASKS = TASK_NAMES + (WEIGHT_SYNC,)

ALGORITHMS = ("ppo", "grpo")
#: Where rewards come from: a reward model (the ``reward_inference`` task) or a rule (an answer
#: checker, as most GSM8K/math GRPO recipes: scoring is CPU work, priced as negligible).
REWARDS = ("model", "rule")
KINDS = ("generation", "inference", "training")
#: Where the KL to the reference enters: the actor's loss (verl ``actor.use_kl_loss``, GRPO's
#: recipes), the reward (``algorithm.use_kl_in_reward``, classic PPO), or nowhere (DAPO, GPG: no
#: reference model, no ``reference_inference``). "loss" and "reward" cost the same.
KL_MODES = ("loss", "reward", "none")


@dataclass(frozen=True)
class TaskInfo:
    """One task: its name, the model role it runs, its kind and the tasks it waits for."""

    name: str
    role: str
    kind: str
    depends_on: tuple[str, ...]
    stage: int  # 0 generation, 1 inference, 2 training


_INFERENCE = ("reward_inference", "reference_inference", "critic_inference", "actor_inference")
_ALL = {
    "actor_generation": TaskInfo("actor_generation", "actor", "generation", (), 0),
    "reward_inference": TaskInfo("reward_inference", "reward", "inference", ("actor_generation",), 1),
    "reference_inference": TaskInfo("reference_inference", "reference", "inference",
                                    ("actor_generation",), 1),
    "critic_inference": TaskInfo("critic_inference", "critic", "inference", ("actor_generation",), 1),
    "actor_inference": TaskInfo("actor_inference", "actor", "inference", ("actor_generation",), 1),
    "actor_training": TaskInfo("actor_training", "actor", "training", _INFERENCE, 2),
    "critic_training": TaskInfo("critic_training", "critic", "training", _INFERENCE, 2),
}
#: Tasks that must share actor_training's task group: the actor's recomputed old log-probs come
#: from the trainer's own weights, as in verl, NeMo-RL and OpenRLHF (no weight copy elsewhere).
COLOCATED_WITH = {"actor_inference": "actor_training"}
#: Inference tasks that run the model being trained: batch i + 1 waits for its training on
#: batch i (PPO's critic values; the actor's recomputed log-probs).
NEEDS_TRAINED = ("critic_inference", "actor_inference")


@lru_cache(maxsize=16)
def tasks_for(algorithm: str, reward: str = "model", recompute_logprobs: bool = False,
              kl: str = "loss") -> tuple[TaskInfo, ...]:
    """The tasks of ``algorithm`` in workflow order, dependencies restricted to present tasks
    (``reward`` "rule": no reward model, so no ``reward_inference``; ``recompute_logprobs``
    adds ``actor_inference``; ``kl`` "none": no reference, so no ``reference_inference``)."""
    if algorithm == "ppo":
        names = TASK_NAMES
    elif algorithm == "grpo":
        names = tuple(n for n in TASK_NAMES if "critic" not in n)
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}")
    if reward == "rule":
        names = tuple(n for n in names if n != "reward_inference")
    elif reward != "model":
        raise ValueError(f"unknown reward {reward!r}")
    if not recompute_logprobs:
        names = tuple(n for n in names if n != "actor_inference")
    if kl == "none":
        names = tuple(n for n in names if n != "reference_inference")
    elif kl not in KL_MODES:
        raise ValueError(f"unknown kl {kl!r}")
    present = set(names)
    return tuple(
        TaskInfo(t.name, t.role, t.kind, tuple(d for d in t.depends_on if d in present), t.stage)
        for t in (_ALL[n] for n in names)
    )


def roles_for(algorithm: str, reward: str = "model", kl: str = "loss") -> tuple[str, ...]:
    """Model roles used by ``algorithm`` (GRPO has no critic; a rule reward no reward model;
    ``kl`` "none" no reference)."""
    roles = ("actor", "reference", "reward", "critic") if algorithm == "ppo" else (
        "actor", "reference", "reward")
    return tuple(r for r in roles if (r != "reward" or reward == "model")
                 and (r != "reference" or kl != "none"))
