"""FSDP (ZeRO-3): memory and time of a ``backend: fsdp`` training or inference placement.

Every rank of the data-parallel group holds 1/dp of the weights, gradients and optimizer states
(pp = tp = 1); an inference task of an FSDP model (verl's reference, old log-probs and critic
values) holds its weight shard only and all-gathers each layer once per micro-batch. Per micro-batch, each layer's weights are all-gathered for the forward and again
for the backward (``reshard_after_forward``, FSDP2's default and verl's setting) and its
gradients reduce-scattered; prefetching the next layer overlaps this traffic with compute, so a
micro-batch takes the longer of its compute and its traffic, and the ranks move in lockstep (the
collectives need all of them). The sharded Adam step streams each rank's shard as Megatron's
distributed optimizer does. With ``offload`` the shards of parameters and optimizer states live
in host memory between uses (verl's param_offload and optimizer_offload): they cross the host
link (``CostParams.host_link_GBps``) to the GPU and back once per optimizer step.

Sources: Zhao et al. 2023, "PyTorch FSDP" (VLDB), sections 3-4 (sharding, prefetch, resharding);
Rajbhandari et al. 2020, "ZeRO" (stage 3 traffic: 1.5x of data parallelism's); verl's FSDP
workers (``fsdp_workers.py``: param_offload, optimizer_offload, reshard_after_forward).
"""

from __future__ import annotations

from hetrl.cost.batching import Batching, memory_tokens
from hetrl.cost.flops import StageShape
from hetrl.cost.lengths import LengthStats
from hetrl.cost.params import CostParams

#: Layers whose full (gathered) weights are live at once: the one computing and the one being
#: prefetched (FSDP's default forward and backward prefetch of one unit).
GATHERED_LAYERS = 2


def trained_shard_bytes(value: float, params: CostParams) -> tuple[float, float]:
    """Bytes per parameter of a trained model where the optimizer steps a shard of it (FSDP):
    (the weights -- the master copy where the optimizer keeps one, ``params.master_weight_bytes``,
    else the ``value``-byte weights themselves --, the optimizer's other states: Adam m and v).
    The gradients (``params.grad_bytes``) come on top."""
    master = params.master_weight_bytes
    return float(master or value), float(params.optimizer_state_bytes - master)


def fsdp_memory_bytes(kind: str, shape: StageShape, dp: int, n: float, mbs: int | Batching,
                      L: LengthStats, params: CostParams, recompute: bool | str, offload: bool
                      ) -> tuple[float, float, float]:
    """(weights, resident states, working) bytes of one FSDP rank of a ``kind`` ("training" or
    "inference") task holding ``n`` sequences per optimizer step (``shape``: the whole model,
    pp = tp = 1).

    Weights: the rank's parameter shard, / dp: in training the master copy
    (``params.master_weight_bytes``: fp32, as verl loads the actor and the critic and casts each
    gathered layer to bf16 with MixedPrecision(param_dtype=bf16); FSDP keeps no separate bf16
    shard) or, where the optimizer keeps none, the model's values; in inference the model's
    values (the reference's bf16). The cost model counts it under the model's FSDP copy, so the
    model's FSDP tasks on the same devices share it (verl's actor computes old log-probs with
    the module it trains), while a co-located rollout engine holds its own copy, as vLLM does.
    States (training): the gradients (``grad_bytes``) and the rest of the optimizer states (Adam
    m and v), each / dp;
    offload: the parameters and optimizer states in host memory, the gradient shard only.
    With expert parallelism (FSDP2 + EP) each rank's experts are sharded over the dp / ep ranks
    holding the same ones (:attr:`~hetrl.cost.flops.StageShape.dp_sharded_params`) and each
    rank gathers its own experts only. Working: one micro-batch's activations and logits
    (training: as one pipeline stage; inference:
    :meth:`~hetrl.cost.flops.StageShape.forward_working_bytes`), and the gathered weights
    (training: and unsharded gradients) of ``GATHERED_LAYERS`` layers."""
    value = shape.bytes_per_value
    per_layer = shape.params / max(shape.layers, 1)  # (with ep: a rank's own experts only)
    sharded = shape.dp_sharded_params  # over the dp ranks
    training = kind == "training"
    weights = 0.0
    if offload:
        states = sharded * params.grad_bytes / dp if training else 0.0
    elif training:
        weight, other = trained_shard_bytes(value, params)
        weights = sharded * weight / dp
        states = sharded * (params.grad_bytes + other) / dp
    else:
        weights, states = sharded * value / dp, 0.0
    tokens, _ = memory_tokens(n, mbs, L)  # one micro-batch's, as costed (padding included)
    if training:
        act = shape.activation_bytes(tokens, recompute, params.activation_bytes_per_token_hidden)
        act += shape.logits_bytes(tokens)
        gathered = GATHERED_LAYERS * per_layer * (value + params.grad_bytes)
    else:
        act = shape.forward_working_bytes(tokens)
        gathered = GATHERED_LAYERS * per_layer * value
    return weights, states, act + gathered


def fsdp_step_seconds(compute_s: float, micro_batches: int, comm_per_micro_s: float,
                      optimizer_s: float) -> tuple[float, float]:
    """(seconds of one optimizer step, the traffic not hidden behind compute): ``compute_s`` of
    the slowest rank's micro-batches, each micro-batch's weight gathers and gradient
    reduce-scatter (``comm_per_micro_s``) overlapped with compute, then the sharded optimizer
    step. Offloaded shards cross the host link once per task call (:func:`offload_seconds`)."""
    exposed = max(0.0, micro_batches * comm_per_micro_s - compute_s)
    return compute_s + exposed + optimizer_s, exposed


def offload_seconds(kind: str, shape: StageShape, dp: int, params: CostParams) -> float:
    """The host round trip of a rank's offloaded shards per task call (seconds): the parameter
    shard -- in training the master copy where the optimizer keeps one, with the other
    optimizer states -- to the GPU before the call and back after it over the host link
    (verl's ``load_fsdp_model_to_gpu`` / ``offload_fsdp_model_to_cpu`` around
    ``update_actor``, ``compute_log_prob``, ...: once per call, whatever its steps)."""
    per_param = (sum(trained_shard_bytes(shape.bytes_per_value, params)) if kind == "training"
                 else float(shape.bytes_per_value))
    return 2 * shape.dp_sharded_params * per_param / dp / (params.host_link_GBps * 1e9)


def megatron_offload_seconds(kind: str, shapes: tuple[StageShape, ...], dp: int,
                             params: CostParams) -> float:
    """The host round trip of a Megatron rank's offloaded states per task call (seconds; verl's
    Megatron ``param_offload`` / ``grad_offload`` / ``optimizer_offload``): its stage's weight
    shard, and in training its gradients and distributed-optimizer shard (over dp), to the GPU
    before the call and back after it; the largest stage's (ranks move theirs in parallel)."""
    per_param = max(s.bytes_per_value for s in shapes)
    if kind == "training":
        per_param += params.grad_bytes + params.optimizer_state_bytes / dp
    return 2 * max(s.params for s in shapes) * per_param / (params.host_link_GBps * 1e9)
