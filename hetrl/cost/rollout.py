"""The rollout engine as it is configured: per-step overhead with and without CUDA graphs, the KV
pool under ``gpu_memory_utilization``, the co-located engine switch, and the weight sync's calls.

- **Decode step overhead.** Every decode step pays the scheduler, sampling and the kernel
  launches. With CUDA graphs (vLLM's default) the launches of a step are one graph replay: the
  fixed ``decode_step_overhead_s``. An eager engine (``enforce_eager``, or a backend without
  graphs) launches each layer's kernels from the CPU: ``eager_launch_s_per_layer`` more per
  layer of the replica's longest stage (stages launch in parallel).
- **KV pool.** vLLM sizes its pool as ``gpu_memory_utilization`` x the GPU's memory less its own
  weights (and a profiling run's activations, here inside the usable fraction); without the
  setting the pool takes what the device's other tenants leave (a dedicated engine).
- **Engine switch.** A co-located rollout engine in a synchronous plan (verl's hybrid engine)
  sleeps while other tasks use its GPUs and wakes for the next rollout (vLLM sleep mode; the
  workload's ``gen_sleep_level``: level 1, the default, offloads the weights to host memory and
  discards the KV cache; level 2 discards both, the weight sync reloading them): each iteration
  ``engine_switch_s`` for freeing and re-allocating the pool (the graphs are kept) and, at level
  1, the weight shard to the host and back over the host link (vLLM's sleep-mode post: 0.26-0.85 s per wake for small
  models, almost all fixed cost).
- **Weight-sync calls.** Trainers send weights in NCCL calls -- one per tensor (verl's and
  NeMo-RL's per-tensor broadcast) or one per bucket of ``sync_bucket_bytes`` -- and each call
  costs ``sync_call_overhead_s`` beyond its bytes (verl's checkpoint-engine ablation: a 7B
  per-tensor sync takes 0.12 s where its bytes need a few ms; SGLang's per-call fix took a 1B
  sync from 7.0 s to 0.5 s).

Constants and sources: ``hetrl.cost.params`` and docs/cost-model.md.
"""

from __future__ import annotations

import math

from hetrl.cost.flops import StageShape
from hetrl.cost.params import CostParams

#: Weight tensors per transformer layer in a per-tensor sync: q, k, v, o, gate, up, down and two
#: norms (Llama/Qwen layers; the fused qkv/gate-up of some engines only lowers the count).
TENSORS_PER_LAYER = 9


def decode_step_overhead_s(shapes: tuple[StageShape, ...], params: CostParams,
                           cuda_graphs: bool) -> float:
    """Seconds of fixed work per decode step of one replica of ``shapes`` (with
    ``launch_overhead_s_per_layer`` x the layers of its longest stage)."""
    layers = max(s.layers for s in shapes)
    fixed = params.decode_step_overhead_s + params.launch_overhead_s_per_layer * layers
    if cuda_graphs:
        return fixed
    return fixed + params.eager_launch_s_per_layer * layers


def kv_pool_cap(total_bytes: float, engine_weight_bytes: float,
                utilization: float | None) -> float:
    """The most KV cache one device's engine allocates (bytes): ``utilization`` x its memory
    less its weights; unbounded (inf) without the setting."""
    if utilization is None:
        return math.inf
    return utilization * total_bytes - engine_weight_bytes


def generation_concurrency(shapes: tuple[StageShape, ...], kv_budget: tuple[float, ...],
                           seq_tokens: float, max_concurrency: int) -> int:
    """Sequences one generation replica decodes at once: ``max_concurrency`` (vLLM
    ``max_num_seqs``) or as many as each stage's KV budget (bytes per device of the stage) holds
    at ``seq_tokens`` tokens of KV per sequence, whichever is fewer; at least 1. The cost model
    and the simulator both size their batches with it."""
    cap = max_concurrency
    for s, budget in zip(shapes, kv_budget, strict=True):
        cap = min(cap, int(max(budget, 0.0) // (s.kv_bytes_per_token * seq_tokens)))
    return max(cap, 1)


def kv_capacity_tokens(shapes: tuple[StageShape, ...], kv_budget: tuple[float, ...]) -> float:
    """The KV tokens one generation replica holds: each stage's budget (bytes per device) over
    its KV bytes per token, the smallest stage's (tokens, not rounded)."""
    return min(max(budget, 0.0) / s.kv_bytes_per_token
               for s, budget in zip(shapes, kv_budget, strict=True))


#: vLLM sleep levels: 1 offloads the weights to host memory and discards the KV cache; 2
#: discards both (the weights are reloaded on wake: in RL, by the weight sync itself); both keep
#: the CUDA graphs. 0: no sleep mode, a cold restart: the KV cache freed and rebuilt, the
#: weights kept on the GPU, the CUDA graphs captured again.
SLEEP_LEVELS = (0, 1, 2)


def switch_seconds(engine_weight_bytes: float, params: CostParams, sleep_level: int = 1,
                   cuda_graphs: bool = True) -> float:
    """One sleep-and-wake of a co-located rollout engine holding ``engine_weight_bytes`` per
    device (the largest shard: devices switch in parallel), seconds: the KV pool freed and
    re-allocated (``engine_switch_s``), at sleep level 1 the weight shard to host memory and
    back over the host link, at level 0 (a cold restart) the CUDA graphs' capture
    (``graph_capture_s``, when ``cuda_graphs``). (The reshard of the trainer's weights into
    the engine's layout and their load are the weight sync's.)"""
    host = 2 * engine_weight_bytes / (params.host_link_GBps * 1e9) if sleep_level == 1 else 0.0
    capture = params.graph_capture_s if sleep_level == 0 and cuda_graphs else 0.0
    return params.engine_switch_s + host + capture


def moe_layer_tensors(shape: StageShape) -> int:
    """Weight tensors of one MoE layer in a per-tensor sync (Hugging Face's layout, which verl
    and NeMo-RL send in): a dense layer's but its MLP's three, the router (none for a single
    expert), and gate, up and down of every routed and shared expert."""
    moe = shape.model.moe
    assert moe is not None
    router = 1 if moe.experts > 1 else 0
    return TENSORS_PER_LAYER - 3 + router + 3 * (moe.experts + moe.shared_experts)


def sync_calls(shapes: tuple[StageShape, ...], params: CostParams) -> int:
    """NCCL calls to send one generation replica's weights: one per tensor of its largest stage
    (stages receive in parallel; an MoE layer's experts are a tensor each,
    :func:`moe_layer_tensors`), or one per ``sync_bucket_bytes`` of the whole stage (not only a
    rank's share: every tensor is sent) when bucketed."""
    if params.sync_bucket_bytes > 0:
        return max(math.ceil((s.weight_bytes + s.expert_weight_bytes * (s.ep - 1)) * s.tp
                             / params.sync_bucket_bytes) for s in shapes)
    return max((s.layers - s.moe_layers) * TENSORS_PER_LAYER
               + (s.moe_layers * moe_layer_tensors(s) if s.moe_layers else 0)
               + int(s.first) + 2 * int(s.last) for s in shapes)


def sync_call_seconds(shapes: tuple[StageShape, ...], params: CostParams) -> float:
    """The per-call overhead of one weight sync (seconds): calls x ``sync_call_overhead_s``."""
    return sync_calls(shapes, params) * params.sync_call_overhead_s
