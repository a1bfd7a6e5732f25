"""Memory per device: resident model states plus the largest working set of the tasks on it.

Resident (kept for the whole iteration): bf16 weights of every model copy on the device (a model
used by two tasks on one device with the same shard is stored once; async mode keeps a separate
generation copy of the actor); for trained models also gradients (``grad_bytes`` per parameter)
and Adam states (``optimizer_state_bytes`` per parameter, sharded over DP as in Megatron's
distributed optimizer). Working (one task at a time, since tasks sharing a device run one after
another): training -- activations of the micro-batches in flight under 1F1B (stage j holds
min(pp - j, m) of them; Korthikanti et al. 2022) plus one micro-batch's logits; inference -- the
larger of a layer's live tensors and one micro-batch's logits with the hidden states that make
them (a forward without gradients frees each layer's tensors; a micro-batch's tokens as costed:
padded when padding is kept, :mod:`hetrl.cost.batching`); generation -- the KV cache, which
takes what is left (vLLM-style), and must hold at least one max-length sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetrl.cost.batching import Batching, memory_tokens
from hetrl.cost.flops import StageShape
from hetrl.cost.lengths import LengthStats
from hetrl.cost.params import CostParams


@dataclass(frozen=True)
class DeviceMemory:
    """One task's memory on one device (bytes). ``copy`` names the model copy whose weights
    these are; ``state_bytes`` are gradients + optimizer states of a trained model."""

    copy: str
    weight_bytes: float
    state_bytes: float
    working_bytes: float


def task_memory(kind: str, copy: str, shape: StageShape, stage_index: int, pp: int, dp: int,
                n: float, mbs: int | Batching, L: LengthStats, params: CostParams,
                recompute: bool | str) -> DeviceMemory:
    """Memory of one tasklet (a stage rank of a replica holding ``n`` sequences, split into
    micro-batches by ``mbs``: a count, or a :class:`~hetrl.cost.batching.Batching`)."""
    return DeviceMemory(copy, *task_memory_bytes(kind, shape, stage_index, pp, dp, n, mbs, L,
                                                 params, recompute))


def task_memory_bytes(kind: str, shape: StageShape, stage_index: int, pp: int, dp: int, n: float,
                      mbs: int | Batching, L: LengthStats, params: CostParams,
                      recompute: bool | str, offload: bool = False) -> tuple[float, float, float]:
    """:func:`task_memory` as plain (weight, state, working) bytes (the cost model's hot path).
    ``offload`` (verl's Megatron ``param_offload``, ``grad_offload``, ``optimizer_offload``): an
    inference or training task's weight shard, and in training its gradients and optimizer
    states, live in host memory between its calls, so they count in its working set (on the
    GPU only while it runs), not resident."""
    if kind == "generation":
        return shape.weight_bytes, 0.0, 0.0
    # one micro-batch's tokens as costed (padded ones included) and the micro-batch count
    tokens, micro = memory_tokens(n, mbs, L)
    if kind == "inference":
        act = shape.forward_working_bytes(tokens)
        if offload:
            return 0.0, 0.0, shape.weight_bytes + act
        return shape.weight_bytes, 0.0, act
    in_flight = min(pp - stage_index, micro)
    act = in_flight * shape.activation_bytes(tokens, recompute, params.activation_bytes_per_token_hidden)
    states = shape.params * (params.grad_bytes + params.optimizer_state_bytes / dp)
    if shape.ep > 1:  # the routed experts' optimizer states are sharded over dp / ep replicas
        states += shape.expert_params * params.optimizer_state_bytes * (shape.ep - 1) / dp
    if offload:
        return 0.0, 0.0, shape.weight_bytes + states + act + shape.logits_bytes(tokens)
    return shape.weight_bytes, states, act + shape.logits_bytes(tokens)
