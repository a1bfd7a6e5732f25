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

The parts: ``real.config`` (what to run, what comes back, the checks before Ray starts),
``real.worker_spec`` (what each worker is given), ``real.worker_group`` (the Ray actors: start,
call, wait, diagnose, stop), ``real.training`` (one dispatcher per way a task trains: single
stage, GPipe, Megatron grid), ``real.checkpoint`` (the checkpoint file); this module drives the
steps of an iteration.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetrl.cost.model import DATA_BYTES_PER_TOKEN
from hetrl.errors import SpecError, require
from hetrl.io import check_output_dir
from hetrl.plan import Plan
from hetrl.shares import split_ranges
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec
from hetrl.trace import Span, Trace, task_spans
from real.algos import AlgoConfig, gae, grpo_advantages
from real.checkpoint import RunState, load_checkpoint, save_checkpoint
from real.config import DEFAULT_CONFIG, RunConfig, RunResult, check_runnable
from real.data import prompt_text, read_jsonl, reward_fn
from real.engines.base import make_batch
from real.placement import megatron_grids, sync_sources, tasklets
from real.tokenizer import ByteTokenizer
from real.training import ReplicaInput, dispatcher, train_step
from real.worker_group import RunError, WorkerGroup, where

__all__ = ["RealRun", "RunConfig", "RunError", "RunResult", "run_plan"]

INFERENCE_TASKS = ("reward_inference", "reference_inference", "critic_inference",
                   "actor_inference")
#: After training, the inference engines of trained models take their weights: (trainer,
#: inference task, span name). actor_inference recomputes the old log-probs of the next batch
#: with the weights the actor is trained from.
TRAINED_SYNCS = (("critic_training", "critic_inference", "critic_sync"),
                 ("actor_training", "actor_inference", "actor_logprob_sync"))
TRAINING_TASKS = ("actor_training", "critic_training")


class RealRun:
    """One run of ``plan``; call :meth:`run`."""

    def __init__(self, workload: WorkloadSpec, cluster: ClusterSpec, plan: Plan,
                 config: RunConfig = DEFAULT_CONFIG):
        check_runnable(workload, cluster, plan, config)
        self.workload, self.cluster, self.plan, self.config = workload, cluster, plan, config
        max_new = workload.response_length.max
        self.algo = AlgoConfig(algorithm=workload.algorithm, lr=config.lr, critic_lr=config.lr,
                               kl_coef=0.0 if workload.kl == "none" else config.kl_coef,
                               group_size=workload.responses_per_prompt,
                               max_new_tokens=max_new, temperature=config.temperature)
        self.reward = reward_fn(config.reward)
        self.problems = read_jsonl(config.problems or Path(__file__).parent / "data" /
                                   "gsm8k_style_256.jsonl")
        require(len(self.problems) >= workload.batch_prompts, "problems", len(self.problems),
                f"need at least batch_prompts = {workload.batch_prompts} problems")
        self.tok = ByteTokenizer()
        self.tasklets = tasklets(plan, workload)
        self.grids = megatron_grids(plan, workload, dict(config.engines))
        self.workers = WorkerGroup(workload, cluster, plan, self.tasklets, config.checkpoint_dir,
                                   self.grids)
        self.trainers = {task: dispatcher(self.workers, plan.placement(task), task in self.grids)
                         for task in TRAINING_TASKS if task in workload.task_names}
        self.state = RunState()
        self._sync_sources: dict[tuple[str, str], dict[int, list[int]]] = {}
        self._later: list[Span] = []  # drained spans of iterations not finished yet

    # --- progress ---
    def _say(self, msg: str) -> None:
        if self.config.progress:
            self.config.progress(msg)

    # --- data ---
    def _prompts(self, it: int) -> tuple[list[list[int]], list[Any]]:
        """The iteration's prompts, each repeated responses_per_prompt times (a GRPO group)."""
        rng = np.random.default_rng([self.config.seed, it])
        pick = rng.choice(len(self.problems), self.workload.batch_prompts, replace=False)
        probs = [self.problems[int(i)] for i in pick for _ in range(self.workload.responses_per_prompt)]
        return [self.tok.encode(prompt_text(p)) for p in probs], probs

    def _split(self, task: str, n: int) -> list[list[int]]:
        """Sequence indices per replica of ``task`` by the plan's data shares
        (:func:`hetrl.shares.split_ranges`, as the simulator splits); every replica needs one."""
        ranges = split_ranges(n, self.plan.placement(task).data_shares)
        if min(len(r) for r in ranges) == 0:
            raise SpecError(f"placements[{task}].data_weights", list(self.plan.placement(task).data_weights),
                            f"give a replica no sequence of the {n} per iteration; every replica "
                            "needs at least one (raise its weight or use fewer replicas)")
        return [list(r) for r in ranges]

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

    def _rollouts(self, it: int, refs: list[Any], prompts: list[list[int]], probs: list[Any],
                  home: list[int]) -> tuple[Any, list[Any], list[list[int]], list[int]]:
        """A submitted generation's results: the batch, the problems, the responses and each
        sequence's generation device."""
        responses: list[list[int]] = [[] for _ in prompts]
        outs = self.workers.get({ref: (d, "actor_generation", it) for ref, d, _ in refs})
        for (_, _, idx), res in zip(refs, outs, strict=True):
            for i, resp in zip(idx, res, strict=True):
                responses[i] = resp
        return make_batch(prompts, responses), probs, responses, home

    def _sources(self, idx: Sequence[int], home: Sequence[int], per_seq: Sequence[float]) -> dict[int, float]:
        out: dict[int, float] = {}
        for i in idx:
            out[home[i]] = out.get(home[i], 0.0) + per_seq[i]
        return out

    def _inference(self, it: int, batch: Any, home: list[int], seq_bytes: list[float]) -> dict[str, Any]:
        """Submit every inference task (parallel where devices differ), gather their outputs."""
        jobs: dict[Any, tuple[int, str, int]] = {}
        placed: list[tuple[str, list[int]]] = []
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
                placed.append((task, idx))
        results = self.workers.get(jobs)
        out: dict[str, Any] = {}
        for (task, idx), res in zip(placed, results, strict=True):
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
        extras = {}
        if "reference_inference" in inf:  # kl: none has no reference model
            extras["ref_logp"] = inf["reference_inference"]
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
        """Every training task: replicas and stages in parallel, then all-reduce and step
        (:func:`real.training.train_step`, one dispatcher per task)."""
        total = float(batch.response_mask.sum()) or 1.0
        inputs = [(self.trainers[task], self._replica_inputs(task, batch, extras, home,
                                                               train_bytes, total))
                  for task in TRAINING_TASKS if task in self.trainers]
        return train_step(self.workers, it, inputs)

    def _replica_inputs(self, task: str, batch: Any, extras: dict[str, Any], home: list[int],
                        train_bytes: list[float], total: float) -> list[ReplicaInput]:
        """Each replica's micro-batches of ``task`` (its rows by the plan's data shares, in
        micro_batch_size chunks), with the extras its role trains on, each micro-batch's share
        of the batch's ``total`` response tokens, and its rollout data's sources."""
        keys = (*(("ref_logp",) if "ref_logp" in extras else ()), "advantages",
                *(("old_logp",) if "old_logp" in extras else ())) \
            if task == "actor_training" else ("returns", "old_values")
        out = []
        for r, idx in enumerate(self._split(task, batch.input_ids.shape[0])):
            micro = [(batch.select(c), {k: extras[k][c] for k in keys})
                     for c in _chunks(idx, self.workload.micro_batch_size)]
            out.append(ReplicaInput(r, micro, [mb.num_response_tokens / total for mb, _ in micro],
                                    self._sources(idx, home, train_bytes)))
        return out

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
            held, sent = self.workers.get({ref: (g, task, it)})[0]
            if held != sent:
                raise RunError(f"weight sync of {where(it)} to device {g} is not verified: "
                               f"its engine holds other weights than the trainer sent (digest "
                               f"{held[:12]} vs {sent[:12]})")
            self.state.verified += 1

    def _weight_syncs(self, it: int) -> None:
        """The actor's weights to the generators, then each trained model's weights to its
        inference task (see ``TRAINED_SYNCS``), each verified by digest."""
        self._finish_sync(it, self._sync(it, "actor_training", "actor_generation", "weight_sync"),
                          "weight_sync")
        for src, dst, name in TRAINED_SYNCS:
            if src in self.workload.task_names and dst in self.workload.task_names:
                self._finish_sync(it, self._sync(it, src, dst, name), name)

    # --- the loop ---
    def run(self) -> RunResult:
        cfg = self.config
        ckpt = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        if ckpt is not None:  # before the workers start, not after a whole iteration
            check_output_dir(ckpt, "checkpoint_dir")
        trainers = None
        if cfg.resume:
            self.state, trainers = load_checkpoint(ckpt, self._identity())
        state = self.state
        resumed = state.next_iteration if cfg.resume else None
        t0 = time.time() - (state.iterations[-1][1] if state.iterations else 0.0)
        try:
            self.workers.start(t0, self.algo, cfg, trainers)
            if trainers:  # generators and critic inference start from the restored trainers
                self._weight_syncs(-1)
                self._drain(-1)
            self._loop(t0, ckpt)
        finally:
            self.workers.stop()
        trace = Trace("real", self.workload.name, self.cluster.name, tuple(state.spans),
                      tuple(state.iterations), self._meta())
        return RunResult(trace, tuple(state.rewards), tuple(state.stats), resumed, state.verified)

    def _loop(self, t0: float, ckpt: Path | None) -> None:
        """The iterations: generation (up to staleness + 1 ahead), inference, advantages,
        training, weight syncs; then the iteration's spans, and a checkpoint."""
        state, n = self.state, self.config.iterations
        k = self.workload.staleness if self.workload.mode == "async" else 0
        inflight: deque = deque()
        nxt = state.next_iteration
        last_end = time.time() - t0  # an iteration starts once the workers are up
        for it in range(state.next_iteration, n):
            while nxt < n and len(inflight) < k + 1:
                inflight.append(self._submit_generation(nxt))
                nxt += 1
            batch, probs, responses, home = self._rollouts(it, *inflight.popleft())
            # rollout data per sequence, bytes per token as the cost model counts them (token
            # ids for inference; ids, log-probs, advantages and returns for training)
            tokens = batch.attention_mask.sum(1).tolist()
            inf = self._inference(it, batch, home,
                                  [t * DATA_BYTES_PER_TOKEN["inference"] for t in tokens])
            extras, reward = self._advantages(batch, probs, inf, responses)
            stats = self._training(it, batch, extras, home,
                                   [t * DATA_BYTES_PER_TOKEN["training"] for t in tokens])
            self._weight_syncs(it)
            end = time.time() - t0
            state.spans += self._drain(it)
            state.iterations.append((last_end, end))
            last_end = end
            state.rewards.append(reward)
            state.stats.append(stats)
            state.next_iteration = it + 1
            self._say(f"iteration {it + 1}/{n}: {end - state.iterations[-1][0]:.2f} s, "
                      f"mean reward {reward:.3f}")
            if ckpt is not None:
                save_checkpoint(ckpt, state, self.workers.trainer_states(), self._identity())

    def _drain(self, it: int) -> list[Span]:
        """Collect the workers' spans of iterations up to ``it`` (later ones, from generations
        running ahead in async mode, wait for their own iteration) and add one ``task`` span per
        task and iteration (:func:`hetrl.trace.task_spans`)."""
        spans = self.workers.drain_spans(it)
        if it < 0:
            return []
        spans = self._later + spans
        self._later = [s for s in spans if s.iteration > it]
        spans = [s for s in spans if s.iteration <= it]
        return task_spans(spans) + sorted(spans, key=lambda s: s.start_s)

    def _meta(self) -> dict[str, Any]:
        return {"workload_spec": self.workload.to_dict(), "cluster_spec": self.cluster.to_dict(),
                "plan": self.plan.to_dict(), "seed": self.config.seed, "device": self.config.device,
                "emulate_network": self.config.emulate_network,
                "emulate_speed": self.config.emulate_speed, "weights_verified": self.state.verified}

    def _identity(self) -> dict[str, Any]:
        """What a checkpoint must share with the run that resumes it."""
        return {"workload": self.workload.to_dict(), "cluster": self.cluster.to_dict(),
                "plan": self.plan.to_dict(), "seed": self.config.seed, "reward": self.config.reward,
                "lr": self.config.lr, "kl_coef": self.config.kl_coef,
                "temperature": self.config.temperature, "engines": list(self.config.engines)}


def _chunks(idx: list[int], size: int) -> list[list[int]]:
    return [idx[i:i + size] for i in range(0, len(idx), size)]


def run_plan(workload: WorkloadSpec, cluster: ClusterSpec, plan: Plan,
             config: RunConfig = DEFAULT_CONFIG) -> RunResult:
    """Run ``plan`` for ``config.iterations`` iterations; see :class:`RealRun`."""
    return RealRun(workload, cluster, plan, config).run()
