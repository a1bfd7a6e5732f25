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
FSDP), equal data shares and, under Megatron, even layer splits. The rules that map a hetrl plan
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
   and the differences say so;
5. the strategy (``fsdp`` or ``megatron``) is the actor trainer's backend, for every model.

A custom section, ``hetrl_resource_pools``, writes those pools as verl's
``ResourcePoolManager(resource_pool_spec, mapping)`` arguments and the nodes each pool should
hold: verl's config has no key for them (the trainer builds them in code) nor for which nodes a
pool takes (Ray places it), so verl does not read that section.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hetrl.errors import SpecError
from hetrl.fingerprint import made_for
from hetrl.plan import Plan, Provenance, TaskGroup, even_layers, make_placement, validate
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec

VERL_VERSION = "0.9.1"
CUSTOM_SECTION = "hetrl_resource_pools"
CONFIG_NAMES = {"fsdp": "ppo_trainer", "megatron": "ppo_megatron_trainer"}
#: vLLM's share of a GPU when the workload leaves it open (``gen_gpu_memory_utilization: null``):
#: verl's default when the rollout shares GPUs with training, vLLM's own on a standalone pool.
DEFAULT_GPU_MEMORY_UTILIZATION = {"hybrid": 0.5, "standalone": 0.9}
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
        if n % (tp * pp):
            layouts[model] = near = nearest_layout(tp, pp, n, pool.gpus_per_node)
            notes.append(f"{model}: (tp, pp) = ({tp}, {pp}) does not divide the {n} GPUs of "
                         f"{pool.name} (verl runs every model on all of its pool's GPUs); "
                         f"exported as the nearest that does, ({near[0]}, {near[1]})")
    return replace(out, notes=tuple(notes))  # (``layouts`` is out's own dict, amended above)


def nearest_layout(tp: int, pp: int, gpus: int, per_node: int) -> tuple[int, int]:
    """The (tp, pp) nearest to ``(tp, pp)`` (in log ratio, then the larger tp x pp) whose product
    divides ``gpus``, with tp inside a node (at most ``per_node``)."""
    best = None
    for t in range(1, min(gpus, per_node) + 1):
        if gpus % t:
            continue
        for q in range(1, gpus // t + 1):
            if (gpus // t) % q:
                continue
            score = (abs(math.log(t / tp)) + abs(math.log(q / pp)), -t * q)
            if best is None or score < best[0]:
                best = (score, (t, q))
    assert best is not None  # (1, 1) always divides
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
                                         layers_per_stage=even_layers(layers, pp),
                                         backend=backend))
    groups = tuple(TaskGroup(tuple(ts), p.devices) for p in layout.pools
                   for ts in [tasks_in[p.name]] if ts)
    plan = Plan(groups, tuple(placements),
                Provenance(scheduler="verl-export", note=f"closest verl {VERL_VERSION} plan"),
                made_for=made_for(workload, cluster))
    validate(plan, workload, cluster)
    return plan


# --- the overrides ------------------------------------------------------------------------------

def _hf_path(name: str) -> str | None:
    """The Hugging Face id of a built-in Qwen3 model (None for others: the user fills it in)."""
    return f"Qwen/{name}" if name.startswith("Qwen3-") else None


def overrides(layout: VerlLayout, workload: WorkloadSpec) -> dict[str, Any]:
    """verl's config keys (dotted) and values for ``layout`` and ``workload``."""
    wl = workload
    g = layout.pool("global_pool")
    out: dict[str, Any] = {
        "algorithm.adv_estimator": "gae" if wl.algorithm == "ppo" else "grpo",
        "data.train_batch_size": wl.batch_prompts,
        "data.max_prompt_length": wl.prompt_length.max,
        "data.max_response_length": wl.response_length.max,
        "trainer.nnodes": len(g.nodes),
        "trainer.n_gpus_per_node": g.gpus_per_node,
        "actor_rollout_ref.actor.strategy": layout.strategy,
        "actor_rollout_ref.actor.ppo_mini_batch_size": wl.batch_prompts // wl.optimizer_steps,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": wl.micro_batch_size,
        "actor_rollout_ref.actor.use_dynamic_bsz": wl.micro_batch_tokens is not None,
        "actor_rollout_ref.model.use_remove_padding": wl.remove_padding,
        "actor_rollout_ref.model.enable_gradient_checkpointing": wl.recompute,
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.n": wl.responses_per_prompt,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": layout.layouts["rollout"][0],
        "actor_rollout_ref.rollout.pipeline_model_parallel_size": layout.layouts["rollout"][1],
        "actor_rollout_ref.rollout.max_num_seqs": wl.gen_max_concurrency,
        "actor_rollout_ref.rollout.enforce_eager": not wl.gen_cuda_graphs,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu":
            wl.inference_micro_batch_size,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": wl.inference_micro_batch_size,
    }
    path = _hf_path(wl.model("actor").name)
    if path:
        out["actor_rollout_ref.model.path"] = path
    if wl.micro_batch_tokens is not None:
        out["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] = wl.micro_batch_tokens
    if wl.inference_micro_batch_tokens is not None:
        for role in ("rollout", "ref"):
            out[f"actor_rollout_ref.{role}.log_prob_use_dynamic_bsz"] = True
            out[f"actor_rollout_ref.{role}.log_prob_max_token_len_per_gpu"] = \
                wl.inference_micro_batch_tokens
    standalone = layout.rollout_pool == "rollout_pool"
    util = wl.gen_gpu_memory_utilization
    out["actor_rollout_ref.rollout.gpu_memory_utilization"] = util if util is not None else \
        DEFAULT_GPU_MEMORY_UTILIZATION["standalone" if standalone else "hybrid"]
    if wl.mode == "sync":
        out["trainer.v1.trainer_mode"] = "sync"
    elif standalone:
        r = layout.pool("rollout_pool")
        out.update({"trainer.v1.trainer_mode": "separate_async",
                    "trainer.v1.separate_async.parameter_sync_step": wl.optimizer_steps,
                    "actor_rollout_ref.hybrid_engine": False,
                    "actor_rollout_ref.rollout.nnodes": len(r.nodes),
                    "actor_rollout_ref.rollout.n_gpus_per_node": r.gpus_per_node,
                    "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl"})
    else:
        out["trainer.v1.trainer_mode"] = "colocate_async"
    if layout.strategy == "megatron":
        for model, prefix in (("actor", "actor_rollout_ref.actor"), ("ref", "actor_rollout_ref.ref"),
                              ("critic", "critic")):
            if model in layout.layouts:
                tp, pp = layout.layouts[model]
                out[f"{prefix}.megatron.tensor_model_parallel_size"] = tp
                out[f"{prefix}.megatron.pipeline_model_parallel_size"] = pp
    if "critic" in layout.layouts:
        out.update({
            "critic.strategy": layout.strategy,
            "critic.ppo_micro_batch_size_per_gpu": wl.micro_batch_size,
            "critic.use_dynamic_bsz": wl.micro_batch_tokens is not None,
            "critic.model.use_remove_padding": wl.remove_padding,
            "critic.model.enable_gradient_checkpointing": wl.recompute,
        })
        if layout.strategy == "fsdp":  # (Megatron's critic has no key of its own for it)
            out["critic.forward_micro_batch_size_per_gpu"] = wl.inference_micro_batch_size
        if path:
            out["critic.model.path"] = path
        if wl.micro_batch_tokens is not None:
            out["critic.ppo_max_token_len_per_gpu"] = wl.micro_batch_tokens
        if wl.inference_micro_batch_tokens is not None:
            out["critic.forward_max_token_len_per_gpu"] = wl.inference_micro_batch_tokens
    if layout.reward_pool is not None:
        out["reward.reward_model.enable"] = True
        out["reward.reward_model.rollout.name"] = "vllm"
        out["reward.reward_model.rollout.tensor_model_parallel_size"] = layout.layouts["reward"][0]
        out["reward.reward_model.rollout.pipeline_model_parallel_size"] = \
            layout.layouts["reward"][1]
        out["reward.reward_model.enable_resource_pool"] = layout.reward_pool == "reward_pool"
        if layout.reward_pool == "reward_pool":
            rp = layout.pool("reward_pool")
            out["reward.reward_model.nnodes"] = len(rp.nodes)
            out["reward.reward_model.n_gpus_per_node"] = rp.gpus_per_node
    return out


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


def nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys as nested mappings."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (lists are values)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


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
        layers = workload.model(workload.task(p.task).role).layers
        if p.pp > 1 and tuple(p.layers_per_stage) != even_layers(layers, p.pp):
            out.append(f"{p.task}: uneven layer split {list(p.layers_per_stage)}; verl splits "
                       "the layers evenly over the pipeline stages")
        c = closest.placement(p.task)
        if (p.dp, p.pp, p.tp, p.backend) != (c.dp, c.pp, c.tp, c.backend) or \
                set(p.device_ids) != set(c.device_ids):
            out.append(f"{p.task}: (dp, pp, tp) = ({p.dp}, {p.pp}, {p.tp}) {p.backend} on "
                       f"{len(p.device_ids)} GPUs becomes ({c.dp}, {c.pp}, {c.tp}) {c.backend} "
                       f"on {len(c.device_ids)}: verl runs each model on all of its pool's GPUs "
                       "with one layout per model")
        if p.offload:
            out.append(f"{p.task}: offload is not exported (set the fsdp_config offload keys by "
                       "hand); the closest plan does not offload")
    if layout.strategy == "megatron":
        for model, (_tp, pp) in layout.layouts.items():
            role = {"rollout": "actor", "ref": "reference"}.get(model, model)
            layers = workload.model(role).layers
            if model not in ("rollout", "reward") and layers % pp:
                out.append(f"{model}: pp {pp} does not divide {layers} layers; Megatron then "
                           "needs num_layers_in_first_pipeline_stage / _last_ set by hand "
                           "(not exported; the closest plan splits as evenly as it can)")
    if layout.strategy == "megatron" and "critic" in layout.layouts and \
            workload.inference_micro_batch_size != workload.micro_batch_size:
        out.append(f"critic_inference: verl's Megatron critic computes values in micro-batches "
                   f"of ppo_micro_batch_size_per_gpu ({workload.micro_batch_size}), not "
                   f"{workload.inference_micro_batch_size}; both estimates keep the workload's")
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
    if workload.reward == "model" and not workload.model("reward").name.startswith("Qwen3-"):
        out.append("the reward model's path is not exported (reward.reward_model.model_path)")
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
    layouts = {"rollout": (get("actor_rollout_ref.rollout.tensor_model_parallel_size", 1),
                           get("actor_rollout_ref.rollout.pipeline_model_parallel_size", 1))}
    for model, prefix, task in (("actor", "actor_rollout_ref.actor", "actor_training"),
                                ("ref", "actor_rollout_ref.ref", "reference_inference"),
                                ("critic", "critic", "critic_training")):
        if task in workload.task_names:
            layouts[model] = (get(f"{prefix}.megatron.tensor_model_parallel_size", 1),
                              get(f"{prefix}.megatron.pipeline_model_parallel_size", 1)) \
                if strategy == "megatron" else (1, 1)
    reward = None
    if get("reward.reward_model.enable", False):
        layouts["reward"] = (get("reward.reward_model.rollout.tensor_model_parallel_size", 1),
                             get("reward.reward_model.rollout.pipeline_model_parallel_size", 1))
        reward = "reward_pool" if get("reward.reward_model.enable_resource_pool") else \
            "global_pool"
    rollout = "rollout_pool" if get("actor_rollout_ref.hybrid_engine", True) is False else \
        "global_pool"
    return VerlLayout(strategy, rollout, reward, pools, layouts)


# --- the file -----------------------------------------------------------------------------------

def command_line(flat: Mapping[str, Any], strategy: str) -> str:
    """The verl command a user would type: its entry point and every override."""
    def value(v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)
    args = " \\\n    ".join(f"{k}={value(v)}" for k, v in flat.items())
    name = CONFIG_NAMES[strategy]
    config = f" --config-name={name}" if name != "ppo_trainer" else ""
    return f"python3 -m verl.trainer.main_ppo{config} \\\n    {args}"


def render(flat: Mapping[str, Any], pools: Mapping[str, Any], header: list[str]) -> str:
    """The overrides file: a comment block, verl's keys nested, then the custom section."""
    import yaml

    lines = [f"# {line}" if line else "#" for line in header]
    body = yaml.safe_dump(nested(flat), sort_keys=False)
    custom = yaml.safe_dump({CUSTOM_SECTION: dict(pools)}, sort_keys=False,
                            default_flow_style=None)
    note = ["", f"# {CUSTOM_SECTION}: NOT a verl key (verl does not read it). verl's trainer "
            "builds", "# ResourcePoolManager(resource_pool_spec, mapping) in code from the keys "
            "above;", "# this section writes those arguments out, and the nodes and devices each "
            "pool", "# should hold (Ray places pools itself). `hetrl export` reads it back to "
            "rebuild", "# the closest plan."]
    return "\n".join(lines) + "\n" + body + "\n".join(note) + "\n" + custom
