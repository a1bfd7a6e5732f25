"""A plan as verl trainer overrides (``hetrl export --to verl``), and the closest verl plan as a
hetrl Plan, so that both can be estimated and compared.

Written against verl :data:`VERL_VERSION` (its ``verl/trainer/config/_generated_ppo_trainer.yaml``
and ``_generated_ppo_megatron_trainer.yaml``; the tests check every exported key against them).

What stock verl runs (``trainer.use_v1``; trainer_base.py's resource pools):

- ``global_pool``: ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` GPUs for the actor (its
  trainer, its old log-probs: actor_training, actor_inference), the reference and the critic (both
  its tasks); with ``actor_rollout_ref.hybrid_engine`` the rollout (actor_generation) too;
- ``reward_pool`` (``reward.reward_model.enable_resource_pool``): the reward model alone;
- a standalone rollout pool (``actor_rollout_ref.rollout.nnodes`` x ``n_gpus_per_node``,
  ``trainer.v1.trainer_mode: separate_async``): only in async training.

Every task of a pool uses all of the pool's GPUs, with one layout per model (the rollout's TP, the
actor's, the reference's and the critic's TP and PP under Megatron; data parallelism only under
FSDP), equal data shares and, under Megatron, equal layer splits but for the first and the last
stage (``num_layers_in_first_pipeline_stage`` / ``_last_``). The rules that map a hetrl plan
onto that (docs/users.md, "Export to verl"):

1. generation gets a standalone pool when the workload is async and its group holds no task
   but generation (and the reward model, which then moves to ``global_pool``); in sync mode it
   joins ``global_pool`` (verl's sync trainer is the hybrid engine);
2. the reward model gets ``reward_pool`` when its group holds it alone;
3. every other group joins ``global_pool`` (several groups merge into one pool);
4. each pool must be a whole number of nodes, each giving it the same number of GPUs
   (``nnodes x n_gpus_per_node``): otherwise verl cannot come close, and the export stops
   (exit 2) naming the pool; each model's tp x pp must divide its pool's GPUs (verl runs every
   model on all of them): where the plan's does not, the nearest (tp, pp) that does is exported
   and the differences say so; the models verl serves on vLLM (the rollout, the reward model)
   run no pipeline parallelism: a pp > 1 there becomes (tp x pp, 1), or the nearest that
   divides;
5. the strategy (``fsdp`` or ``megatron``) is the actor trainer's backend, for every model.

A custom section, ``hetrl_resource_pools``, writes those pools as verl's
``ResourcePoolManager(resource_pool_spec, mapping)`` arguments and the nodes each pool should
hold: verl's config has no key for them (the trainer builds them in code) nor for which nodes a
pool takes (Ray places it), so verl does not read that section; ``--launcher``
(:mod:`hetrl.export.verl_launcher`) writes an entry point that builds those pools on the plan's
nodes.

verl builds the reference only when ``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward`` is
set: the workload's ``kl`` (loss, reward, none) sets them. The keys and the file are
:mod:`hetrl.export.verl_keys`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hetrl.errors import SpecError
from hetrl.export.verl_keys import (  # noqa: F401 (re-exported: verl.overrides, verl.render...)
    CONFIG_NAMES,
    CUSTOM_SECTION,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    MEGATRON_MODELS,
    check_batches,
    check_workload,
    command_line,
    flatten,
    model_paths,
    nested,
    overrides,
    ref_stage_override,
    render,
    token_budgets,
)
from hetrl.fingerprint import made_for
from hetrl.plan import Plan, Provenance, TaskGroup, even_layers, make_placement, validate
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec

VERL_VERSION = "0.9.1"
#: Which pool each task runs in, by verl role.
ROLE_OF_TASK = {"actor_generation": "Rollout", "actor_training": "Actor",
                "actor_inference": "Actor", "reference_inference": "RefPolicy",
                "critic_inference": "Critic", "critic_training": "Critic",
                "reward_inference": "RewardModel"}


@dataclass(frozen=True)
class Pool:
    """A verl resource pool: its name, its nodes (names, in cluster order) and GPUs per node."""

    name: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    devices: tuple[int, ...]


@dataclass(frozen=True)
class VerlLayout:
    """What the exported keys say about placement: pools, strategy, one layout per model.
    ``layouts`` maps a model (rollout, actor, ref, critic, reward) to (tp, pp)."""

    strategy: str
    rollout_pool: str  # "global_pool" (hybrid engine) or "rollout_pool" (standalone)
    reward_pool: str | None  # "reward_pool", "global_pool", or None (no reward model)
    pools: tuple[Pool, ...]
    layouts: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: Megatron's layer split of each model with pp > 1 (:func:`megatron_stages`).
    stages: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: expert parallelism of each mixture-of-experts model that has it (> 1): Megatron's
    #: expert_model_parallel_size; for a vLLM model (rollout, reward) its data-parallel ranks
    #: per engine, whose experts are split over tp x ep (:func:`expert_parallel`)
    expert: Mapping[str, int] = field(default_factory=dict)

    def pool(self, name: str) -> Pool:
        return next(p for p in self.pools if p.name == name)


def _pool_of(name: str, devices: list[int], cluster: ClusterSpec) -> Pool:
    """The pool on ``devices``, refused unless they are whole equal nodes (rule 4)."""
    per_node: dict[str, int] = {}
    for d in sorted(devices):
        per_node[cluster.devices[d].node] = per_node.get(cluster.devices[d].node, 0) + 1
    counts = set(per_node.values())
    if len(counts) != 1:
        detail = ", ".join(f"{c} on {n}" for n, c in per_node.items())
        raise SpecError(f"verl {name}", detail, "verl pools are nnodes x n_gpus_per_node: every "
                        "node must give the pool the same number of GPUs")
    return Pool(name, tuple(per_node), counts.pop(), tuple(sorted(devices)))


def verl_layout(plan: Plan, workload: WorkloadSpec, cluster: ClusterSpec) -> VerlLayout:
    """The verl placement closest to ``plan`` (rules 1-5 of the module); raises SpecError where
    verl cannot come close."""
    gen_group = plan.group_of("actor_generation")
    has_reward = "reward_inference" in workload.task_names
    standalone = workload.mode == "async" and set(gen_group.tasks) <= {"actor_generation",
                                                                      "reward_inference"}
    reward_group = plan.group_of("reward_inference") if has_reward else None
    reward_alone = reward_group is not None and reward_group.tasks == ("reward_inference",)
    notes = []
    if standalone and has_reward and not reward_alone:
        standalone = False
        notes.append("verl's separate_async trainer needs the reward model in a pool of its own "
                     "(reward.reward_model.enable_resource_pool); here it shares GPUs, so the "
                     "export falls back to colocate_async: generation on the hybrid engine, in "
                     "global_pool")
    global_devices: list[int] = []
    for g in plan.groups:
        if (standalone and g is gen_group) or (reward_alone and g is reward_group):
            continue
        global_devices += g.devices
    pools = [_pool_of("global_pool", global_devices, cluster)]
    if standalone:
        pools.append(_pool_of("rollout_pool", list(gen_group.devices), cluster))
    if reward_alone:
        pools.append(_pool_of("reward_pool", list(reward_group.devices), cluster))
    train = plan.placement("actor_training")
    strategy = train.backend
    layouts: dict[str, tuple[int, int]] = {}
    gen = plan.placement("actor_generation")
    layouts["rollout"] = (gen.tp, gen.pp)
    for model, task in (("actor", "actor_training"), ("ref", "reference_inference"),
                        ("critic", "critic_training")):
        if task in workload.task_names:
            p = plan.placement(task)
            layouts[model] = (1, 1) if strategy == "fsdp" else (
                (p.tp, p.pp) if p.backend == "megatron" else (1, 1))
    if has_reward:
        r = plan.placement("reward_inference")
        layouts["reward"] = (r.tp, r.pp)
    out = VerlLayout(strategy, "rollout_pool" if standalone else "global_pool",
                     ("reward_pool" if reward_alone else "global_pool") if has_reward else None,
                     tuple(pools), layouts, ())
    for model, (tp, pp) in list(layouts.items()):
        pool = out.pool(_pool_name(out, model))
        n = len(pool.devices)
        if model in VLLM_MODELS and pp > 1:
            layouts[model] = near = nearest_layout(tp * pp, 1, n, pool.gpus_per_node, max_pp=1)
            notes.append(f"{model}: (tp, pp) = ({tp}, {pp}): verl's vLLM engines do not run "
                         "pipeline parallelism (RolloutConfig raises NotImplementedError for "
                         f"pipeline_model_parallel_size > 1); exported as the nearest layout "
                         f"they run on {pool.name}'s {n} GPUs, ({near[0]}, 1)")
        elif n % (tp * pp):
            layouts[model] = near = nearest_layout(tp, pp, n, pool.gpus_per_node)
            notes.append(f"{model}: (tp, pp) = ({tp}, {pp}) does not divide the {n} GPUs of "
                         f"{pool.name} (verl runs every model on all of its pool's GPUs); "
                         f"exported as the nearest that does, ({near[0]}, {near[1]})")
    stages = {}
    if strategy == "megatron":
        for model, task in (("actor", "actor_training"), ("ref", "reference_inference"),
                            ("critic", "critic_training")):
            if model in layouts and layouts[model][1] > 1:
                layers = workload.model(workload.task(task).role).layers
                p = plan.placement(task)
                own = tuple(p.layers_per_stage) if p.pp == layouts[model][1] else None
                stages[model] = megatron_stages(layers, layouts[model][1], own)
    expert = expert_parallel(plan, workload, out, notes)
    out = replace(out, notes=tuple(notes), stages=stages, expert=expert)
    check_batches(out, workload)
    return out


#: The task whose placement gives each verl model's expert parallelism.
TASK_OF_MODEL = {"rollout": "actor_generation", "actor": "actor_training",
                 "ref": "reference_inference", "critic": "critic_training",
                 "reward": "reward_inference"}


def expert_parallel(plan: Plan, workload: WorkloadSpec, layout: VerlLayout,
                    notes: list[str]) -> dict[str, int]:
    """Per model of ``layout`` with experts, the expert parallelism verl runs it with: its
    task's ``ep`` where that divides the exported layout's data parallelism (verl runs each
    model on all of its pool's GPUs), else the largest power of two <= ep that does (a note
    says so); Megatron models only under the megatron strategy (FSDP has none)."""
    out = {}
    for model, (tp, pp) in layout.layouts.items():
        task = TASK_OF_MODEL[model]
        shape = workload.model(workload.task(task).role)
        if shape.moe is None:
            continue
        p = plan.placement(task)
        if model not in VLLM_MODELS and layout.strategy != "megatron":
            if p.ep > 1:
                notes.append(f"{model}: ep {p.ep} is not exported: verl's FSDP workers have no "
                             "expert parallelism")
            continue
        dp = len(layout.pool(_pool_name(layout, model)).devices) // (tp * pp)
        ep = p.ep
        while ep > 1 and (dp % ep or shape.moe.experts % ep):
            ep //= 2
        if ep != p.ep:
            notes.append(f"{model}: ep {p.ep} does not divide the exported data parallelism "
                         f"({dp}); exported as ep {ep}")
        if ep > 1:
            out[model] = ep
    return out


#: The models verl serves on vLLM (no pipeline parallelism).
VLLM_MODELS = ("rollout", "reward")


def nearest_layout(tp: int, pp: int, gpus: int, per_node: int,
                   max_pp: int | None = None) -> tuple[int, int]:
    """The (tp, pp) nearest to ``(tp, pp)`` (in log ratio, then the larger tp x pp) whose product
    divides ``gpus``, with tp inside a node (at most ``per_node``) and pp at most ``max_pp``."""
    best = None
    for t in range(1, min(gpus, per_node) + 1):
        if gpus % t:
            continue
        for q in range(1, min(gpus // t, max_pp or gpus) + 1):
            if (gpus // t) % q:
                continue
            score = (abs(math.log(t / tp)) + abs(math.log(q / pp)), -t * q)
            if best is None or score < best[0]:
                best = (score, (t, q))
    assert best is not None  # (1, 1) always divides
    return best[1]


def is_megatron_split(stages: tuple[int, ...]) -> bool:
    """Whether Megatron can run ``stages``: every stage but the first and the last the same
    size (``num_layers_in_first_pipeline_stage`` / ``_last_`` set the two ends)."""
    return all(n >= 1 for n in stages) and len(set(stages[1:-1])) <= 1


def megatron_stages(layers: int, pp: int, own: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """``layers`` over ``pp`` stages as Megatron runs them: ``own`` (the plan's split) if
    Megatron can, else the split whose largest stage is smallest, with equal middle stages and
    the remainder on the two ends (fewer there: they hold the embedding and the head)."""
    if own is not None and sum(own) == layers and len(own) == pp and is_megatron_split(own):
        return own
    if pp == 1 or layers % pp == 0:
        return (layers // pp,) * pp
    best = None
    for mid in range(1, layers):
        rest = layers - mid * (pp - 2)
        if rest < 2:
            break
        first = rest // 2
        split = (first,) + (mid,) * (pp - 2) + (rest - first,)
        key = (max(split), abs(split[-1] - mid))
        if best is None or key < best[0]:
            best = (key, split)
    if best is None:  # (fewer layers than stages: refused by the plan's validation before)
        raise SpecError("pp", pp, f"more pipeline stages than the model's {layers} layers")
    return best[1]


def _pool_name(layout: VerlLayout, model: str) -> str:
    if model == "rollout":
        return layout.rollout_pool
    if model == "reward":
        return layout.reward_pool or "global_pool"
    return "global_pool"


#: The model (layout) each task runs with in verl.
MODEL_OF_TASK = {"actor_generation": "rollout", "actor_training": "actor",
                 "actor_inference": "actor", "reference_inference": "ref",
                 "critic_inference": "critic", "critic_training": "critic",
                 "reward_inference": "reward"}


def closest_plan(layout: VerlLayout, workload: WorkloadSpec, cluster: ClusterSpec) -> Plan:
    """The hetrl Plan of what verl runs from ``layout``: one group per pool, every task on all
    of its pool's GPUs (in device order: tp ranks on consecutive GPUs), equal data shares, even
    layer splits. Validated."""
    tasks_in: dict[str, list[str]] = {p.name: [] for p in layout.pools}
    placements = []
    for t in workload.task_names:
        model = MODEL_OF_TASK[t]
        pool = layout.pool(_pool_name(layout, model))
        tasks_in[pool.name].append(t)
        tp, pp = layout.layouts[model]
        n = len(pool.devices)
        kind = workload.task(t).kind
        backend = "fsdp" if layout.strategy == "fsdp" and kind != "generation" \
            and model != "reward" else "megatron"  # (verl serves the reward model on vLLM)
        layers = workload.model(workload.task(t).role).layers
        placements.append(make_placement(t, pool.devices, n // (tp * pp), pp, tp, layers,
                                         layers_per_stage=layout.stages.get(
                                             model, even_layers(layers, pp)),
                                         backend=backend, ep=layout.expert.get(model, 1)))
    groups = tuple(TaskGroup(tuple(ts), p.devices) for p in layout.pools
                   for ts in [tasks_in[p.name]] if ts)
    plan = Plan(groups, tuple(placements),
                Provenance(scheduler="verl-export", note=f"closest verl {VERL_VERSION} plan"),
                made_for=made_for(workload, cluster))
    try:
        validate(plan, workload, cluster)
    except SpecError as exc:  # (e.g. an FP8 rollout spread over a pool with A100s)
        raise SpecError(f"verl's closest plan: {exc.field}", exc.value,
                        f"{exc.problem} (verl runs each model on all of its pool's GPUs)"
                        ) from None
    return plan


def resource_pools(layout: VerlLayout, workload: WorkloadSpec) -> dict[str, Any]:
    """The custom section: ResourcePoolManager's arguments and each pool's nodes."""
    mapping = {}
    for t in workload.task_names:
        role = ROLE_OF_TASK[t]
        if role == "Rollout" and layout.rollout_pool == "global_pool":
            continue  # the hybrid engine: the actor's workers serve the rollout
        mapping[role] = _pool_name(layout, MODEL_OF_TASK[t])
    return {"resource_pool_spec": {p.name: [p.gpus_per_node] * len(p.nodes) for p in layout.pools},
            "mapping": mapping,
            "nodes": {p.name: list(p.nodes) for p in layout.pools},
            "devices": {p.name: list(p.devices) for p in layout.pools}}


# --- what verl cannot express -------------------------------------------------------------------

def differences(plan: Plan, layout: VerlLayout, closest: Plan, workload: WorkloadSpec,
                cluster: ClusterSpec) -> list[str]:
    """How the closest verl plan differs from ``plan``, one sentence each."""
    out = list(layout.notes)
    for p in plan.placements:
        if max(p.data_shares) - min(p.data_shares) > 1e-9:
            out.append(f"{p.task}: uneven data shares per replica "
                       f"({', '.join(f'{100 * s:.0f}%' for s in p.data_shares[:8])}"
                       f"{', ...' if p.dp > 8 else ''}); verl splits the batch evenly")
        c = closest.placement(p.task)
        if p.pp > 1 and p.pp == c.pp and tuple(p.layers_per_stage) != tuple(c.layers_per_stage):
            out.append(f"{p.task}: uneven layer split {list(p.layers_per_stage)}; Megatron sets "
                       "only the first and the last stage apart (the others are equal): "
                       f"exported as {list(c.layers_per_stage)}")
        if (p.dp, p.pp, p.tp, p.backend) != (c.dp, c.pp, c.tp, c.backend) or \
                set(p.device_ids) != set(c.device_ids):
            out.append(f"{p.task}: (dp, pp, tp) = ({p.dp}, {p.pp}, {p.tp}) {p.backend} on "
                       f"{len(p.device_ids)} GPUs becomes ({c.dp}, {c.pp}, {c.tp}) {c.backend} "
                       f"on {len(c.device_ids)}: verl runs each model on all of its pool's GPUs "
                       "with one layout per model")
        if p.ep != c.ep:
            out.append(f"{p.task}: ep {p.ep} becomes {c.ep} (verl runs one expert parallelism "
                       "per model)")
        if p.offload:
            out.append(f"{p.task}: offload is not exported (set the fsdp_config offload keys by "
                       "hand); the closest plan does not offload")
    for model, split in layout.stages.items():
        if len(set(split)) > 1:
            out.append(f"{model}: {sum(split)} layers over pp {len(split)} stages as {list(split)} "
                       "(override_transformer_config.num_layers_in_first_pipeline_stage / "
                       "_last_pipeline_stage)")
    if ref_stage_override(layout) is not None:
        out.append("ref: its Megatron override_transformer_config is written apart from the "
                   "actor's (verl's reference inherits the actor's; here only its own stage "
                   "split): the actor's other overrides (attention backend, recomputation) do "
                   "not reach it")
    budgets = token_budgets(workload)
    if budgets is not None and None in (workload.micro_batch_tokens,
                                        workload.inference_micro_batch_tokens):
        out.append("verl asserts actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz: the "
                   "workload batches one of training and inference by tokens, the other by count; "
                   f"both are exported by tokens ({budgets[0]} training, {budgets[1]} inference "
                   "per GPU: the count x the longest sequence); both estimates keep the "
                   "workload's")
    if "critic" in layout.layouts and budgets is not None and budgets[0] != budgets[1]:
        out.append(f"critic_inference: verl's v1 critic engine uses one token budget "
                   f"(critic.ppo_infer_max_token_len_per_gpu, {budgets[0]}) for training and "
                   f"values, not {budgets[1]}; both estimates keep the workload's")
    for pool in layout.pools:
        types = sorted({cluster.devices[d].gpu.name for d in pool.devices})
        if len(types) > 1:
            out.append(f"{pool.name} mixes GPU types ({', '.join(types)}): verl treats a pool's "
                       "GPUs alike (even shares, one layout)")
    if len(plan.groups) != len(closest.groups):
        out.append(f"{len(plan.groups)} task groups become {len(closest.groups)} verl pools "
                   f"({', '.join(p.name for p in layout.pools)})")
    if workload.mode == "sync" and plan.group_of("actor_generation") != plan.group_of(
            "actor_training"):
        out.append("generation has GPUs of its own, but verl's sync trainer runs it on the "
                   "hybrid engine, in global_pool")
    if workload.mode == "async" and workload.staleness > 1:
        out.append(f"staleness {workload.staleness}: verl's async trainers bound it "
                   "differently (trainer.v1.sampler.max_off_policy_threshold); not exported")
    if plan.sync_relay:
        out.append("the weight sync's relay (sync_relay: one copy into each region without "
                   "training, then a fan-out inside it) is not exported: verl has no relay, "
                   "every rollout GPU pulls its weights from the trainer; the closest plan is "
                   "priced without it")
    if not workload.recompute_logprobs:
        out.append("the workload does not recompute old log-probs (recompute_logprobs: false); "
                   "verl does (actor compute_log_prob): both estimates leave it out")
    return out


# --- reading an export back ---------------------------------------------------------------------

def layout_from_overrides(data: Mapping[str, Any], workload: WorkloadSpec,
                          cluster: ClusterSpec) -> VerlLayout:
    """The placement an exported overrides file describes (its verl keys and its custom
    section): what :func:`closest_plan` builds the closest plan from."""
    flat = flatten({k: v for k, v in data.items() if k != CUSTOM_SECTION})
    custom = data.get(CUSTOM_SECTION)
    if not isinstance(custom, Mapping) or not isinstance(custom.get("devices"), Mapping):
        raise SpecError(CUSTOM_SECTION, custom, "needs its 'devices' per pool (written by hetrl "
                        "export)")

    def get(key: str, default: Any = None) -> Any:
        return flat.get(key, default)

    strategy = get("actor_rollout_ref.actor.strategy", "fsdp")
    pools = tuple(_pool_of(name, list(devs), cluster) for name, devs in custom["devices"].items())
    stages: dict[str, tuple[int, ...]] = {}
    layouts = {"rollout": (get("actor_rollout_ref.rollout.tensor_model_parallel_size", 1),
                           get("actor_rollout_ref.rollout.pipeline_model_parallel_size", 1))}
    for model, prefix, task in (("actor", "actor_rollout_ref.actor", "actor_training"),
                                ("ref", "actor_rollout_ref.ref", "reference_inference"),
                                ("critic", "critic", "critic_training")):
        if task in workload.task_names:
            layouts[model] = (get(f"{prefix}.megatron.tensor_model_parallel_size", 1),
                              get(f"{prefix}.megatron.pipeline_model_parallel_size", 1)) \
                if strategy == "megatron" else (1, 1)
            pp = layouts[model][1]
            if pp > 1:
                layers = workload.model(workload.task(task).role).layers
                keys = [f"{prefix}.megatron.override_transformer_config.num_layers_in_"
                        f"{end}_pipeline_stage" for end in ("first", "last")]
                if model == "ref" and not any(k in flat for k in keys):
                    # verl's reference inherits the actor's override_transformer_config
                    keys = [k.replace(prefix, "actor_rollout_ref.actor", 1) for k in keys]
                ends = [get(k) for k in keys]
                stages[model] = megatron_stages(layers, pp) if None in ends else \
                    (ends[0],) + ((layers - sum(ends)) // (pp - 2),) * (pp - 2) + (ends[1],)
    expert = {}
    for model, key in ([(m, f"{prefix}.megatron.expert_model_parallel_size")
                        for m, prefix in MEGATRON_MODELS]
                       + [("rollout", "actor_rollout_ref.rollout.data_parallel_size"),
                          ("reward", "reward.reward_model.rollout.data_parallel_size")]):
        if model in layouts and (get(key) or 1) > 1:
            expert[model] = get(key)
    reward = None
    if get("reward.reward_model.enable", False):
        layouts["reward"] = (get("reward.reward_model.rollout.tensor_model_parallel_size", 1),
                             get("reward.reward_model.rollout.pipeline_model_parallel_size", 1))
        reward = "reward_pool" if get("reward.reward_model.enable_resource_pool") else \
            "global_pool"
    rollout = "rollout_pool" if get("actor_rollout_ref.hybrid_engine", True) is False else \
        "global_pool"
    return VerlLayout(strategy, rollout, reward, pools, layouts, stages=stages,
                      expert={m: e for m, e in expert.items() if m in layouts})
