"""The discrete-event simulator: RL iterations of a plan replayed on SimPy.

Entities: one compute stream per device (a SimPy resource: a task holds the streams of all its
devices while it runs, so tasks sharing GPUs run one after another), the fluid network of
:mod:`sim.network`, and the processes below.

- Generation, per DP replica: continuous batching. Each sequence's prompt and response lengths
  are drawn (seeded per iteration); up to B sequences decode at once (B from the KV cache left
  on the replica's devices, as in the cost model); admitted prompts are prefilled, then the batch
  decodes until its next sequence ends (runs of decode steps whose time follows the batch and
  its growing context); the replica ends with its last sequence.
- Inference and training, per micro-batch through the pipeline stages, with the stage-to-stage
  activations (and gradients) moved over the network, each send holding its stage until it is
  delivered (blocking point-to-point, as in Megatron's schedules); training runs 1F1B, then the
  gradient reduce-scatter and parameter all-gather of every DP group as ring steps over the network,
  then the optimizer step.
- Rollout data moves from the generation replicas to every downstream replica; after actor
  training the weights move to the generation devices (the cost model's pull plan).

Sync and async share one loop: generation of iteration i waits until the weights of iteration
i - 1 - k have arrived (k = 0 in sync mode), and training consumes batches in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

from hetrl.cost.batching import Batching, micro_batching
from hetrl.cost.expert_parallel import (
    dispatch_bytes,
    expert_gather_work,
    expert_group_links,
    gradient_groups,
)
from hetrl.cost.flops import StageShape, collectives_per_layer
from hetrl.cost.framework import batch_tokens, task_framework_seconds
from hetrl.cost.fsdp import megatron_offload_seconds, offload_seconds
from hetrl.cost.model import CostModel
from hetrl.cost.model_transfers import DATA_BYTES_PER_TOKEN
from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.cost.rollout import generation_concurrency, kv_capacity_tokens
from hetrl.cost.sync import weight_sync_transfers, weights_shared_in_place
from hetrl.plan import Plan, TaskPlacement
from hetrl.shares import split_counts
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.tasks import NEEDS_TRAINED
from hetrl.spec.workload import WorkloadSpec
from hetrl.trace import Span
from sim import batches
from sim.guards import HORIZON_S, STUCK_EVENTS, SimulationLimitError
from sim.network import LinkFault, Network
from sim.ops import ReplicaOps
from sim.scheduler import GenerationStats, generate

#: Events between two calls of a simulation's ``progress`` callback.
PROGRESS_EVERY = 20_000


@dataclass
class Batch:
    """One iteration's samples: prompt and response lengths (tokens), and where each was
    generated (the generation replica's head device)."""

    iteration: int
    prompt: np.ndarray
    response: np.ndarray
    origin: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class Simulation:
    def __init__(self, plan: Plan, workload: WorkloadSpec, cluster: ClusterSpec,
                 params: CostParams = DEFAULT_PARAMS, seed: int = 0, start_s: float = 0.0,
                 first_iteration: int = 0):
        self.plan, self.workload, self.cluster = plan, workload, cluster
        self.seed = seed
        self.env = simpy.Environment(initial_time=start_s)
        self.model = CostModel(workload, cluster, params)
        # the framework's per-step costs, as the cost model charges them (hetrl.cost.profiles)
        self.params = params = self.model.params
        devices = cluster.devices
        self.net = Network(self.env, cluster,
                           lambda d: params.efficiency(devices[d].gpu.name, "link"))
        self.streams = {d.id: simpy.Resource(self.env, 1) for d in devices}
        self.slowdown = np.ones(cluster.num_devices)
        self.spans: list[Span] = []
        self.iterations: list[tuple[float, float]] = []
        self.first_iteration = first_iteration
        #: Called now and then with (simulated seconds, iterations done) during :meth:`run`.
        self.progress: Callable[[float, int], None] | None = None
        self.placements = {p.task: p for p in plan.placements}
        #: per placement with expert parallelism, per EP group, per stage its links
        self.expert_links = {p.task: expert_group_links(cluster, p) for p in plan.placements
                             if p.ep > 1}
        self.ops = {p.task: [ReplicaOps(self.model.shapes(p.task, p), self.model.hw(r), params,
                                        workload.gen_cuda_graphs, workload.tp_comm_overlap,
                                        self.expert_links[p.task][i // p.ep]
                                        if p.ep > 1 else None)
                             for i, r in enumerate(p.devices)] for p in plan.placements}
        kv = self.model.kv_budgets(plan)
        gen = self.placements["actor_generation"]
        shapes = self.model.shapes(gen.task, gen)
        L = self.model.L
        budgets = [tuple(float(min(kv[d] for d in stage)) for stage in replica)
                   for replica in gen.devices]
        #: per replica the cost model's concurrency (reported beside the simulated batch)
        self.concurrency = [generation_concurrency(shapes, b, L.prompt_mean + L.mean_age,
                                                   workload.gen_max_concurrency)
                            for b in budgets]
        #: per replica the KV tokens its engine holds: the smallest stage budget over the
        #: stage's KV bytes per token (the scheduler allocates them on demand)
        self.kv_tokens = [kv_capacity_tokens(shapes, b) for b in budgets]
        # the weight sync's pulls and local copies, then (plan.sync_relay) the fan-out inside
        # each remote region, as the cost model prices them
        self.pulls, self.fan_out, self.local_copies = weight_sync_transfers(
            gen, shapes, self.placements["actor_training"], cluster, params,
            shared_in_place=weights_shared_in_place(workload, self.placements["actor_training"]),
            relay=plan.sync_relay)
        # the sync's NCCL call overhead and the co-located engine's sleep and wake, as priced
        devices = {p.task: frozenset(p.device_ids) for p in plan.placements}
        self.sync_overhead_s = sum(self.model.sync_overheads(
            gen, self.model.weight_sync_seconds(gen, self.placements["actor_training"],
                                                plan.sync_relay),
            devices))
        self.stage_names = [[t.name for t in workload.tasks if t.stage == s] for s in (0, 1, 2)]

    # --- helpers ---
    def span(self, name: str, kind: str, task: str, it: int, start: float, devices=(),
             nbytes: float = 0.0, **meta) -> None:
        self.spans.append(Span(name, kind, task, it, float(start), float(self.env.now),
                               tuple(int(d) for d in devices), float(nbytes), meta))

    def slow(self, devices) -> float:
        return float(max(self.slowdown[d] for d in devices))

    def draw(self, iteration: int) -> Batch:
        rng = np.random.default_rng([self.seed, iteration])
        wl = self.workload
        prompts = wl.prompt_length.sample(rng, wl.batch_prompts)
        responses = wl.response_length.sample(rng, wl.samples)
        return Batch(iteration, np.repeat(prompts, wl.responses_per_prompt), responses)

    def move(self, src: int, dst: int, nbytes: float, task: str, it: int, name: str,
             weight: int = 1):
        """A network transfer recorded as a span (``weight`` identical parallel flows)."""
        start = self.env.now
        yield self.net.transfer(src, dst, nbytes, weight)
        if src != dst and nbytes > 0:
            self.span(name, "transfer", task, it, start, (src, dst), nbytes * weight,
                      flows=weight)

    def bundle(self, pairs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
        """Parallel flows between the same two nodes, as (src, dst, weight) bundles."""
        node = self.cluster.topology.node_of
        groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for a, b in pairs:
            if a != b:
                groups.setdefault((int(node[a]), int(node[b])), []).append((a, b))
        return [(g[0][0], g[0][1], len(g)) for g in groups.values()]

    # --- tasks ---
    def run_task(self, task: str, batch: Batch):
        """Hold the task's devices, run its replicas in parallel, record the task span."""
        p = self.placements[task]
        devices = sorted(p.device_ids)
        requests = [self.streams[d].request() for d in devices]
        for r in requests:
            yield r
        start = self.env.now
        kind = self.workload.task(task).kind
        if kind == "generation":
            counts = split_counts(len(batch.response), p.data_shares)
            bounds = np.cumsum([0] + counts)
            origin = np.zeros(len(batch.response), dtype=np.int64)
            procs = []
            for i, replica in enumerate(p.devices):
                lo, hi = int(bounds[i]), int(bounds[i + 1])
                origin[lo:hi] = replica[0][0]
                procs.append(self.env.process(self.generation_replica(
                    task, i, batch, lo, hi)))
            batch.origin = origin
            yield simpy.AllOf(self.env, procs)
        else:
            yield from self.forward_task(p, kind, batch)
        wl = self.workload
        framework_s = task_framework_seconds(
            kind, len(batch.response), batch_tokens(len(batch.response), wl.prompt_length.max,
                                                    wl.response_length.max),
            wl.reward == "rule", self.params)
        if framework_s > 0:  # the controller's per-call work (hetrl.cost.framework)
            yield self.env.timeout(framework_s)
        for d, r in zip(devices, requests, strict=True):
            self.streams[d].release(r)
        self.span(task, "task", task, batch.iteration, start, devices)

    def generation_replica(self, task: str, i: int, batch: Batch, lo: int, hi: int):
        p = self.placements[task]
        devices = [d for stage in p.devices[i] for d in stage]
        start = self.env.now
        stats = GenerationStats()
        prefill_s = decode_s = 0.0
        for dt, separate in generate(self.ops[task][i], batch.prompt[lo:hi],
                                     batch.response[lo:hi], self.workload.gen_max_concurrency,
                                     self.kv_tokens[i], stats):
            dt *= self.slow(devices)
            if separate:
                prefill_s += dt
            else:
                decode_s += dt
            yield self.env.timeout(dt)
        B, step, peak, prompt_tokens = (self.concurrency[i], stats.steps, stats.peak_batch,
                                        stats.prompt_tokens)
        self.span(f"{task}[{i}]", "tasklet", task, batch.iteration, start, devices,
                  sequences=hi - lo, concurrency=B, peak_batch=peak,
                  preemptions=stats.preemptions)
        # The replica's prefill waves interleave with its decode; the phase spans carry their
        # summed times, laid end to end inside the tasklet (interleaved: true).
        it, devs = batch.iteration, tuple(int(d) for d in devices)
        mid = min(start + prefill_s, self.env.now)
        self.spans.append(Span("prefill", "phase", task, it, float(start), float(mid), devs, 0.0,
                               {"replica": i, "sequences": hi - lo, "prompt_tokens": prompt_tokens,
                                "interleaved": True}))
        self.spans.append(Span("decode", "phase", task, it, float(mid),
                               float(min(mid + decode_s, self.env.now)), devs, 0.0,
                               {"replica": i, "steps": step, "batch": B, "interleaved": True}))

    def forward_task(self, p: TaskPlacement, kind: str, batch: Batch):
        wl = self.workload
        n = len(batch.response)
        counts = split_counts(n, p.data_shares)
        bounds = np.cumsum([0] + counts)
        lengths = batch.prompt + batch.response
        steps = wl.optimizer_steps if kind == "training" else 1
        # Rollout data in: from each sample's generation replica to the replica's first device.
        moves = []
        for i, replica in enumerate(p.devices):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            head = replica[0][0]
            per_src: dict[int, float] = {}
            for src, tok in zip(batch.origin[lo:hi].tolist(), lengths[lo:hi].tolist(), strict=True):
                per_src[src] = per_src.get(src, 0.0) + tok * DATA_BYTES_PER_TOKEN[kind]
            moves += [self.env.process(self.move(src, head, b, p.task, batch.iteration, "rollout data"))
                      for src, b in per_src.items()]
        if moves:
            yield simpy.AllOf(self.env, moves)
        if p.backend == "fsdp":
            yield from self.fsdp_task(p, kind, bounds, lengths, steps, batch.iteration)
            return
        batching = micro_batching(wl, kind, p.task)
        for step in range(steps):
            # this optimizer step's slice of each replica's samples, in micro-batches
            micro = batches.split_replicas(
                [np.array_split(np.arange(int(bounds[i]), int(bounds[i + 1])), steps)[step]
                 for i in range(p.dp)], lengths, batching)
            # with overlap_grad_reduce, each stage's DP sync starts as soon as every replica
            # has begun that stage's last backward (Megatron's --overlap-grad-reduce)
            overlap = kind == "training" and wl.overlap_grad_reduce
            ready = [[self.env.event() for _ in range(p.pp)] for _ in range(p.dp)] \
                if overlap else None
            procs = [self.env.process(self.pipeline(p, i, micro[i], lengths, kind, batch.iteration,
                                                    ready[i] if ready else None))
                     for i in range(p.dp)]
            if overlap:
                procs.append(self.env.process(self.gradient_sync(p, batch.iteration, ready)))
            yield simpy.AllOf(self.env, procs)
            if kind == "training":
                if not overlap:
                    yield from self.gradient_sync(p, batch.iteration)
                yield from self.optimizer_step(p, batch.iteration)
        if p.offload:  # Megatron's offloaded states' host round trip, once per call
            yield self.env.timeout(megatron_offload_seconds(
                kind, self.model.shapes(p.task, p), p.dp, self.params))

    def pipeline(self, p: TaskPlacement, i: int, micro: list[np.ndarray], lengths: np.ndarray,
                 kind: str, it: int, last_backward: list[simpy.Event] | None = None):
        """Micro-batches through the stages of replica i: forward only (inference) or 1F1B.
        ``last_backward``: per stage, an event to fire when the stage begins its last backward
        (at once when the replica has no micro-batch)."""
        ops = self.ops[p.task][i]
        replica = p.devices[i]
        pp = p.pp
        m = len(micro)
        if m == 0:
            for event in last_backward or ():
                event.succeed()
            return
        tok, sq = batches.costed(micro, lengths, micro_batching(self.workload, kind, p.task))
        act = [[self.env.event() for _ in range(pp)] for _ in range(m)]
        grad = [[self.env.event() for _ in range(pp)] for _ in range(m)]
        train = kind == "training"
        recompute = self.workload.task_recompute_mode(p.task)
        stage_done = []

        def send(src_stage: int, dst_stage: int, mb: int, event: simpy.Event, what: str):
            nbytes = ops.boundary_bytes(tok[mb])
            pairs = list(zip(replica[src_stage], replica[dst_stage], strict=True))
            flows = [self.env.process(self.move(a, b, nbytes, p.task, it, what, w))
                     for a, b, w in self.bundle(pairs)]
            if flows:
                yield simpy.AllOf(self.env, flows)
            event.succeed()

        def stage(j: int):
            devs = replica[j]
            if train:
                warm = min(pp - j - 1, m)
                order = [("F", k) for k in range(warm)]
                for k in range(m - warm):
                    order += [("F", warm + k), ("B", k)]
                order += [("B", k) for k in range(m - warm, m)]
            else:
                order = [("F", k) for k in range(m)]
            busy = 0.0
            first = None
            for op, mb in order:
                if op == "F" and j > 0:
                    yield act[mb][j]
                if op == "B" and j < pp - 1:
                    yield grad[mb][j]
                start = self.env.now
                first = start if first is None else first
                if op == "B" and mb == m - 1 and last_backward is not None:
                    last_backward[j].succeed()
                if op == "F":
                    dur = ops.forward(j, tok[mb], sq[mb], "train" if train else "infer")
                else:
                    dur = ops.backward(j, tok[mb], sq[mb], recompute)
                yield self.env.timeout(dur * self.slow(devs))
                if p.ep > 1 and ops.stages[j].shape.moe_layers:
                    # forward: dispatch and combine; backward: theirs (and the forward's again
                    # under recomputation)
                    count = 2 if op == "F" else collectives_per_layer(kind, recompute) - 2
                    yield from self.expert_alltoall(p, i, j, tok[mb], count, it)
                busy += self.env.now - start
                self.span("forward" if op == "F" else "backward", "tasklet", p.task, it, start,
                          devs, replica=i, stage=j, micro_batch=mb)
                # The send blocks the stage until delivered (Megatron's blocking p2p), as the
                # cost model's per-stage time c_j + send_j assumes.
                if op == "F" and j < pp - 1:
                    yield self.env.process(send(j, j + 1, mb, act[mb][j + 1], "activations"))
                if op == "B" and j > 0:
                    yield self.env.process(send(j, j - 1, mb, grad[mb][j - 1], "gradients"))
            stage_done.append((first, self.env.now, busy))

        yield simpy.AllOf(self.env, [self.env.process(stage(j)) for j in range(pp)])

    def fsdp_task(self, p: TaskPlacement, kind: str, bounds: np.ndarray, lengths: np.ndarray,
                  steps: int, it: int):
        """An FSDP task (pp = tp = 1): per optimizer step, the ranks run their k-th micro-batches
        together while the group's ring gathers the weights (twice in training, for forward and
        backward) and reduce-scatters the gradients; the next micro-batch starts when both are
        done (lockstep: the collectives need every rank), then the sharded optimizer step; with
        offload, after the last step, the shards' host round trip (once per call, as verl)."""
        wl = self.workload
        train = kind == "training"
        batching = micro_batching(wl, kind, p.task)
        shape = self.model.shapes(p.task, p)[0]
        value = wl.bytes_per_value
        per_param = 2 * value + self.params.grad_bytes if train else value
        ops = self.ops[p.task]
        for step in range(steps):
            micro = batches.split_replicas(
                [np.array_split(np.arange(int(bounds[i]), int(bounds[i + 1])), steps)[step]
                 for i in range(p.dp)], lengths, batching)
            for k in range(max(len(m) for m in micro)):
                procs = [self.env.process(self.fsdp_micro(p, i, micro[i][k], lengths, ops[i],
                                                          train, it, batching))
                         for i in range(p.dp) if k < len(micro[i])]
                if p.dp > 1:
                    procs.append(self.env.process(self.fsdp_rings(p, shape, per_param)))
                yield simpy.AllOf(self.env, procs)
            if train:
                yield from self.optimizer_step(p, it)
        if p.offload:  # the shards' host round trip, once per task call
            yield self.env.timeout(offload_seconds(kind, shape, p.dp, self.params))

    def fsdp_rings(self, p: TaskPlacement, shape: StageShape, per_param: float):
        """An FSDP group's collectives of ``per_param`` bytes per parameter, in the phases of
        :func:`~hetrl.cost.expert_parallel.gradient_groups` (one ring over its dp ranks; with
        expert parallelism the non-expert parameters' ring over the dp ranks, then the experts'
        rings over the dp / ep ranks holding the same experts, all at once), each ring node by
        node (:meth:`_dp_rings`), as the cost model prices them."""
        for sets in gradient_groups(p, (shape,), per_param):
            rings = self._dp_rings(p, sets)
            if rings:
                yield simpy.AllOf(self.env, [self.env.process(self.ring(members, nbytes, weight))
                                             for _, members, nbytes, weight in rings])

    def fsdp_micro(self, p: TaskPlacement, i: int, mb: np.ndarray, lengths: np.ndarray, ops,
                   train: bool, it: int, batching: int | Batching):
        """One FSDP rank's micro-batch: forward, and backward in training (its tokens as
        costed: :func:`sim.batches.costed`)."""
        devs = p.devices[i][0]
        (tok,), (sq,) = batches.costed([mb], lengths, batching)
        start = self.env.now
        recompute = self.workload.task_recompute_mode(p.task)
        forward = ops.forward(0, tok, sq, "train" if train else "infer")
        if p.ep > 1 and ops.stages[0].shape.moe_layers:  # the all-to-alls after each pass
            yield self.env.timeout(forward * self.slow(devs))
            yield from self.expert_alltoall(p, i, 0, tok, 2, it)  # dispatch and combine
            if train:  # their gradients (and the forward's again under full recomputation)
                yield self.env.timeout(ops.backward(0, tok, sq, recompute) * self.slow(devs))
                yield from self.expert_alltoall(
                    p, i, 0, tok, collectives_per_layer("training", recompute) - 2, it)
        else:
            dur = forward + (ops.backward(0, tok, sq, recompute) if train else 0.0)
            yield self.env.timeout(dur * self.slow(devs))
        self.span("forward" if not train else "forward+backward", "tasklet", p.task, it, start,
                  devs, replica=i, stage=0)

    def expert_alltoall(self, p: TaskPlacement, i: int, j: int, tokens: float, count: int,
                        it: int):
        """Replica ``i``'s all-to-alls at stage ``j`` for one micro-batch of ``tokens`` tokens:
        ``count`` per MoE layer, each rank's dispatch bytes
        (:func:`hetrl.cost.expert_parallel.dispatch_bytes`) spread evenly over the other ranks
        of its expert-parallel group, as flows on the network (all of a stage's layers' bytes
        in one flow per pair; flows between two nodes bundled, as they share the nodes' links,
        flows inside a node one per pair, as each uses its own devices' links), after the
        calls' latencies but one."""
        shape = self.ops[p.task][i].stages[j].shape
        first = i - i % p.ep
        mine = p.devices[i][j]
        others = [d for r in range(first, first + p.ep) for d in p.devices[r][j]
                  if d not in mine]
        calls = count * shape.moe_layers
        per_pair = calls * dispatch_bytes(shape, tokens) / (len(others) + len(mine) - 1)
        pairs = [(a, b) for a in mine for b in others]
        lat = max(self.net.path_latency(a, b) for a, b in pairs)
        yield self.env.timeout((calls - 1) * lat)
        node = self.cluster.topology.node_of
        inside = [(a, b, 1) for a, b in pairs if node[a] == node[b]]
        across = self.bundle([(a, b) for a, b in pairs if node[a] != node[b]])
        flows = [self.env.process(self.move(a, b, per_pair, p.task, it, "all-to-all", w))
                 for a, b, w in inside + across]
        if flows:
            yield simpy.AllOf(self.env, flows)

    def gradient_sync(self, p: TaskPlacement, it: int,
                      ready: list[list[simpy.Event]] | None = None):
        """Reduce-scatter of gradients and all-gather of parameters in every DP group, as ring
        steps of flows over the network (all groups at once; with ``ready``, per replica and
        stage an event, each stage's rings once all replicas' events of that stage fired).
        With expert parallelism the routed experts' gradients go over the replicas that hold
        the same experts (i, i + ep, ...), after the rest's over all dp replicas, as the cost
        model prices them (one after the other)."""
        if p.dp == 1:
            return
        phases = gradient_groups(p, self.model.shapes(p.task, p),
                                 self.params.grad_bytes + self.workload.bytes_per_value)
        start = self.env.now
        moved = 0.0
        for sets in phases:
            groups = self._dp_rings(p, sets)
            moved += sum(b * w for _, _, b, w in groups)

            def stage_ring(j: int, members: list[int], nbytes: float, weight: int):
                if ready is not None:
                    yield simpy.AllOf(self.env, [ready[r][j] for r in range(p.dp)])
                yield from self.ring(members, nbytes, weight)

            yield simpy.AllOf(self.env, [self.env.process(stage_ring(*g)) for g in groups])
        self.span("gradient sync", "collective", p.task, it, start,
                  sorted({d for r in range(p.dp) for stage in p.devices[r] for d in stage}),
                  moved)

    def _dp_rings(self, p: TaskPlacement, sets: list[tuple[range, list[float]]]
                  ) -> list[tuple[int, list[int], float, int]]:
        """Per stage and set of replicas (with each stage's bytes), the tp rings over them as
        (stage, ring, bytes, weight): rings that visit the same nodes in turn bundled."""
        topo = self.cluster.topology
        groups = []
        for members, stage_bytes in sets:
            if len(members) < 2:
                continue
            for j, nbytes in enumerate(stage_bytes):
                if nbytes <= 0:
                    continue
                by_nodes: dict[tuple[int, ...], list[list[int]]] = {}
                for k in range(p.tp):
                    ring = sorted((p.devices[r][j][k] for r in members),
                                  key=lambda d: (int(topo.node_of[d]), d))
                    by_nodes.setdefault(tuple(int(topo.node_of[d]) for d in ring),
                                        []).append(ring)
                for same in by_nodes.values():
                    groups.append((j, same[0], nbytes, len(same)))
        return groups

    def ring(self, members: list[int], nbytes: float, weight: int = 1):
        """(n - 1) steps each moving nbytes / n from every member to the next in the ring --
        a reduce-scatter of grad bytes followed by an all-gather of parameter bytes.
        ``weight`` identical rings over the same nodes move together."""
        n = len(members)
        chunk = nbytes / n
        pairs = list(zip(members, members[1:] + members[:1], strict=True))
        for _ in range(n - 1):
            yield simpy.AllOf(self.env, [self.net.transfer(a, b, chunk, weight) for a, b in pairs])

    def optimizer_step(self, p: TaskPlacement, it: int):
        shapes = self.model.shapes(p.task, p)
        topo = self.cluster.topology
        worst = 0.0
        for replica in p.devices:
            for shape, stage in zip(shapes, replica, strict=True):
                for d in stage:
                    gpu = self.cluster.devices[d].gpu.name
                    t = shape.dp_sharded_params * self.params.optimizer_step_hbm_bytes / p.dp / (
                        topo.hbm_Bps[d] * self.params.efficiency(gpu, "hbm"))
                    worst = max(worst, t * self.slowdown[d])
        yield self.env.timeout(worst)

    def weight_sync(self, it: int):
        start = self.env.now
        train = self.placements["actor_training"]
        if train.backend == "fsdp" and train.dp > 1:  # the shards gathered into full copies
            shape = self.model.shapes(train.task, train)[0]
            yield self.env.process(self.fsdp_rings(train, shape, self.workload.bytes_per_value))
        if train.ep > 1 and (self.pulls or self.local_copies):
            yield from self.expert_gather(train)
        procs = [self.env.process(self.move(src, dst, b, "weight_sync", it, "weights"))
                 for src, dst, b in self.pulls]
        if self.local_copies:
            procs.append(self.env.timeout(max(t for _, t in self.local_copies)))
        if procs:
            yield simpy.AllOf(self.env, procs)
        if self.fan_out:  # the relay: once every pull has ended, the rings in remote regions
            yield simpy.AllOf(self.env, [
                self.env.process(self.move(src, dst, b, "weight_sync", it, "weights relayed"))
                for src, dst, b in self.fan_out])
        if self.sync_overhead_s > 0:
            yield self.env.timeout(self.sync_overhead_s)
        devices = sorted({d for _, d, _ in self.pulls} | {d for _, d, _ in self.fan_out}
                         | {d for d, _ in self.local_copies})
        self.span("weight_sync", "task", "weight_sync", it, start, devices,
                  sum(b for _, _, b in self.pulls + self.fan_out))

    def expert_gather(self, train: TaskPlacement):
        """A trainer with expert parallelism gathers its experts before a weight sync
        (:func:`hetrl.cost.expert_parallel.expert_gather_seconds`): per expert-parallel group,
        stage and tp rank a ring all-gather of the stage's experts over the group's devices, all
        at once as flows, after the per-tensor calls' latencies
        (:func:`hetrl.cost.expert_parallel.expert_gather_work`)."""
        shapes = self.model.shapes(train.task, train)
        rings, waits = [], [0.0]
        for k in range(0, train.dp, train.ep):
            members = train.devices[k:k + train.ep]
            for j, s in enumerate(shapes):
                if not s.moe_layers:
                    continue
                whole, calls = expert_gather_work(s)
                for r in range(train.tp):
                    ring = [m[j][r] for m in members]
                    lat = max(self.net.path_latency(a, b)
                              for a, b in zip(ring, ring[1:] + ring[:1], strict=True))
                    waits.append((calls - 1) * (len(ring) - 1) * lat)
                    rings.append(self.env.process(self.ring(ring, whole)))
        yield self.env.timeout(max(waits))
        if rings:
            yield simpy.AllOf(self.env, rings)

    # --- the loop ---
    def run(self, iterations: int, stop: simpy.Event | None = None) -> None:
        """Simulate ``iterations`` iterations (or until ``stop`` fires).

        Generation of iteration i waits for the weights of iteration i - 1 - k (k = 0: sync).
        Each generated batch then has its own consumer: inference tasks start as soon as their
        devices are free (inference by a trained model, critic values and the actor's old
        log-probs, also waits for it trained on the previous batch), training takes batches in order, and the weight sync follows actor training."""
        k = self.workload.staleness
        env = self.env
        first = self.first_iteration
        versions = [env.event() for _ in range(iterations + 1)]  # weights after iteration i - 1
        trained = [env.event() for _ in range(iterations + 1)]  # training of batch i - 1 done
        produced = [env.event() for _ in range(iterations)]
        synced = [env.event() for _ in range(iterations)]
        versions[0].succeed()
        trained[0].succeed()
        self.begin = env.now
        inference = self.stage_names[1]
        training = self.stage_names[2]

        def producer():
            for i in range(iterations):
                yield versions[max(0, i - k)]
                batch = self.draw(first + i)
                start = env.now
                yield env.process(self.run_task("actor_generation", batch))
                produced[i].succeed((batch, start))

        def inference_task(t: str, i: int, batch: Batch):
            if t in NEEDS_TRAINED:
                yield trained[i]
            yield env.process(self.run_task(t, batch))

        def consumer(i: int):
            batch, gen_start = yield produced[i]
            yield simpy.AllOf(env, [env.process(inference_task(t, i, batch)) for t in inference])
            yield trained[i]
            yield simpy.AllOf(env, [env.process(self.run_task(t, batch)) for t in training])
            trained[i + 1].succeed()
            yield env.process(self.weight_sync(first + i))
            versions[i + 1].succeed()
            synced[i].succeed(gen_start)

        def recorder():
            last = self.begin
            for i in range(iterations):
                gen_start = yield synced[i]
                start = gen_start if k == 0 else last
                self.iterations.append((float(start), float(env.now)))
                last = env.now

        for i in range(iterations):
            env.process(consumer(i))
        env.process(producer())
        done = env.process(recorder())
        until = done if stop is None else (done | stop)
        self.events = 0
        last, same = env.now, 0
        while not until.triggered:  # env.run(until=...), counting the events processed
            try:
                env.step()
            except simpy.core.EmptySchedule:
                break
            self.events += 1
            if env.now != last:
                last, same = env.now, 0
                if not env.now <= HORIZON_S:  # a step jumped past it (a huge straggler)
                    raise SimulationLimitError(
                        f"simulated time jumped to {env.now:.3g} s, past the simulator's "
                        f"horizon of {HORIZON_S:.0e} s; {self.in_effect()}")
            else:
                same += 1
                if same >= STUCK_EVENTS:
                    raise SimulationLimitError(
                        f"the simulation stopped advancing at {env.now:.6g} s ({same:,} events "
                        f"at that instant); {self.in_effect()}")
            if self.progress is not None and self.events % PROGRESS_EVERY == 0:
                self.progress(env.now, len(self.iterations))

    def in_effect(self) -> str:
        """The faults in effect, in words (what a guard's message blames)."""
        slow = [f"device {d} slowdown {s:g}" for d, s in enumerate(self.slowdown) if s > 1]
        links = [f"link_degraded {f.a}/{f.b} bandwidth_factor {f.bandwidth_factor:g}"
                 for f in self.net.faults]
        parts = ([f"stragglers: {', '.join(slow)}"] if slow else []) + links
        return "faults in effect: " + "; ".join(parts) if parts else "no fault in effect"

    def add_link_fault(self, fault: LinkFault) -> None:
        self.net.add_fault(fault)
