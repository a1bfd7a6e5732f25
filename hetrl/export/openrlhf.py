"""A plan as an OpenRLHF launch script (``hetrl export --to openrlhf``), and the closest OpenRLHF
plan as a hetrl Plan, so that both can be estimated and compared.

Written against OpenRLHF :data:`OPENRLHF_VERSION` (``openrlhf/cli/train_ppo_ray.py``: its
``parser.add_argument`` calls, which the tests rebuild into a parser and parse every exported
flag with; ``train()`` there and ``trainer/ray/launcher.py`` for placement).

What OpenRLHF runs: five models, each a Ray placement group of ``num_nodes x num_gpus_per_node``
GPUs (only the product matters: the group's bundles are packed by Ray onto GPUs it chooses):
vLLM engines (``--vllm.num_engines`` x ``--vllm.tensor_parallel_size``: generation), and the
DeepSpeed actor (training and its old log-probs), reference, critic (values and training) and
reward model, all data parallel under one ZeRO stage (no tensor or pipeline parallelism). Models
share GPUs only as three flags say:

- ``--train.colocate_all``: every model on the actor's GPUs (sync); in async training
  (``--train.async_enable``) only the DeepSpeed models, the vLLM engines apart;
- ``--train.colocate_actor_ref``: the actor and the reference;
- ``--train.colocate_critic_reward``: the critic and the reward model.

The rules that map a hetrl plan onto that (docs/users.md, "Export to OpenRLHF"):

1. generation in actor_training's group: sync, ``colocate_all`` on all of the plan's GPUs (the
   other groups merge in); async is refused (OpenRLHF's async engines need GPUs of their own);
2. otherwise, async with every DeepSpeed model in actor_training's group: ``colocate_all``;
3. otherwise the actor and reference share GPUs (``colocate_actor_ref``) when their tasks share
   a group, and so do the critic and reward model (``colocate_critic_reward``); every other model
   has GPUs of its own;
4. the placement groups that rules 1-3 put in one hetrl group split its GPUs in device order, in
   proportion to their models' parameters (at least one GPU each);
5. the ZeRO stage is 3 when any DeepSpeed task is FSDP (hetrl's ZeRO-3) or uses Megatron's
   tensor or pipeline parallelism (which ZeRO-3's sharding stands in for), else 1 (Megatron's
   distributed optimizer); vLLM's tp is the plan's tp x pp where it divides the engines' GPUs
   (vLLM's pipeline parallelism is not exposed), else the nearest that does.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetrl.errors import SpecError
from hetrl.export.verl import nearest_layout
from hetrl.fingerprint import made_for
from hetrl.plan import Plan, Provenance, TaskGroup, even_layers, make_placement, validate
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.model import hf_id
from hetrl.spec.workload import WorkloadSpec

OPENRLHF_VERSION = "0.11.2"
ENTRY_POINT = ("python3", "-m", "openrlhf.cli.train_ppo_ray")
#: OpenRLHF's models, in the order they are written; each one's main hetrl task.
MODELS = ("vllm", "actor", "ref", "critic", "reward")
TASK_OF_MODEL = {"vllm": "actor_generation", "actor": "actor_training",
                 "ref": "reference_inference", "critic": "critic_training",
                 "reward": "reward_inference"}
MODEL_OF_TASK = {"actor_generation": "vllm", "actor_training": "actor",
                 "actor_inference": "actor", "reference_inference": "ref",
                 "critic_inference": "critic", "critic_training": "critic",
                 "reward_inference": "reward"}
ROLE_OF_MODEL = {"vllm": "actor", "actor": "actor", "ref": "reference", "critic": "critic",
                 "reward": "reward"}
#: vLLM's share of a GPU when the workload leaves it open: OpenRLHF's colocated recipes' (the
#: engines share GPUs with DeepSpeed) and its own default (GPUs of their own).
DEFAULT_GPU_MEMORY_UTILIZATION = {"colocated": 0.5, "own": 0.95}
#: OpenRLHF's default KL coefficient (``--algo.kl.init_coef``); 0 drops the reference model.
KL_COEF = 0.01
#: ``--model-path`` roles: the paths OpenRLHF takes (the reference loads the actor's).
PATH_ROLES = ("actor", "critic", "reward")


@dataclass(frozen=True)
class Group:
    """An OpenRLHF placement group: the models sharing its GPUs and the devices it should get."""

    models: tuple[str, ...]
    devices: tuple[int, ...]


@dataclass(frozen=True)
class OpenRLHFLayout:
    """What the exported flags say about placement."""

    groups: tuple[Group, ...]
    colocate_all: bool
    colocate_actor_ref: bool
    colocate_critic_reward: bool
    vllm_tp: int
    zero_stage: int
    notes: tuple[str, ...] = ()

    def devices(self, model: str) -> tuple[int, ...]:
        return next(g.devices for g in self.groups if model in g.models)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(m for m in MODELS if any(m in g.models for g in self.groups))


def _present(workload: WorkloadSpec) -> list[str]:
    return [m for m in MODELS if TASK_OF_MODEL[m] in workload.task_names]


def _params(workload: WorkloadSpec, models: Sequence[str]) -> int:
    return sum(workload.model(ROLE_OF_MODEL[m]).params for m in models)


def _split(devices: Sequence[int], sets: list[tuple[str, ...]],
           workload: WorkloadSpec) -> list[tuple[int, ...]]:
    """``devices`` (sorted) in consecutive blocks, one per set, in proportion to each set's
    parameters (largest remainder, at least one each) (rule 4)."""
    devs, k = sorted(devices), len(sets)
    if len(devs) < k:
        raise SpecError("plan", f"{len(devs)} GPUs for {', '.join('+'.join(s) for s in sets)}",
                        f"OpenRLHF gives these {k} placement groups GPUs of their own: "
                        f"the group needs at least {k}")
    weights = [_params(workload, s) for s in sets]
    spare = len(devs) - k
    exact = [spare * w / sum(weights) for w in weights]
    counts = [1 + math.floor(e) for e in exact]
    for i in sorted(range(k), key=lambda i: math.floor(exact[i]) - exact[i])[
            :len(devs) - sum(counts)]:
        counts[i] += 1
    out, start = [], 0
    for c in counts:
        out.append(tuple(devs[start:start + c]))
        start += c
    return out


def openrlhf_layout(plan: Plan, workload: WorkloadSpec, cluster: ClusterSpec) -> OpenRLHFLayout:
    """The OpenRLHF placement closest to ``plan`` (rules 1-5 of the module); raises SpecError
    where OpenRLHF cannot come close."""
    present = _present(workload)
    deepspeed = [m for m in present if m != "vllm"]
    group_of = {m: plan.group_of(TASK_OF_MODEL[m]) for m in present}
    notes: list[str] = []
    car = ccr = False
    if group_of["vllm"] == group_of["actor"]:
        if workload.mode == "async":
            raise SpecError("plan", "actor_generation shares its GPUs with actor_training",
                            f"OpenRLHF {OPENRLHF_VERSION}'s async trainer (--train.async_enable) "
                            "runs the vLLM engines on GPUs of their own (--train.colocate_all "
                            "then colocates only the DeepSpeed models)")
        colocate_all = True
        groups = [Group(tuple(present), plan.device_ids)]
    else:
        colocate_all = workload.mode == "async" and len(deepspeed) > 1 and all(
            group_of[m] == group_of["actor"] for m in deepspeed)
        if colocate_all:
            sets = [("vllm",), tuple(deepspeed)]
        else:
            car = "ref" in present and group_of["ref"] == group_of["actor"]
            ccr = {"critic", "reward"} <= set(present) and group_of["critic"] == \
                group_of["reward"]
            sets = [(m,) for m in present if not (car and m == "ref") and
                    not (ccr and m == "reward")]
            sets = [("actor", "ref") if s == ("actor",) and car else
                    ("critic", "reward") if s == ("critic",) and ccr else s for s in sets]
        hosted: dict[TaskGroup, list[tuple[str, ...]]] = {}
        for s in sets:
            hosted.setdefault(group_of[s[0]], []).append(s)
        groups = []
        for g, ss in hosted.items():
            for s, devs in zip(ss, _split(g.devices, ss, workload), strict=True):
                groups.append(Group(s, devs))
            if len(ss) > 1:
                notes.append(f"the {len(g.devices)} GPUs of one task group are split between "
                             f"placement groups {', '.join('+'.join(s) for s in ss)} "
                             f"({', '.join(str(len(d)) for d in _split(g.devices, ss, workload))}"
                             " GPUs, by parameters): OpenRLHF colocates only actor+ref, "
                             "critic+reward, or everything (--train.colocate_all)")
        unused = sorted(set(plan.device_ids) - {d for g in groups for d in g.devices})
        if unused:
            notes.append(f"{len(unused)} GPUs of the plan hold no model's main task and are "
                         "not used: OpenRLHF runs each task on its model's GPUs")
        groups.sort(key=lambda g: MODELS.index(g.models[0]))
    gen = plan.placement("actor_generation")
    n_gen = len(next(g.devices for g in groups if "vllm" in g.models))
    per_node = max(_per_node(next(g.devices for g in groups if "vllm" in g.models),
                             cluster).values())
    tp = gen.tp * gen.pp
    if n_gen % tp or tp > per_node:
        near = nearest_layout(tp, 1, n_gen, per_node)[0]
        notes.append(f"vllm: tp x pp = {tp} does not divide the engines' {n_gen} GPUs inside a "
                     f"node; exported as tp {near}")
        tp = near
    if gen.pp > 1:
        notes.append(f"actor_generation: pp {gen.pp} x tp {gen.tp} becomes vLLM tp {tp} (OpenRLHF "
                     "exposes no vLLM pipeline parallelism)")
    zero3 = any(plan.placement(t).backend == "fsdp" or plan.placement(t).tp *
                plan.placement(t).pp > 1 for t in workload.task_names
                if t != "actor_generation")
    return OpenRLHFLayout(tuple(groups), colocate_all, car, ccr, tp, 3 if zero3 else 1,
                          tuple(notes))


def _per_node(devices: Sequence[int], cluster: ClusterSpec) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in sorted(devices):
        out[cluster.devices[d].node] = out.get(cluster.devices[d].node, 0) + 1
    return out


def shape(devices: Sequence[int], cluster: ClusterSpec) -> tuple[int, int]:
    """(num_nodes, num_gpus_per_node) for ``devices``: their nodes when each gives the same
    count, else one "node" of all of them (OpenRLHF uses only the product: Ray packs the
    group's bundles over whichever nodes have GPUs free)."""
    counts = set(_per_node(devices, cluster).values())
    return (len(_per_node(devices, cluster)), counts.pop()) if len(counts) == 1 else \
        (1, len(devices))


def closest_plan(layout: OpenRLHFLayout, workload: WorkloadSpec, cluster: ClusterSpec) -> Plan:
    """The hetrl Plan of what OpenRLHF runs from ``layout``: one task group per distinct set of
    GPUs, each DeepSpeed task data parallel over all of its model's GPUs (ZeRO-3: fsdp; else
    Megatron's dp-only layout, a ZeRO-1 optimizer), the vLLM engines at ``vllm_tp``, equal data
    shares. Validated."""
    placements, tasks_on = [], {}
    for t in workload.task_names:
        model = MODEL_OF_TASK[t]
        devs = layout.devices(model)
        tasks_on.setdefault(devs, []).append(t)
        layers = workload.model(workload.task(t).role).layers
        if model == "vllm":
            placements.append(make_placement(t, devs, len(devs) // layout.vllm_tp, 1,
                                             layout.vllm_tp, layers))
        else:
            placements.append(make_placement(
                t, devs, len(devs), 1, 1, layers, layers_per_stage=even_layers(layers, 1),
                backend="fsdp" if layout.zero_stage == 3 else "megatron"))
    groups = tuple(TaskGroup(tuple(ts), devs) for devs, ts in tasks_on.items())
    plan = Plan(groups, tuple(placements),
                Provenance(scheduler="openrlhf-export",
                           note=f"closest OpenRLHF {OPENRLHF_VERSION} plan"),
                made_for=made_for(workload, cluster))
    validate(plan, workload, cluster)
    return plan


# --- the flags ----------------------------------------------------------------------------------

def check_value(field: str, value: str) -> str:
    """``value`` if OpenRLHF can take it as one argument: printable (no newline, NUL or other
    control character), not empty, not starting with ``-`` (argparse would read a flag)."""
    if not isinstance(value, str) or not value or not value.isprintable() or \
            value.startswith("-"):
        raise SpecError(field, value, "must be a non-empty printable string (no newline, NUL or "
                        "control character) not starting with '-': OpenRLHF takes it as one "
                        "command-line argument")
    return value


def model_paths(workload: WorkloadSpec, given: Mapping[str, str]) -> dict[str, str]:
    """Each ``--model-path`` role's path: ``given``, else the Hugging Face id of a built-in
    model (:func:`hetrl.spec.model.hf_id`); for a rule reward, the ``reward_func`` file OpenRLHF loads
    (``--reward.remote_url``, default ``reward_func.py``). Refuses a model with neither."""
    for role in given:
        if role not in PATH_ROLES:
            raise SpecError("--model-path", role, f"role must be one of {list(PATH_ROLES)} "
                            "(OpenRLHF's reference loads the actor's path)")
    roles = [r for r in PATH_ROLES if r in dict(workload.models)]
    out = {}
    for role in roles:
        name = workload.model(role).name
        path = given.get(role) or hf_id(name)
        if path is None:
            raise SpecError("--model-path", role, f"the {role} model {name!r} has no Hugging "
                            f"Face id hetrl knows: give --model-path {role}=PATH")
        out[role] = check_value(f"--model-path {role}", path)
    if workload.reward == "rule":
        out["reward"] = check_value("--model-path reward", given.get("reward", "reward_func.py"))
    return out


def flags(layout: OpenRLHFLayout, workload: WorkloadSpec, cluster: ClusterSpec,
          paths: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``train_ppo_ray``'s flags, in order: (flag, value), value None for a switch."""
    wl = workload
    out: list[tuple[str, str | None]] = []

    def put(flag: str, value: Any = None) -> None:
        out.append((flag, None if value is None else str(value)))

    for model in ("actor", "ref", "critic", "reward"):
        if model in layout.models:
            nodes, per_node = shape(layout.devices(model), cluster)
            put(f"--{model}.num_nodes", nodes)
            put(f"--{model}.num_gpus_per_node", per_node)
    engines = len(layout.devices("vllm")) // layout.vllm_tp
    put("--vllm.num_engines", engines)
    put("--vllm.tensor_parallel_size", layout.vllm_tp)
    shared = layout.colocate_all and wl.mode == "sync"
    util = wl.gen_gpu_memory_utilization
    put("--vllm.gpu_memory_utilization", util if util is not None else
        DEFAULT_GPU_MEMORY_UTILIZATION["colocated" if shared else "own"])
    if not wl.gen_cuda_graphs:
        put("--vllm.enforce_eager")
    if layout.colocate_all:
        put("--train.colocate_all")
    if layout.colocate_actor_ref:
        put("--train.colocate_actor_ref")
    if layout.colocate_critic_reward:
        put("--train.colocate_critic_reward")
    if shared and wl.gen_sleep_level > 0:
        put("--vllm.enable_sleep")
        put("--ds.enable_sleep")
    if wl.mode == "async":
        put("--train.async_enable")
        put("--train.async_queue_size", max(1, wl.staleness))
    put("--ds.zero_stage", layout.zero_stage)
    if wl.precision in ("bf16", "fp16"):
        put("--ds.param_dtype", wl.precision)
    if wl.task_recompute("actor_training"):  # (OpenRLHF's critic follows the actor's flag)
        put("--actor.gradient_checkpointing_enable")
    dynamic = wl.micro_batch_tokens is not None
    if wl.remove_padding or dynamic:
        put("--ds.packing_samples")
    if dynamic:
        put("--train.dynamic_batch_enable")
        put("--train.max_tokens_per_gpu", wl.micro_batch_tokens)
        if wl.inference_micro_batch_tokens is not None:
            put("--rollout.max_tokens_per_gpu", wl.inference_micro_batch_tokens)
    put("--algo.advantage.estimator", "gae" if wl.algorithm == "ppo" else "group_norm")
    put("--algo.kl.init_coef", KL_COEF if "ref" in layout.models else 0)
    if wl.kl == "loss" and "ref" in layout.models:
        put("--algo.kl.use_loss")
        put("--algo.kl.estimator", "k3")
    put("--rollout.batch_size", wl.batch_prompts)
    put("--rollout.n_samples_per_prompt", wl.responses_per_prompt)
    put("--train.batch_size", wl.batch_prompts * wl.responses_per_prompt // wl.optimizer_steps)
    put("--train.micro_batch_size", wl.micro_batch_size)
    put("--rollout.micro_batch_size", wl.inference_micro_batch_size)
    put("--data.max_len", wl.prompt_length.max + wl.response_length.max)
    put("--rollout.max_new_tokens", wl.response_length.max)
    put("--actor.model_name_or_path", paths["actor"])
    if "critic" in layout.models:
        put("--critic.model_name_or_path", paths["critic"])
    if "reward" in layout.models:
        put("--reward.model_name_or_path", paths["reward"])
    elif "reward" in paths:
        put("--reward.remote_url", paths["reward"])
    return out


def check_workload(workload: WorkloadSpec, layout: OpenRLHFLayout, cluster: ClusterSpec) -> None:
    """Refuse what OpenRLHF's own checks (train_ppo_ray.py's asserts) or its batch arithmetic
    would refuse, and the settings it has no flag for (:func:`check_settings`)."""
    wl = workload
    check_settings(wl)
    samples = wl.batch_prompts * wl.responses_per_prompt
    if samples % wl.optimizer_steps:
        raise SpecError("optimizer_steps", wl.optimizer_steps,
                        f"must divide the batch's {samples} samples: OpenRLHF's --train.batch_size "
                        "is a whole number of samples")
    if wl.algorithm == "grpo" and wl.responses_per_prompt < 2:
        raise SpecError("responses_per_prompt", wl.responses_per_prompt,
                        "OpenRLHF's group_norm (GRPO) estimator needs at least 2")
    actors = len(layout.devices("actor"))
    if samples // wl.inference_micro_batch_size < actors:
        raise SpecError("inference_micro_batch_size", wl.inference_micro_batch_size,
                        f"OpenRLHF needs n_samples_per_prompt x rollout.batch_size / "
                        f"rollout.micro_batch_size ({samples // wl.inference_micro_batch_size})"
                        f" >= the actor's {actors} GPUs")


def check_experts_and_fp8(plan: Plan, workload: WorkloadSpec) -> None:
    """Refuse what OpenRLHF 0.11.2 has no flag for: expert parallelism (its DeepSpeed trainers
    shard a mixture-of-experts model's experts with the rest under ZeRO, and its vLLM engines
    take no expert-parallel flag) and FP8 (no quantisation flag for its vLLM engines, no FP8
    training)."""
    for p in plan.placements:
        if p.ep > 1:
            raise SpecError(f"placements[{p.task}].ep", p.ep,
                            "OpenRLHF 0.11.2 has no expert parallelism (train_ppo_ray has no "
                            "such flag): export a plan with ep 1, or --to verl")
    check_fp8(workload)


def check_settings(workload: WorkloadSpec) -> None:
    """Refuse a workload OpenRLHF 0.11.2 runs with no plan, whatever the layout: FP8, selective
    recomputation, a bf16 optimizer (it has no flag for any of them)."""
    check_fp8(workload)
    check_recompute(workload)
    check_optimizer(workload)


def check_recompute(workload: WorkloadSpec) -> None:
    """Refuse selective recomputation: OpenRLHF 0.11.2 has full gradient checkpointing only."""
    task = workload.selective_recompute_task()
    if task is not None:
        raise SpecError("recompute", "selective",
                        f"OpenRLHF 0.11.2 has no selective checkpointing for {task} "
                        "(--actor.gradient_checkpointing_enable is full recomputation): write "
                        "true or false")


def check_optimizer(workload: WorkloadSpec) -> None:
    """Refuse a bf16 optimizer: OpenRLHF 0.11.2 trains with DeepSpeed's bf16 mixed precision,
    which keeps fp32 master weights and Adam states."""
    if workload.optimizer_precision != "fp32":
        raise SpecError("optimizer_precision", workload.optimizer_precision,
                        "OpenRLHF 0.11.2 trains with DeepSpeed's bf16 mixed precision (fp32 "
                        "master weights and Adam states): write fp32")


def check_fp8(workload: WorkloadSpec) -> None:
    """Refuse FP8: OpenRLHF 0.11.2 has no flag for it (see :func:`check_experts_and_fp8`)."""
    if workload.gen_fp8 or workload.train_fp8:
        key = "precision" if workload.train_fp8 else "gen_precision"
        raise SpecError(key, "fp8", "OpenRLHF 0.11.2 has no FP8 rollout or training flag: "
                        "export with bf16, or --to verl")


# --- what OpenRLHF cannot express -----------------------------------------------------------------

def differences(plan: Plan, layout: OpenRLHFLayout, closest: Plan, workload: WorkloadSpec,
                cluster: ClusterSpec) -> list[str]:
    """How the closest OpenRLHF plan differs from ``plan``, one sentence each."""
    wl = workload
    out = list(layout.notes)
    for p in plan.placements:
        if max(p.data_shares) - min(p.data_shares) > 1e-9:
            out.append(f"{p.task}: uneven data shares per replica; OpenRLHF splits the batch "
                       "evenly")
        c = closest.placement(p.task)
        if (p.dp, p.pp, p.tp, p.backend) != (c.dp, c.pp, c.tp, c.backend) or \
                set(p.device_ids) != set(c.device_ids):
            why = "OpenRLHF's vLLM engines split their GPUs into tp-sized engines" \
                if p.task == "actor_generation" else "OpenRLHF runs each DeepSpeed model data " \
                "parallel on all of its placement group's GPUs (ZeRO; no tensor or pipeline " \
                "parallelism)"
            out.append(f"{p.task}: (dp, pp, tp) = ({p.dp}, {p.pp}, {p.tp}) {p.backend} on "
                       f"{len(p.device_ids)} GPUs becomes ({c.dp}, {c.pp}, {c.tp}) {c.backend} "
                       f"on {len(c.device_ids)}: {why}")
        if p.offload:
            out.append(f"{p.task}: offload is not exported (--ds.adam_offload, --ref.offload "
                       "and --reward.offload offload less or differently); the closest plan "
                       "does not offload")
    for g in layout.groups:
        types = sorted({cluster.devices[d].gpu.name for d in g.devices})
        if len(types) > 1:
            out.append(f"{'+'.join(g.models)} mixes GPU types ({', '.join(types)}): OpenRLHF "
                       "treats them alike (even shares)")
    if len(plan.groups) != len(closest.groups):
        out.append(f"{len(plan.groups)} task groups become {len(closest.groups)} sets of GPUs")
    if "ref" in layout.models and wl.model("reference").name != wl.model("actor").name:
        out.append("the reference model differs from the actor's; OpenRLHF loads the reference "
                   "from --actor.model_name_or_path")
    if wl.reward == "rule":
        out.append("the rule reward is OpenRLHF's reward_func file (--reward.remote_url): "
                   "write it, or pass --model-path reward=PATH")
    if wl.mode == "async" and wl.staleness > 1:
        out.append(f"staleness {wl.staleness} is exported as --train.async_queue_size "
                   f"{wl.staleness} (batches queued between the sampler and the trainer)")
    if layout.colocate_all and wl.mode == "sync" and wl.gen_sleep_level == 2:
        out.append("gen_sleep_level 2: OpenRLHF's engines sleep at level 1 (weights offloaded, "
                   "not discarded)")
    if wl.precision == "fp32":
        out.append("precision fp32: OpenRLHF trains in bf16 or fp16 (--ds.param_dtype); its "
                   "default bf16 is left")
    if wl.micro_batch_tokens is not None and not wl.remove_padding:
        out.append("dynamic batching needs packed samples: OpenRLHF turns --ds.packing_samples "
                   "on (remove_padding: false is not kept)")
    if wl.micro_batch_tokens is None and wl.inference_micro_batch_tokens is not None:
        out.append("inference_micro_batch_tokens without micro_batch_tokens: OpenRLHF's "
                   "--rollout.max_tokens_per_gpu needs --train.dynamic_batch_enable; not "
                   "exported")
    if wl.task_batching:
        out.append("per-task batching (task_batching) is not exported: OpenRLHF has one "
                   "training and one inference micro-batch, and one gradient-checkpointing flag "
                   "(the actor's) for actor and critic")
    out.append(f"gen_max_concurrency {wl.gen_max_concurrency} (vLLM max_num_seqs) is not "
               "exported: OpenRLHF has no flag for it")
    if plan.sync_relay:
        out.append("the weight sync's relay (sync_relay) is not exported: every vLLM engine "
                   "receives the actor's weights directly; the closest plan is priced without "
                   "it")
    if not wl.recompute_logprobs:
        out.append("the workload does not recompute old log-probs (recompute_logprobs: false); "
                   "OpenRLHF's actor does: both estimates leave it out")
    samples = wl.batch_prompts * wl.responses_per_prompt // wl.optimizer_steps
    if samples % len(layout.devices("actor")):
        out.append(f"--train.batch_size {samples} is not a multiple of the actor's "
                   f"{len(layout.devices('actor'))} GPUs: OpenRLHF rounds each GPU's share "
                   "down")
    return out


# --- the file -----------------------------------------------------------------------------------

def argv(flag_list: Sequence[tuple[str, str | None]]) -> list[str]:
    """The entry point and its arguments, one string each."""
    out = list(ENTRY_POINT)
    for flag, value in flag_list:
        out += [flag] if value is None else [flag, value]
    return out


def ranges(devices: Sequence[int]) -> str:
    """Device ids as runs: ``0-7, 16-23``."""
    out, run = [], []
    for d in sorted(devices):
        if run and d != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(d)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def comment(text: str) -> str:
    """``text`` as one shell comment line: every control character (a newline included)
    escaped, so nothing a name holds can end the comment."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return f"# {shown}" if shown else "#"


def render(flag_list: Sequence[tuple[str, str | None]], header: Sequence[str]) -> str:
    """The launch script: a comment block, then one command, every word shell-quoted, the
    caller's own arguments (``"$@"``: the data set, the logger; later flags win) appended."""
    lines = ["#!/usr/bin/env bash"] + [comment(line) for line in header]
    words = [" ".join(shlex.quote(w) for w in ENTRY_POINT)]
    for flag, value in flag_list:
        words.append(shlex.quote(flag) + ("" if value is None else " " + shlex.quote(value)))
    words.append('"$@"')
    return "\n".join(lines + ["set -euo pipefail", "exec " + " \\\n    ".join(words)]) + "\n"
