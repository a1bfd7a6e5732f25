"""Run a Plan for real: one Ray worker per device, the RL loop driven from here.

One iteration (sync): generation on the generation replicas (prompts split by the plan's data
shares) -> reward, reference and critic inference on their replicas -> advantages (GAE for PPO,
group-normalised for GRPO) -> actor and critic training (DP replicas average gradients over gloo;
pipelined replicas run GPipe micro-batches across their stage workers) -> weight sync from the
trainer to the generator (and critic trainer -> critic inference), verified by digest. Async mode
with staleness k keeps up to k + 1 generations in flight: generation of iteration i uses weights
of iteration >= i - k. Every tasklet, transfer and collective becomes a span of a
``hetrl.trace.Trace`` (source ``real``) whose meta carries the workload, cluster and plan, so
``hetrl calibrate`` can fit the cost model to it. After every iteration a checkpoint (trainer
weights and optimizer states, trace so far) is written; ``resume`` continues from it.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetrl.cost.model import DATA_BYTES_PER_TOKEN
from hetrl.errors import HetrlError, SpecError, require
from hetrl.io import check_output_dir
from hetrl.plan import Plan, validate
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec
from hetrl.trace import Span, Trace
from real.algos import AlgoConfig, gae, grpo_advantages
from real.data import prompt_text, read_jsonl, reward_fn
from real.engines import validate_engines
from real.engines.base import make_batch
from real.network import NetworkEmulator
from real.placement import (
    by_device,
    check_supported,
    device_bundles,
    emulated_resources,
    missing_resources,
    sync_sources,
    tasklets,
)
from real.ray_env import ensure_ray
from real.tokenizer import ByteTokenizer
from real.worker import DeviceWorker

INFERENCE_TASKS = ("reward_inference", "reference_inference", "critic_inference",
                   "actor_inference")
#: After training, the inference engines of trained models take their weights: (trainer,
#: inference task, span name). actor_inference recomputes the old log-probs of the next batch
#: with the weights the actor is trained from.
TRAINED_SYNCS = (("critic_training", "critic_inference", "critic_sync"),
                 ("actor_training", "actor_inference", "actor_logprob_sync"))
TRAINING_TASKS = ("actor_training", "critic_training")
CHECKPOINT = "checkpoint.pt"
#: Seconds a worker may take to start and build its engines (imports of torch and transformers
#: take tens of seconds on a loaded 2-core machine).
SETUP_TIMEOUT_S = 900.0


class RunError(HetrlError):
    """A run stopped: a worker died or weights did not sync."""


@dataclass(frozen=True)
class RunConfig:
    """What to run besides the plan. ``kill_at`` = (task, iteration, device) injects a fault:
    that device's worker exits at the start of its tasklet of that task and iteration. Here,
    as in traces, iterations are indexes from 0; messages, the progress line and the command
    line's ``--kill-at`` count them from 1 (iteration 1 is index 0)."""

    iterations: int = 2
    seed: int = 0
    reward: str = "math"
    reward_model_coef: float = 0.0  # final reward = rule reward + coef * reward-model score
    problems: str | None = None  # JSONL of problems; None: the shipped GSM8K-style set
    emulate_network: bool = True
    emulate_speed: bool = True
    device: str = "cpu"
    checkpoint_dir: str | None = None
    resume: bool = False
    kill_at: tuple[str, int, int] | None = None
    lr: float = 1e-3
    kl_coef: float = 0.05
    temperature: float = 1.0
    progress: Callable[[str], None] | None = None
    #: Task kind -> engine name (real.engines.ENGINES); kinds left out use "torch".
    engines: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        require(isinstance(self.iterations, int) and self.iterations >= 1, "iterations",
                self.iterations, "must be an integer >= 1")
        require(self.device in ("cpu", "cuda"), "device", self.device, "must be cpu or cuda")
        require(self.lr > 0, "lr", self.lr, "must be > 0")
        require(self.temperature > 0, "temperature", self.temperature, "must be > 0")
        require(not self.resume or self.checkpoint_dir is not None, "resume", True,
                "needs a checkpoint directory")
        validate_engines(dict(self.engines), self.device)


@dataclass(frozen=True)
class RunResult:
    trace: Trace
    rewards: tuple[float, ...]  # mean final reward per iteration
    stats: tuple[dict[str, float], ...]  # training statistics per iteration
    resumed_from: int | None = None  # first iteration run after a resume
    weights_verified: int = 0  # weight syncs whose digest matched the trainer's

    def iteration_seconds(self) -> list[float]:
        return self.trace.iteration_seconds()


@dataclass
class _State:
    """What survives an interruption: finished iterations' spans, rewards and stats."""

    next_iteration: int = 0
    spans: list[Span] = field(default_factory=list)
    iterations: list[tuple[float, float]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    stats: list[dict[str, float]] = field(default_factory=list)


class RealRun:
    """One run of ``plan``; call :meth:`run`."""

    def __init__(self, workload: WorkloadSpec, cluster: ClusterSpec, plan: Plan,
                 config: RunConfig = RunConfig()):
        validate(plan, workload, cluster)
        # before Ray starts: else the run waits for GPU resources no node has
        require(config.device != "cuda" or torch.cuda.is_available(), "device", config.device,
                "no CUDA device is available here (torch.cuda.is_available() is False); "
                "use --device cpu")
        check_supported(plan, workload)
        for role, shape in workload.models:
            require(shape.params <= 50_000_000, f"models.{role}", shape.name,
                    f"has {shape.params:,} parameters; the torch CPU backend runs models of at "
                    "most 50M (use tiny-qwen3 or a shape of that size)")
            require(shape.vocab >= 259, f"models.{role}.vocab", shape.vocab,
                    "must be >= 259 (the byte tokenizer's vocabulary)")
        self.workload, self.cluster, self.plan, self.config = workload, cluster, plan, config
        if dict(config.engines).get("training") == "megatron":
            for p in plan.placements:
                if workload.task(p.task).kind == "training":
                    require(p.dp == 1 and p.pp == 1, f"placements[{p.task}]", (p.dp, p.pp),
                            "must have dp = pp = 1 with the megatron engine (it runs in its own "
                            "world of one process and has no pipeline stages)")
        max_new = workload.response_length.max
        self.algo = AlgoConfig(algorithm=workload.algorithm, lr=config.lr, critic_lr=config.lr,
                               kl_coef=config.kl_coef, group_size=workload.responses_per_prompt,
                               max_new_tokens=max_new, temperature=config.temperature)
        self.reward = reward_fn(config.reward)
        self.problems = read_jsonl(config.problems or Path(__file__).parent / "data" /
                                   "gsm8k_style_256.jsonl")
        require(len(self.problems) >= workload.batch_prompts, "problems", len(self.problems),
                f"need at least batch_prompts = {workload.batch_prompts} problems")
        self.tok = ByteTokenizer()
        self.tasklets = tasklets(plan, workload)
        self.devices = tuple(sorted({t.device for t in self.tasklets}))
        if config.kill_at is not None:
            task, it, device = config.kill_at
            places = sorted({(t.task, t.device) for t in self.tasklets})
            require((task, device) in places and 0 <= it < config.iterations, "kill_at",
                    config.kill_at, f"must name a (task, device) of the plan, one of {places}, "
                    f"and an iteration in [0, {config.iterations})")
        self.net = NetworkEmulator(cluster, config.emulate_network, config.emulate_speed)
        self.workers: dict[int, Any] = {}
        self.pids: dict[int, int] = {}
        self._pg = None
        self._verified = 0
        self._sync_sources: dict[tuple[str, str], dict[int, list[int]]] = {}
        self._later: list[Span] = []  # drained spans of iterations not finished yet

    # --- progress ---
    def _say(self, msg: str) -> None:
        if self.config.progress:
            self.config.progress(msg)

    # --- workers ---
    def _start(self, t0: float, states: dict[int, dict[str, Any]] | None) -> None:
        """Create the placement group, one worker per device, the gloo world and DP groups."""
        gpu = self.config.device == "cuda"
        ray = ensure_ray(None if gpu else emulated_resources(self.devices, self.cluster),
                         emulate=not gpu)
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundles = device_bundles(self.devices, self.cluster, gpu)
        need: dict[str, float] = {}
        for b in bundles:
            for k, v in b.items():
                need[k] = need.get(k, 0.0) + v
        short = missing_resources(need, ray.cluster_resources())
        if short:
            raise RunError(f"the Ray cluster lacks resources for this plan: {short} "
                           f"(has {ray.cluster_resources()}); start Ray with these custom resources")
        self._pg = placement_group(bundles, strategy="PACK")
        ray.get(self._pg.ready(), timeout=60)
        remote = ray.remote(DeviceWorker)
        per_device = by_device(self.tasklets)
        models = {role: shape.to_dict() for role, shape in self.workload.models}
        kill = self.config.kill_at
        for i, d in enumerate(self.devices):
            opts = {"num_cpus": 0, "max_restarts": 0, "num_gpus": 1 if gpu else 0,
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(self._pg, i)}
            self.workers[d] = remote.options(**opts).remote(
                d, self.cluster.to_dict(), per_device[d], models, self.algo, self.config.seed, t0,
                self.config.emulate_network, self.config.emulate_speed, self.config.device,
                (kill[0], kill[1]) if kill and kill[2] == d else None, dict(self.config.engines))
        pids = self._get({self.workers[d].setup.remote((states or {}).get(d)): (d, "setup", -1)
                          for d in self.devices}, timeout_s=SETUP_TIMEOUT_S)
        self.pids = dict(zip(self.devices, pids, strict=True))
        groups = self._dp_groups()
        if groups:
            rank = {d: i for i, d in enumerate(self.devices)}
            port = _free_port()
            self._get({self.workers[d].init_distributed.remote(
                rank[d], len(self.devices), f"tcp://127.0.0.1:{port}",
                {k: [rank[x] for x in devs] for k, devs in groups.items()}, SETUP_TIMEOUT_S):
                (d, "setup", -1) for d in self.devices}, timeout_s=SETUP_TIMEOUT_S)

    def _dp_groups(self) -> dict[str, tuple[int, ...]]:
        """Gradient all-reduce groups: per training task and stage, the devices of its replicas."""
        out = {}
        for p in self.plan.placements:
            if self.workload.task(p.task).kind == "training" and p.dp > 1:
                for s in range(p.pp):
                    out[f"{p.task}/stage{s}"] = tuple(r[s][0] for r in p.devices)
        return out

    def _stop(self) -> None:
        import ray

        for w in self.workers.values():
            ray.kill(w, no_restart=True)
        self.workers = {}
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
            self._pg = None

    def _get(self, refs: dict[Any, tuple[int, str, int]], timeout_s: float | None = None) -> list[Any]:
        """Results of ``refs`` (ref -> (device, task, iteration)) in order, taken as they finish.
        A dead worker becomes a RunError naming its device, GPU type and task; so does a task that
        failed (naming a dead peer when one is why) or a wait beyond ``timeout_s``."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        results: dict[Any, Any] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
            if not ready:
                d, task, _ = refs[pending[0]]
                raise RunError(f"device {d} ({self.cluster.device(d).gpu.name}) did not finish "
                               f"{task} within {timeout_s:.0f} s")
            ref = ready[0]
            try:
                results[ref] = ray.get(ref)
            except RayActorError:
                raise self._lost(*refs[ref]) from None
            except RayTaskError as exc:
                d, task, it = refs[ref]
                dead = self._dead_devices()
                if dead:  # a peer's death broke this task's collective
                    raise self._lost(dead[0], task, it) from None
                cause = str(exc).strip().splitlines()[-1][:300]
                raise RunError(f"device {d} ({self.cluster.device(d).gpu.name}) failed during "
                               f"{task} of {_where(it)}: {cause}") from None
        return [results[r] for r in refs]

    def _lost(self, d: int, task: str, it: int) -> RunError:
        where = _where(it)
        ckpt = self.config.checkpoint_dir
        hint = (f"; finished iterations are checkpointed in {ckpt}: rerun with --resume"
                if ckpt else "; run with a checkpoint directory to be able to resume")
        return RunError(f"device {d} ({self.cluster.device(d).gpu.name}, worker pid "
                        f"{self.pids.get(d, '?')}) was lost during {task} of {where}: its worker "
                        f"died{hint}")

    def _dead_devices(self) -> list[int]:
        """Devices whose worker has died (a call on a dead actor fails at once; a live one busy in
        a broken collective answers within the wait or is taken as alive)."""
        import ray
        from ray.exceptions import RayActorError

        dead = []
        for d, w in self.workers.items():
            ref = w.__ray_ready__.remote()
            ready, _ = ray.wait([ref], timeout=2.0)
            if ready:
                try:
                    ray.get(ready[0])
                except RayActorError:
                    dead.append(d)
        return dead

    # --- data ---
    def _prompts(self, it: int) -> tuple[list[list[int]], list[Any]]:
        """The iteration's prompts, each repeated responses_per_prompt times (a GRPO group)."""
        rng = np.random.default_rng([self.config.seed, it])
        pick = rng.choice(len(self.problems), self.workload.batch_prompts, replace=False)
        probs = [self.problems[int(i)] for i in pick for _ in range(self.workload.responses_per_prompt)]
        return [self.tok.encode(prompt_text(p)) for p in probs], probs

    def _split(self, task: str, n: int) -> list[list[int]]:
        """Sequence indices per replica of ``task`` by the plan's data shares (largest remainder)."""
        shares = self.plan.placement(task).data_shares
        raw = [s * n for s in shares]
        counts = [int(x) for x in raw]
        for i in sorted(range(len(raw)), key=lambda i: counts[i] - raw[i])[: n - sum(counts)]:
            counts[i] += 1
        if min(counts) == 0:
            raise SpecError(f"placements[{task}].data_weights", list(self.plan.placement(task).data_weights),
                            f"give a replica no sequence of the {n} per iteration; every replica "
                            "needs at least one (raise its weight or use fewer replicas)")
        out, start = [], 0
        for c in counts:
            out.append(list(range(start, start + c)))
            start += c
        return out

    # --- one iteration's tasks ---
    def _submit_generation(self, it: int) -> tuple[list[Any], list[list[int]], list[Any], list[int]]:
        prompts, probs = self._prompts(it)
        p = self.plan.placement("actor_generation")
        refs, home = [], [0] * len(prompts)
        for r, idx in enumerate(self._split("actor_generation", len(prompts))):
            d = p.devices[r][0][0]
            for i in idx:
                home[i] = d
            refs.append((self.workers[d].generate.remote(
                it, [prompts[i] for i in idx], self.algo.max_new_tokens, self.algo.temperature,
                self.config.seed * 1_000_003 + it * 1009 + r), d, idx))
        return refs, prompts, probs, home

    def _sources(self, idx: Sequence[int], home: Sequence[int], per_seq: Sequence[float]) -> dict[int, float]:
        out: dict[int, float] = {}
        for i in idx:
            out[home[i]] = out.get(home[i], 0.0) + per_seq[i]
        return out

    def _inference(self, it: int, batch: Any, home: list[int], seq_bytes: list[float]) -> dict[str, Any]:
        """Submit every inference task (parallel where devices differ), gather their outputs."""
        jobs: dict[Any, tuple[int, str, int]] = {}
        where: list[tuple[str, list[int]]] = []
        for task in INFERENCE_TASKS:
            if task not in self.workload.task_names:
                continue
            p = self.plan.placement(task)
            for r, idx in enumerate(self._split(task, batch.input_ids.shape[0])):
                if not idx:
                    continue
                d = p.devices[r][0][0]
                ref = self.workers[d].infer.remote(task, it, batch.select(idx),
                                                   self._sources(idx, home, seq_bytes))
                jobs[ref] = (d, task, it)
                where.append((task, idx))
        results = self._get(jobs)
        out: dict[str, Any] = {}
        for (task, idx), res in zip(where, results, strict=True):
            if task not in out:
                out[task] = torch.zeros((batch.input_ids.shape[0],) + tuple(res.shape[1:]), dtype=res.dtype)
            out[task][idx] = res
        return out

    def _advantages(self, batch: Any, probs: list[Any], inf: dict[str, Any],
                    responses: list[list[int]]) -> tuple[dict[str, Any], float]:
        """Final rewards and the training inputs (advantages, returns, reference log-probs)."""
        rule = torch.tensor([self.reward(self.tok.decode(r), p) for r, p in zip(responses, probs, strict=True)],
                            dtype=torch.float32)
        score = rule
        if "reward_inference" in inf:  # a reward model (reward: model) adds its score
            score = score + self.config.reward_model_coef * inf["reward_inference"].float()
        mask = batch.response_mask.float()
        extras = {"ref_logp": inf["reference_inference"]}
        if "actor_inference" in inf:  # recompute_logprobs: the PPO ratio's old log-probs
            extras["old_logp"] = inf["actor_inference"]
        if self.workload.algorithm == "grpo":
            adv = grpo_advantages(score, self.workload.responses_per_prompt)
            extras["advantages"] = adv[:, None] * mask
        else:
            last = (mask.cumsum(1) == mask.sum(1, keepdim=True)) & (mask > 0)
            token_rewards = last.float() * score[:, None]
            values = inf["critic_inference"]
            adv, ret = gae(token_rewards, values, mask, self.algo.gamma, self.algo.lam)
            extras.update(advantages=adv, returns=ret, old_values=values)
        return extras, float(score.mean())

    def _training(self, it: int, batch: Any, extras: dict[str, Any], home: list[int],
                  train_bytes: list[float]) -> dict[str, float]:
        """Every training task: replicas and stages in parallel, then all-reduce and step."""
        jobs: dict[Any, tuple[int, str, int]] = {}
        reduces: dict[Any, tuple[int, str, int]] = {}
        replica_of: dict[Any, int] = {}
        loss_weight: dict[Any, float] = {}
        steps: dict[Any, tuple[int, str, int]] = {}
        mbs = self.workload.micro_batch_size
        for task in TRAINING_TASKS:
            if task not in self.workload.task_names:
                continue
            p = self.plan.placement(task)
            role_keys = ("ref_logp", "advantages") if task == "actor_training" else (
                "returns", "old_values")
            if task == "actor_training" and "old_logp" in extras:
                role_keys += ("old_logp",)
            total = float(batch.response_mask.sum()) or 1.0
            for r, idx in enumerate(self._split(task, batch.input_ids.shape[0])):
                micro = [(batch.select(c), {k: extras[k][c] for k in role_keys})
                         for c in _chunks(idx, mbs)]
                scales = [mb.num_response_tokens / total for mb, _ in micro]
                stage_devs = tuple(s[0] for s in p.devices[r])
                group = f"{task}/stage0" if p.dp > 1 else None
                group_devs = tuple(rr[0][0] for rr in p.devices)
                if p.pp == 1:
                    d = stage_devs[0]
                    ref = self.workers[d].train.remote(task, it, micro, scales,
                                                       self._sources(idx, home, train_bytes),
                                                       group, group_devs)
                    jobs[ref] = (d, task, it)
                    continue
                jobs.update(self._pipeline(task, it, micro, scales, stage_devs,
                                           self._sources(idx, home, train_bytes), loss_weight))
            if p.pp > 1:
                for r in range(p.dp):
                    for s in range(p.pp):
                        d = p.devices[r][s][0]
                        group = f"{task}/stage{s}" if p.dp > 1 else None
                        ref = self.workers[d].stage_reduce.remote(
                            task, it, group, tuple(rr[s][0] for rr in p.devices))
                        reduces[ref] = (d, task, it)
                        replica_of[ref] = r
        stats: dict[str, float] = {}
        results = self._get(jobs)
        # pipelined replicas: clip by the whole model's norm (sum of the stages' squares)
        norms: dict[tuple[str, int], float] = {}
        for ref, sq in zip(reduces, self._get(reduces), strict=True):
            key = (reduces[ref][1], replica_of[ref])
            norms[key] = norms.get(key, 0.0) + sq
        for ref, (d, task, _) in reduces.items():
            norm = math.sqrt(norms[(task, replica_of[ref])])
            steps[self.workers[d].stage_step.remote(task, it, norm)] = (d, task, it)
        self._get(steps)
        for ref, res in zip(jobs, results, strict=True):
            task = jobs[ref][1]
            if isinstance(res, dict):  # a whole-model replica's share-weighted statistics
                for k, v in res.items():
                    stats[f"{task}/{k}"] = stats.get(f"{task}/{k}", 0.0) + v
            elif ref in loss_weight:  # a pipeline's last stage: one micro-batch's loss
                stats[f"{task}/loss"] = stats.get(f"{task}/loss", 0.0) + res * loss_weight[ref]
        return stats

    def _pipeline(self, task: str, it: int, micro: list[tuple[Any, Any]], scales: list[float],
                  devs: tuple[int, ...], data_sources: dict[int, float],
                  loss_weight: dict[Any, float]) -> dict[Any, tuple[int, str, int]]:
        """GPipe over the stage workers ``devs``: all forwards, then all backwards; the first
        stage receives the replica's rollout data from ``data_sources`` (device -> bytes). Each
        micro-batch's loss is scaled by ``scales``; ``loss_weight`` gets, per last-stage forward
        (whose result is that micro-batch's loss), its scale."""
        jobs: dict[Any, tuple[int, str, int]] = {}
        last = len(devs) - 1
        for m, (mb, ext) in enumerate(micro):
            x, src = mb.input_ids, None
            for s, d in enumerate(devs):
                x = self.workers[d].stage_forward.remote(task, it, m, x, mb, ext if s == last else None,
                                                         src, scales[m], data_sources if m == 0 else None)
                src = d
            jobs[x] = (devs[-1], task, it)
            loss_weight[x] = scales[m]
        for m in range(len(micro)):
            g, src = None, None
            for s in range(last, -1, -1):
                d = devs[s]
                g = self.workers[d].stage_backward.remote(task, it, m, g, src)
                src = d
            jobs[g] = (devs[0], task, it)
        return jobs

    def _sync(self, it: int, src_task: str, dst_task: str, span_task: str) -> list[tuple[Any, int]]:
        """Submit the pull of ``src_task``'s weights into every replica of ``dst_task``: each stage
        slice from the training device the cost model's weight sync picks for it
        (:func:`real.placement.sync_sources`). Returns one (load ref, destination device) per
        destination."""
        sources = self._sync_sources.get((src_task, dst_task))
        if sources is None:
            sources = sync_sources(self.plan, src_task, dst_task, self.workload, self.cluster)
            self._sync_sources[(src_task, dst_task)] = sources
        exports: dict[int, Any] = {}
        loads = []
        for g, chosen in sources.items():
            for d in chosen:
                if d not in exports:
                    exports[d] = self.workers[d].export_weights.remote(src_task)
            ref = self.workers[g].load_weights.remote(dst_task, it, span_task, chosen,
                                                      *[exports[d] for d in chosen])
            loads.append((ref, g))
        return loads

    def _finish_sync(self, it: int, pending: list[Any], task: str) -> None:
        """Wait for a sync and check that every destination's engine now holds exactly the
        weights the trainer sent (its own state after loading against what was sent)."""
        for ref, g in pending:
            held, sent = self._get({ref: (g, task, it)})[0]
            if held != sent:
                raise RunError(f"weight sync of {_where(it)} to device {g} is not verified: "
                               f"its engine holds other weights than the trainer sent (digest "
                               f"{held[:12]} vs {sent[:12]})")
            self._verified += 1

    # --- the loop ---
    def run(self) -> RunResult:
        cfg = self.config
        state, states = _State(), None
        ckpt = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        if ckpt is not None:  # before the workers start, not after a whole iteration
            check_output_dir(ckpt, "checkpoint_dir")
        if cfg.resume:
            if not (ckpt / CHECKPOINT).exists():
                raise SpecError("resume", str(ckpt / CHECKPOINT), "no checkpoint there to resume from")
            state, states = self._load_checkpoint(ckpt / CHECKPOINT)
        resumed = state.next_iteration if cfg.resume else None
        offset = state.iterations[-1][1] if state.iterations else 0.0
        t0 = time.time() - offset
        try:
            self._start(t0, states)
            if states:  # generators and critic inference start from the restored trainers
                self._finish_sync(-1, self._sync(-1, "actor_training", "actor_generation",
                                                 "weight_sync"), "weight_sync")
                self._trained_syncs(-1)
                self._drain(-1)
            self._loop(state, t0, ckpt)
        finally:
            self._stop()
        trace = Trace("real", self.workload.name, self.cluster.name, tuple(state.spans),
                      tuple(state.iterations), self._meta())
        return RunResult(trace, tuple(state.rewards), tuple(state.stats), resumed, self._verified)

    def _loop(self, state: _State, t0: float, ckpt: Path | None) -> None:
        k = self.workload.staleness if self.workload.mode == "async" else 0
        inflight: deque = deque()
        nxt = state.next_iteration
        last_end = time.time() - t0  # an iteration starts once the workers are up
        for it in range(state.next_iteration, self.config.iterations):
            while nxt < self.config.iterations and len(inflight) < k + 1:
                inflight.append((nxt, self._submit_generation(nxt)))
                nxt += 1
            _, (gen_refs, prompts, probs, home) = inflight.popleft()
            responses: list[list[int]] = [[] for _ in prompts]
            outs = self._get({ref: (d, "actor_generation", it) for ref, d, _ in gen_refs})
            for (_, _, idx), res in zip(gen_refs, outs, strict=True):
                for i, resp in zip(idx, res, strict=True):
                    responses[i] = resp
            batch = make_batch(prompts, responses)
            # rollout data per sequence, bytes per token as the cost model counts them (token
            # ids for inference; ids, log-probs, advantages and returns for training)
            tokens = batch.attention_mask.sum(1).tolist()
            inf = self._inference(it, batch, home,
                                  [t * DATA_BYTES_PER_TOKEN["inference"] for t in tokens])
            extras, reward = self._advantages(batch, probs, inf, responses)
            stats = self._training(it, batch, extras, home,
                                   [t * DATA_BYTES_PER_TOKEN["training"] for t in tokens])
            self._finish_sync(it, self._sync(it, "actor_training", "actor_generation", "weight_sync"),
                              "weight_sync")
            self._trained_syncs(it)
            end = time.time() - t0
            state.spans += self._drain(it)
            state.iterations.append((last_end, end))
            last_end = end
            state.rewards.append(reward)
            state.stats.append(stats)
            state.next_iteration = it + 1
            self._say(f"iteration {it + 1}/{self.config.iterations}: {end - state.iterations[-1][0]:.2f} s, "
                      f"mean reward {reward:.3f}")
            if ckpt is not None:
                self._save_checkpoint(ckpt, state)

    def _trained_syncs(self, it: int) -> None:
        """Each trained model's weights to its inference task (see ``TRAINED_SYNCS``)."""
        for src, dst, name in TRAINED_SYNCS:
            if src in self.workload.task_names and dst in self.workload.task_names:
                self._finish_sync(it, self._sync(it, src, dst, name), name)

    def _drain(self, it: int) -> list[Span]:
        """Collect the workers' spans of iterations up to ``it`` (later ones, from generations
        running ahead in async mode, wait for their own iteration) and add one ``task`` span per
        task and iteration."""
        spans: list[Span] = []
        for d in self.devices:
            spans += self._get({self.workers[d].drain_spans.remote(): (d, "trace", it)})[0]
        if it < 0:
            return []
        spans = self._later + spans
        self._later = [s for s in spans if s.iteration > it]
        spans = [s for s in spans if s.iteration <= it]
        bounds: dict[tuple[str, int], list[float]] = {}
        for s in spans:
            key = (s.task, s.iteration)
            b = bounds.setdefault(key, [s.start_s, s.end_s, set()])
            b[0], b[1] = min(b[0], s.start_s), max(b[1], s.end_s)
            b[2].update(s.devices)
        tasks = [Span(task, "task", task, i, a, b, tuple(sorted(devs)))
                 for (task, i), (a, b, devs) in sorted(bounds.items(), key=lambda kv: kv[1][0])]
        return tasks + sorted(spans, key=lambda s: s.start_s)

    def _meta(self) -> dict[str, Any]:
        return {"workload_spec": self.workload.to_dict(), "cluster_spec": self.cluster.to_dict(),
                "plan": self.plan.to_dict(), "seed": self.config.seed, "device": self.config.device,
                "emulate_network": self.config.emulate_network,
                "emulate_speed": self.config.emulate_speed, "weights_verified": self._verified}

    # --- checkpoints ---
    def _save_checkpoint(self, ckpt: Path, state: _State) -> None:
        trainers: dict[int, dict[str, Any]] = {}
        refs = {}
        for t in self.tasklets:
            if t.kind == "training":
                refs[self.workers[t.device].save_state.remote(t.task)] = (t.device, t.task, -1)
        for (d, task, _), st in zip(refs.values(), self._get(refs), strict=True):
            trainers.setdefault(d, {})[task] = st
        tmp = ckpt / f".{CHECKPOINT}.{os.getpid()}.tmp"
        try:
            ckpt.mkdir(parents=True, exist_ok=True)
            torch.save({"next_iteration": state.next_iteration, "trainers": trainers,
                        "spans": [s.to_dict() for s in state.spans],
                        "iterations": state.iterations, "rewards": state.rewards,
                        "stats": state.stats, "verified": self._verified,
                        "run": self._identity()}, tmp)
            os.replace(tmp, ckpt / CHECKPOINT)
        except OSError as exc:  # a full disk, a folder made read-only meanwhile: one line
            tmp.unlink(missing_ok=True)
            raise SpecError("checkpoint_dir", str(ckpt),
                            f"cannot write the checkpoint: {exc.strerror or exc}") from None

    def _identity(self) -> dict[str, Any]:
        """What a checkpoint must share with the run that resumes it."""
        return {"workload": self.workload.to_dict(), "cluster": self.cluster.to_dict(),
                "plan": self.plan.to_dict(), "seed": self.config.seed, "reward": self.config.reward,
                "lr": self.config.lr, "kl_coef": self.config.kl_coef,
                "temperature": self.config.temperature, "engines": list(self.config.engines)}

    def _load_checkpoint(self, path: Path) -> tuple[_State, dict[int, dict[str, Any]]]:
        data = torch.load(path, weights_only=False)
        mine = self._identity()
        for key, value in (data.get("run") or {}).items():
            if mine.get(key) != value:
                raise SpecError("resume", str(path), f"the checkpoint was written by a run with "
                                f"another {key}; resume with the same {key}")
        self._verified = int(data.get("verified", 0))
        state = _State(data["next_iteration"], [Span.from_dict(s) for s in data["spans"]],
                       [tuple(x) for x in data["iterations"]], list(data["rewards"]),
                       list(data["stats"]))
        return state, data["trainers"]


def _where(it: int) -> str:
    """An iteration index (0-based, as in traces and ``RunConfig.kill_at``) in words, counted
    from 1 as every message and the progress line count it; -1 is the set-up."""
    return f"iteration {it + 1}" if it >= 0 else "set-up"


def _chunks(idx: list[int], size: int) -> list[list[int]]:
    return [idx[i:i + size] for i in range(0, len(idx), size)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_plan(workload: WorkloadSpec, cluster: ClusterSpec, plan: Plan,
             config: RunConfig = RunConfig()) -> RunResult:
    """Run ``plan`` for ``config.iterations`` iterations; see :class:`RealRun`."""
    return RealRun(workload, cluster, plan, config).run()
