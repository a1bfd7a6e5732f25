"""One Ray actor per planned device: it hosts the engines of every tasklet placed on its device
(co-located tasks share the worker), applies the emulated network and compute delays, and
records spans of what it did. The driver (``real.runner``) tells it what to do.

Times in spans are seconds since the run's ``t0`` (a ``time.time()`` epoch shared by all
workers of one machine).
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from hetrl.spec.model import ModelShape
from hetrl.trace import Span
from real.network import NetworkEmulator, wait
from real.placement import expert_dp_group_name, expert_group_name
from real.worker_spec import WorkerSpec

#: The inference engine's method per role: reference and actor (old) log-probs, critic values,
#: reward scores.
INFERENCE_METHOD = {"reference": "log_probs", "actor": "log_probs", "critic": "values",
                    "reward": "scores"}


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in ``obj`` (tensors, mappings and sequences of them)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(v) for v in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(tensor_bytes(getattr(obj, f)) for f in obj.__dataclass_fields__)
    return 0


def spec_from_shape(shape: ModelShape):
    """The torch model spec of a workload's model shape (the cost model's view of it)."""
    from real.model import TinyModelSpec

    moe = shape.moe  # a Qwen3-MoE shape (real.placement.check_supported checked it)
    return TinyModelSpec(hidden=shape.hidden, layers=shape.layers, heads=shape.heads,
                         kv_heads=shape.kv_heads, head_dim=shape.head_dim, ffn=shape.ffn,
                         vocab=shape.vocab, name=shape.name,
                         experts=moe.experts if moe else 0, top_k=moe.top_k if moe else 0,
                         expert_ffn=moe.expert_ffn if moe else 0)


def digest(state: Mapping[str, Any]) -> str:
    """SHA-256 over a state dict's names and raw bytes: equal digests = equal weights."""
    import torch

    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(t.view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return h.hexdigest()


class DeviceWorker:
    """The worker of ``spec.device`` (:class:`real.worker_spec.WorkerSpec`, built on the
    driver); wrap with ``ray.remote`` (see ``real.worker_group``)."""

    def __init__(self, spec: WorkerSpec):
        import torch

        torch.set_num_threads(1)
        self.spec = spec
        self.device = spec.device
        self.net = NetworkEmulator(spec.cluster, spec.emulate_network, spec.emulate_speed)
        self.slowdown = self.net.slowdown(spec.device)
        self.tasklets = spec.tasklets  # task -> this device's tasklet
        self.grids = spec.grids  # task -> MegatronGrid of its megatron trainer
        self.t0 = spec.t0
        self.torch_device = spec.torch_device
        self.engines: dict[str, Any] = {}
        self.spans: list[Span] = []
        self.dist_groups: dict[str, Any] = {}
        self._iteration = -1  # of the training step in progress (for p2p transfer spans)

    # --- set-up ---
    def setup(self, states: Mapping[str, Mapping[str, Any]] | None = None) -> int:
        """Build every engine of this device (from ``states`` = task -> saved state when resuming);
        returns the worker's process id."""
        from real.engines import build_engine

        for e in self.spec.engines:
            t, task = e.tasklet, e.tasklet.task
            placement = {}
            if e.grid is not None:  # a megatron trainer: its rank in the task's grid
                placement = {"grid": e.grid, "device_id": self.device, "groups": self.dist_groups,
                             "on_receive": functools.partial(self._stage_receive, task)}
            elif t.ep > 1 and t.kind == "training":  # a torch trainer's expert-parallel group
                placement = {"ep_group": self.dist_groups[expert_group_name(task, t.replica, t.ep)]}
            self.engines[task] = build_engine(
                t.kind, e.engine, t.role, spec_from_shape(e.model), e.seed, self.torch_device,
                self.spec.algo, stage=t.stage if t.stages > 1 else None,
                stages=list(t.boundaries) if t.stages > 1 else None, **placement)
            if states and task in states:
                self._load_state(task, states[task])
        return os.getpid()

    def init_distributed(self, rank: int, world: int, init_method: str,
                         groups: Mapping[str, Sequence[int]], timeout_s: float) -> None:
        """Join the run's world (gloo; on GPUs gloo and NCCL) and create every group (name ->
        ranks; the same on every worker); a collective waiting longer than ``timeout_s`` fails
        instead of hanging."""
        import torch.distributed as dist

        from real.engines.megatron_parallel import GPU_BACKEND, create_groups

        backend = GPU_BACKEND if self.torch_device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        # the torch trainers' DP all-reduces stay on gloo; Megatron's groups take the world's
        torch_dp = {k: v for k, v in groups.items() if "/megatron/" not in k}
        self.dist_groups.update(create_groups(torch_dp, rank, backend="gloo"))
        self.dist_groups.update(create_groups(
            {k: v for k, v in groups.items() if k not in torch_dp}, rank))

    # --- spans ---
    def _now(self) -> float:
        return time.time() - self.t0

    def _span(self, name: str, kind: str, task: str, it: int, start: float,
              devices: tuple[int, ...] | None = None, nbytes: float = 0.0, **meta: Any) -> None:
        self.spans.append(Span(name, kind, task, it, start, self._now(),
                               devices if devices is not None else (self.device,), float(nbytes),
                               meta))

    def drain_spans(self) -> list[Span]:
        out, self.spans = self.spans, []
        return out

    def _enter(self, task: str, it: int) -> None:
        if self.spec.kill_at is not None and self.spec.kill_at == (task, it):
            os._exit(17)  # fault injection: this device dies at the start of its tasklet

    def _receive(self, task: str, it: int, sources: Mapping[int, float],
                 name: str | None = None) -> None:
        """Wait the emulated time of receiving ``sources`` (device -> bytes) on this device; a
        transfer span ``name`` (default "{task} input")."""
        remote = {s: b for s, b in sources.items() if s != self.device}
        if not remote:
            return
        start = self._now()
        wait(self.net.gather_s(remote, self.device))
        self._span(name or f"{task} input", "transfer", task, it, start,
                   tuple(sorted(remote)) + (self.device,), sum(remote.values()))

    def _compute(self, fn, *args: Any) -> Any:
        """Run ``fn`` and stretch its time by this device's emulated slowdown."""
        start = time.perf_counter()
        out = fn(*args)
        wait((self.slowdown - 1.0) * (time.perf_counter() - start))
        return out

    # --- tasks ---
    def generate(self, it: int, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[int]]:
        task = "actor_generation"
        self._enter(task, it)
        start = self._now()
        engine = self.engines[task]
        out = self._compute(engine.generate, prompts, max_new_tokens, temperature, seed)
        end = self._now()
        # the engine's prefill and decode (torch engine; others record none), stretched by the
        # emulated slowdown as _compute stretches the whole call
        for name, a, b, meta in getattr(engine, "last_phases", ()) or ():
            self.spans.append(Span(name, "phase", task, it, min(start + a * self.slowdown, end),
                                   min(start + b * self.slowdown, end), (self.device,), 0.0,
                                   {"replica": self.tasklets[task].replica, **meta}))
        self._span(task, "tasklet", task, it, start, replica=self.tasklets[task].replica,
                   sequences=len(prompts))
        return out

    def infer(self, task: str, it: int, batch: Any, sources: Mapping[int, float]) -> Any:
        self._enter(task, it)
        start = self._now()
        self._receive(task, it, sources)
        fn = getattr(self.engines[task], INFERENCE_METHOD[self.tasklets[task].role])
        out = self._compute(fn, batch.to(self.torch_device))
        self._span(task, "tasklet", task, it, start, replica=self.tasklets[task].replica)
        return out.cpu()

    def train(self, task: str, it: int, micro_batches: list[tuple[Any, Any]], scales: list[float],
              sources: Mapping[int, float], group: str | None,
              group_devices: tuple[int, ...], ep_devices: tuple[int, ...] = (),
              expert_dp_devices: tuple[int, ...] = ()) -> dict[str, float]:
        """A whole-model (pp = 1) replica: forward/backward over its micro-batches (each loss
        scaled by ``scales``: its share of the whole batch's response tokens), gradient sum with
        its DP peers, optimizer step. Returns loss statistics weighted by the same scales.
        With expert parallelism (``ep_devices``: its group's devices; ``expert_dp_devices``:
        the replicas holding its experts, when more than one) the micro-batches' all-to-alls
        are recorded as a collective span with their bytes and emulated time, the experts'
        gradients summed over ``expert_dp_devices``, and the experts gathered after the step."""
        self._enter(task, it)
        start = self._now()
        self._receive(task, it, sources)
        engine = self.engines[task]
        stats: dict[str, float] = {}
        for (batch, extras), scale in zip(micro_batches, scales, strict=True):
            s = self._compute(engine.forward_backward, batch.to(self.torch_device),
                              {k: v.to(self.torch_device) for k, v in extras.items()}, scale)
            for k, v in s.items():
                stats[k] = stats.get(k, 0.0) + float(v) * scale
        if ep_devices:
            self._expert_alltoalls(task, it, ep_devices)
        self._all_reduce(task, it, group, group_devices, expert_dp_devices)
        self._compute(engine.step)
        if ep_devices:
            self._gather_experts(task, it, ep_devices)
        self._span(task, "tasklet", task, it, start, replica=self.tasklets[task].replica)
        return stats

    def _expert_alltoalls(self, task: str, it: int, ep_devices: tuple[int, ...]) -> None:
        """The bytes the rank's MoE all-to-alls sent in this step (forward and backward) as one
        collective span (meta: the all-to-all ``calls`` and the ``tokens`` routed per layer),
        after their emulated time over its expert-parallel group's ``ep_devices``."""
        nbytes, calls, tokens = self.engines[task].take_alltoall()
        start = self._now()
        wait(self.net.all_to_all_s(ep_devices, nbytes, calls))
        self._span(f"{task} expert all-to-all", "collective", task, it, start, ep_devices,
                   nbytes, calls=calls, tokens=tokens, replica=self.tasklets[task].replica)

    def _gather_experts(self, task: str, it: int, ep_devices: tuple[int, ...]) -> None:
        """All-gather the experts over the expert-parallel group (the state a weight sync
        sends), with its emulated ring time."""
        start = self._now()
        received = self._compute(self.engines[task].gather_experts)
        # a ring all-gather: half a ring all-reduce's steps of the same final bytes
        full = received * len(ep_devices) / (len(ep_devices) - 1)
        wait(self.net.ring_all_reduce_s(ep_devices, full) / 2)
        self._span(f"{task} expert gather", "collective", task, it, start, ep_devices, received)

    def train_grid(self, task: str, it: int, micro_batches: list[tuple[Any, Any]],
                   scales: list[float], sources: Mapping[int, float]) -> dict[str, float]:
        """This device's rank of a megatron trainer's step (every rank of the task's grid is
        called at once): the replica's micro-batches through Megatron's schedule, gradient
        reduction and optimizer step (:meth:`MegatronTrainer.train_step`). The first stage
        receives the rollout data from ``sources``; pipeline activations and gradients wait
        their emulated transfer on receipt (:meth:`_stage_receive`); the step's forwards,
        losses and backwards (``engine.compute_s``) are stretched by the device's slowdown;
        with dp > 1 the emulated ring time of the rank's fp32 gradients over its dp group
        follows, as after the torch trainers' all-reduce (the reduce-scatter plus all-gather
        of Megatron's distributed optimizer move the same bytes per ring edge); with expert
        parallelism first the all-to-alls' span and time, and the experts' gradients ring
        over the replicas holding the same experts."""
        self._enter(task, it)
        start = self._now()
        t = self.tasklets[task]
        if t.stage == 0:
            self._receive(task, it, sources)
        engine, grid = self.engines[task], self.grids[task]
        self._iteration = it
        stats = engine.train_step([(b.to(self.torch_device),
                                    {k: v.to(self.torch_device) for k, v in e.items()})
                                   for b, e in micro_batches], scales)
        wait((self.slowdown - 1.0) * engine.compute_s)
        if grid.ep > 1:  # the rank's expert-parallel group: its replica's block of ep
            block = range(t.replica - t.replica % grid.ep, t.replica - t.replica % grid.ep + grid.ep)
            self._expert_alltoalls(task, it, tuple(grid.devices[r][t.stage][t.tp_rank]
                                                   for r in block))
        # fp32 gradients: the experts' (Megatron marks them allreduce False) over the replicas
        # holding the same ones, the rest over all
        experts = [p for p in engine.parameters() if not getattr(p, "allreduce", True)]
        rings = [("grad reduce", range(grid.dp), sum(p.numel() * 4 for p in engine.parameters())
                  - sum(p.numel() * 4 for p in experts))]
        if experts:
            rings.append(("expert grad reduce", range(t.replica % grid.ep, grid.dp, grid.ep),
                          sum(p.numel() * 4 for p in experts)))
        for name, replicas, nbytes in rings:
            if len(replicas) > 1:
                ring = tuple(grid.devices[r][t.stage][t.tp_rank] for r in replicas)
                began_ring = self._now()
                wait(self.net.ring_all_reduce_s(ring, nbytes))
                self._span(f"{task} {name}", "collective", task, it, began_ring, ring, nbytes)
        self._span(task, "tasklet", task, it, start, replica=t.replica, stage=t.stage,
                   tp_rank=t.tp_rank)
        return stats

    def _stage_receive(self, task: str, stage: int, nbytes: float) -> None:
        """A megatron pipeline receive from ``stage`` of this replica: its emulated transfer."""
        r, _, rank = self.grids[task].coords(self.device)
        self._receive(task, self._iteration, {self.grids[task].devices[r][stage][rank]: nbytes},
                      f"{task} stage {stage}")

    def stage_forward(self, task: str, it: int, micro: int, x: Any, batch: Any, extras: Any,
                      source: int | None, scale: float = 1.0,
                      data_sources: Mapping[int, float] | None = None) -> Any:
        """Pipeline stage forward of one micro-batch; ``x`` from device ``source`` (None: this
        is the first stage and ``x`` the input ids, whose replica's rollout data arrives from
        ``data_sources`` (device -> bytes) before its first micro-batch)."""
        self._enter(task, it)
        start = self._now()
        if source is not None:
            self._receive(task, it, {source: tensor_bytes(x)})
        elif data_sources:
            self._receive(task, it, data_sources)
        engine = self.engines[task]
        ext = {k: v.to(self.torch_device) for k, v in (extras or {}).items()}
        out = self._compute(engine.stage_forward, micro, x.to(self.torch_device),
                            batch.to(self.torch_device), ext or None, scale)
        self._span(f"{task} F{micro}", "tasklet", task, it, start, replica=self.tasklets[task].replica,
                   stage=self.tasklets[task].stage, micro=micro)
        return out.cpu() if hasattr(out, "cpu") else out

    def stage_backward(self, task: str, it: int, micro: int, grad: Any, source: int | None) -> Any:
        start = self._now()
        if source is not None:
            self._receive(task, it, {source: tensor_bytes(grad)})
        engine = self.engines[task]
        out = self._compute(engine.stage_backward, micro,
                            grad.to(self.torch_device) if grad is not None else None)
        self._span(f"{task} B{micro}", "tasklet", task, it, start, replica=self.tasklets[task].replica,
                   stage=self.tasklets[task].stage, micro=micro)
        return out.cpu() if out is not None else None

    def stage_reduce(self, task: str, it: int, group: str | None,
                     group_devices: tuple[int, ...]) -> float:
        """After a pipelined replica's backwards: average this stage's gradients over its DP
        group; return their squared norm (the driver sums it over stages to clip globally)."""
        start = self._now()
        self._all_reduce(task, it, group, group_devices)
        self._span(f"{task} all-reduce", "tasklet", task, it, start,
                   replica=self.tasklets[task].replica, stage=self.tasklets[task].stage)
        return self.engines[task].grad_sq_norm()

    def stage_step(self, task: str, it: int, grad_norm: float) -> None:
        """Optimizer step of this stage, clipping by the whole model's gradient norm."""
        start = self._now()
        self._compute(self.engines[task].step, grad_norm)
        self._span(f"{task} step", "tasklet", task, it, start, replica=self.tasklets[task].replica,
                   stage=self.tasklets[task].stage)

    def _all_reduce(self, task: str, it: int, group: str | None,
                    group_devices: tuple[int, ...],
                    expert_dp_devices: tuple[int, ...] = ()) -> None:
        """Sum gradients over the DP group (gloo; every replica's loss is already scaled by its
        share of the whole batch's response tokens), plus the emulated ring time; with expert
        parallelism the experts' over ``expert_dp_devices`` (none: this rank's experts are
        held by no other replica, their gradients are whole)."""
        if group is None:
            return
        import torch.distributed as dist

        engine = self.engines[task]
        experts = {id(p) for p in getattr(engine, "expert_parameters", list)()}
        t = self.tasklets[task]
        phases = [(group, group_devices, [p for p in engine.parameters() if id(p) not in experts])]
        if expert_dp_devices:
            phases.append((expert_dp_group_name(task, t.replica, t.ep), expert_dp_devices,
                           [p for p in engine.parameters() if id(p) in experts]))
        for name, devices, members in phases:
            start = self._now()
            params = [p for p in members if p.grad is not None]
            nbytes = sum(p.grad.numel() * p.grad.element_size() for p in params)
            for p in params:  # replicas scaled their losses by their share of the batch: a sum
                dist.all_reduce(p.grad, group=self.dist_groups[name])
            wait(self.net.ring_all_reduce_s(devices, nbytes))
            self._span(f"{task} {'expert ' if name != group else ''}grad all-reduce",
                       "collective", task, it, start, devices, nbytes)

    # --- weights ---
    def export_weights(self, task: str) -> dict[str, Any]:
        """This tasklet's model weights (a stage's slice under pipelining), full parameter names."""
        engine = self.engines[task]
        if self.tasklets[task].stages > 1:
            return engine.stage_state_dict()
        return engine.state_dict()

    def load_weights(self, task: str, it: int, span_task: str, sources_of: Sequence[int],
                     *states: Mapping[str, Any]) -> tuple[str, str]:
        """Receive weight slices ``states`` from devices ``sources_of`` in parallel and load them.
        Returns the digest of the weights the engine holds afterwards and the digest of what was
        sent, cast to the engine's dtypes: equal when the sync is verified."""
        start = self._now()
        merged: dict[str, Any] = {}
        remote: dict[int, float] = {}
        for src, state in zip(sources_of, states, strict=True):
            merged.update(state)
            if src != self.device:
                remote[src] = remote.get(src, 0.0) + tensor_bytes(state)
        wait(self.net.gather_s(remote, self.device))
        self._load_state(task, {"weights": merged})
        self._span(f"{span_task} -> {task}", "transfer", span_task, it, start,
                   tuple(sorted(remote)) + (self.device,), sum(remote.values()))
        held = self._held_weights(task)
        sent = {k: v.to(held[k].dtype) for k, v in merged.items() if k in held}
        return digest(held), digest(sent)

    def _held_weights(self, task: str) -> dict[str, Any]:
        """The weights ``task``'s engine holds now (full parameter names)."""
        engine = self.engines[task]
        if self.tasklets[task].stages > 1:
            return engine.stage_state_dict()
        if hasattr(engine, "state_dict"):
            return engine.state_dict()
        return {k: v.detach().cpu() for k, v in engine.model.state_dict().items()}

    # --- checkpoints ---
    def save_state(self, task: str) -> dict[str, Any]:
        """A trainer's weights and optimizer state (CPU copies), to rebuild it on resume."""
        import torch

        engine = self.engines[task]
        if hasattr(engine, "save_state"):  # the megatron trainer: its rank's shards
            return engine.save_state()
        opt = engine.optimizer.state_dict()
        out = {"module": {k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()},
               "optimizer": torch.utils._pytree.tree_map(
                   lambda x: x.detach().cpu().clone() if isinstance(x, torch.Tensor) else x, opt)}
        if getattr(engine, "gathered_experts", None) is not None:  # what a resumed sync sends
            out["gathered_experts"] = dict(engine.gathered_experts)
        return out

    def _load_state(self, task: str, state: Mapping[str, Any]) -> None:
        engine = self.engines[task]
        if "optimizer" in state and hasattr(engine, "load_saved"):
            engine.load_saved(state)
        elif "optimizer" in state:  # a trainer restored from a checkpoint
            engine.module.load_state_dict(state["module"])
            engine.optimizer.load_state_dict(state["optimizer"])
            if "gathered_experts" in state:
                engine.gathered_experts = dict(state["gathered_experts"])
        elif hasattr(engine, "update_weights"):
            engine.update_weights(state["weights"])
        else:
            engine.load_state(state["weights"])
