"""FLOPs and bytes of one model on one pipeline stage of one tensor-parallel rank.

Sources: Kaplan et al. 2020 and Narayanan et al. 2021 (2 FLOPs per parameter per token forward,
backward twice the forward); attention scores 4 x context x (heads x head_dim) FLOPs per token per
layer (QK^T and AV); Korthikanti et al. 2022 for activation memory (34 x tokens x hidden bytes per
layer of a GPT layer with flash attention and sequence parallelism, divided by tp; its MLP part
adapted to SwiGLU).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from hetrl.spec.model import ModelShape
from hetrl.spec.task_batching import recompute_mode

#: Roles whose model ends in a vocabulary head (log-probs); reward and critic end in a scalar head.
LM_HEAD_ROLES = frozenset({"actor", "reference"})


@dataclass(frozen=True)
class StageShape:
    """One pipeline stage of ``layers`` layers of ``model`` split over ``tp`` ranks.

    All quantities are per tensor-parallel rank: FLOPs per token (forward), bytes of weights, KV
    bytes per token, attention FLOPs per token per context token.

    Mixture of experts (``model.moe``): ``moe_layers`` of the stage's layers are MoE layers;
    their routed experts are split over ``ep`` expert-parallel ranks (each holds experts / ep of
    them, sliced over tp), the rest of the weights over tp alone. A token's FLOPs count the
    ``top_k`` experts it uses, times ``expert_load`` (the busiest expert-parallel rank's load
    over the mean: ``CostParams.moe_load_imbalance`` where ep > 1, else 1). ``fp8_weights``:
    weights and KV cache held in one byte per value (FP8 rollouts; activations stay at
    ``bytes_per_value``); ``fp8_matmul``: matmuls at the GPU's FP8 peak (FP8 rollouts, and
    Megatron's FP8 recipe, whose master weights stay BF16). ``sequence_parallel``: the norms'
    and dropouts' activations split over tp as the rest (Megatron's sequence parallelism);
    false keeps them whole on each rank.
    """

    model: ModelShape
    layers: int
    tp: int
    first: bool
    last: bool
    lm_head: bool
    bytes_per_value: int
    moe_layers: int = 0
    ep: int = 1
    expert_load: float = 1.0
    fp8_weights: bool = False
    fp8_matmul: bool = False
    sequence_parallel: bool = True

    def __hash__(self) -> int:  # hashed in every per-replica cache key: compute once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.model, self.layers, self.tp, self.first, self.last, self.lm_head,
                      self.bytes_per_value, self.moe_layers, self.ep, self.expert_load,
                      self.fp8_weights, self.fp8_matmul, self.sequence_parallel))
            self.__dict__["_hash"] = h
        return h

    def __getstate__(self) -> dict:  # string hashes differ between processes: drop the cached one
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @cached_property
    def params(self) -> float:
        """Parameters held by one rank of this stage (its share of the experts included)."""
        m = self.model
        if m.moe is None:
            p = self.layers * m.params_per_layer
        else:
            dense = m.attn_params_per_layer + m.mlp_params_per_layer + 2 * m.hidden
            n = self.moe_layers
            p = (self.layers - n) * dense + n * m.moe_layer_replicated_params
            experts = n * m.expert_params_per_layer
            p += experts if self.ep == 1 else experts / self.ep
        if self.first:
            p += m.vocab * m.hidden
        if self.last:
            if self.lm_head and not (m.tied_embeddings and self.first):
                p += m.vocab * m.hidden
            elif not self.lm_head:
                p += m.hidden  # scalar value head
            p += m.hidden  # final norm
        return p / self.tp

    @cached_property
    def expert_params(self) -> float:
        """The routed experts' parameters held by one rank (0 for a dense model)."""
        return self.moe_layers * self.model.expert_params_per_layer / self.ep / self.tp

    @property
    def dp_sharded_params(self) -> float:
        """The parameters a data-parallel group of this stage shards its optimizer states (and
        with FSDP its weights and gradients) over, counted so that a rank's shard is this / dp:
        the rank's parameters, its experts counted ep times (each rank's expert shard is shared
        by the dp / ep ranks that hold the same experts, so a rank keeps expert_params x ep /
        dp of them)."""
        return self.params + self.expert_params * (self.ep - 1)

    @property
    def weight_bytes_per_value(self) -> int:
        """Bytes per stored weight or KV value: 1 in FP8, else :attr:`bytes_per_value`."""
        return 1 if self.fp8_weights else self.bytes_per_value

    @cached_property
    def weight_bytes(self) -> float:
        return self.params * self.weight_bytes_per_value

    @cached_property
    def expert_weight_bytes(self) -> float:
        """The part of :attr:`weight_bytes` in routed experts."""
        return self.expert_params * self.weight_bytes_per_value

    @cached_property
    def experts_touched_vary(self) -> bool:
        """Whether a decode step reads only the experts its tokens use (top_k < experts);
        otherwise every step reads all of :attr:`weight_bytes`."""
        moe = self.model.moe
        return moe is not None and self.moe_layers > 0 and moe.top_k < moe.experts

    def decode_weight_bytes(self, batch: float | np.ndarray) -> float | np.ndarray:
        """Weight bytes one rank reads in a decode step of ``batch`` sequences per replica: all
        but the routed experts, and each expert the step's tokens use. The ``ep`` replicas of an
        expert-parallel group decode ``ep`` x ``batch`` tokens together; with top_k of E experts
        chosen per token (uniformly, independently between tokens) an expert is used with
        probability 1 - (1 - top_k / E)^(ep x batch)."""
        if not self.experts_touched_vary:
            return self.weight_bytes
        moe = self.model.moe
        used = 1.0 - (1.0 - moe.top_k / moe.experts) ** (self.ep * np.asarray(batch, dtype=float))
        return self.weight_bytes - self.expert_weight_bytes * (1.0 - used)

    @cached_property
    def matmul_flops_per_token(self) -> float:
        """Forward FLOPs per token of the dense matmuls (no attention scores, no embedding
        look-up); in MoE layers the router, the shared experts and the top_k routed experts a
        token uses, at the busiest expert-parallel rank's load."""
        m = self.model
        if m.moe is None:
            f = 2.0 * self.layers * (m.attn_params_per_layer + m.mlp_params_per_layer) / self.tp
        else:
            moe, n = m.moe, self.moe_layers
            routed = self.expert_load * moe.top_k * 3 * m.hidden * moe.expert_ffn
            f = 2.0 * ((self.layers - n) * (m.attn_params_per_layer + m.mlp_params_per_layer)
                       + n * (m.attn_params_per_layer + moe.router_params(m.hidden)
                              + 3 * m.hidden * moe.shared_width + routed)) / self.tp
        return f + self.head_flops_per_token

    @cached_property
    def head_flops_per_token(self) -> float:
        """The part of :attr:`matmul_flops_per_token` in the output head (vocabulary or scalar;
        0 unless this is the last stage). A prefill computes it for one token per sequence only
        (the position it samples from), as vLLM does."""
        if not self.last:
            return 0.0
        return 2.0 * self.model.hidden * (self.model.vocab if self.lm_head else 1) / self.tp

    @cached_property
    def attn_flops_per_token_ctx(self) -> float:
        """Forward attention-score FLOPs per token per token of context."""
        m = self.model
        if m.mla is not None:  # QK^T over (nope + rope) dims, AV over v_head_dim
            return 2.0 * self.layers * m.heads * (m.head_dim + m.mla.rope_dim
                                                  + m.mla.v_head_dim) / self.tp
        return 4.0 * self.layers * m.heads * m.head_dim / self.tp

    @cached_property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes per token held by one rank (KV heads replicate when tp > kv_heads;
        MLA's latent is replicated on every rank)."""
        m = self.model
        if m.mla is not None:
            return float(self.layers * m.mla.kv_values_per_token_layer
                         * self.weight_bytes_per_value)
        kv_heads = max(m.kv_heads / self.tp, 1.0)
        return 2.0 * self.layers * kv_heads * m.head_dim * self.weight_bytes_per_value

    def peak_flops(self, hw: object) -> float:
        """The FLOP/s peak this stage's matmuls run at on stage hardware ``hw``
        (:class:`~hetrl.cost.replica.StageHW`): its FP8 peak with ``fp8_matmul`` (the bf16 one
        on a type without FP8 units, where the plan is refused anyway), else its bf16 peak."""
        if self.fp8_matmul and hw.fp8_flops > 0:
            return hw.fp8_flops
        return hw.flops

    def activation_bytes(self, tokens: float, recompute: bool | str, act_coeff: float) -> float:
        """Stored activations of ``tokens`` tokens through this stage for the backward pass.
        ``act_coeff``: bytes per token per hidden unit of a GPT layer (Korthikanti et al. 2022:
        34 = attention 11 + MLP 19 for a 4h GeLU MLP + norms 4); the MLP's part is replaced by a
        SwiGLU MLP's of width ffn (see :func:`activation_coeff`). Full recomputation keeps only
        each layer's input (2 bytes). Over tp ranks everything is split with sequence
        parallelism; without it :data:`UNSPLIT_BYTES` of the coefficient (the layer input, the
        norms' inputs and the dropout masks; the input alone under full recomputation) stay
        whole on every rank (Korthikanti et al. 2022, Table 2). ``recompute``: a
        :data:`~hetrl.spec.task_batching.RECOMPUTE_MODES` entry (or a bool: full or none);
        "selective" keeps :func:`selective_activation_coeff` (the layer input whole on every
        rank without sequence parallelism, the rest split)."""
        mode = recompute_mode(recompute)
        if mode == "full":
            if not self.sequence_parallel and self.tp > 1:
                return self.layers * 2.0 * tokens * self.model.hidden
            coeff = 2.0
        elif mode == "selective":
            coeff = selective_activation_coeff(self.model)
            if not self.sequence_parallel and self.tp > 1:
                return self.layers * (2.0 + (coeff - 2.0) / self.tp) * tokens * self.model.hidden
        elif self.model.moe is None:
            coeff = activation_coeff(self.model, act_coeff)
        else:  # dense and MoE layers' coefficients, averaged over the stage's layers
            n = self.moe_layers
            coeff = ((self.layers - n) * activation_coeff(self.model, act_coeff)
                     + n * moe_activation_coeff(self.model, act_coeff, self.expert_load)
                     ) / self.layers
        if not self.sequence_parallel and self.tp > 1:
            return self.layers * (UNSPLIT_BYTES + (coeff - UNSPLIT_BYTES) / self.tp) \
                * tokens * self.model.hidden
        return self.layers * coeff * tokens * self.model.hidden / self.tp

    def forward_working_bytes(self, tokens: float) -> float:
        """Peak working bytes of a forward pass without gradients (an inference task) over
        ``tokens`` tokens: each layer's tensors are freed before the next layer runs and before
        the head, so the peak is the larger of one layer's live tensors
        (:data:`FORWARD_LAYER_BYTES` per token per hidden unit, / tp) and, on the last stage,
        the final hidden states (a bf16 value per hidden unit, whole on every rank) with the
        logits they make (:meth:`logits_bytes`) -- not their sum."""
        layer = FORWARD_LAYER_BYTES * tokens * self.model.hidden / self.tp
        logits = self.logits_bytes(tokens)
        if logits == 0.0:
            return layer
        return max(layer, 2.0 * tokens * self.model.hidden + logits)

    def logits_bytes(self, tokens: float) -> float:
        """Materialised vocabulary logits of ``tokens`` tokens (bf16, vocab-parallel over tp)."""
        if not (self.last and self.lm_head):
            return 0.0
        return tokens * self.model.vocab * 2.0 / self.tp


#: Bytes per token per hidden unit of one layer's live tensors in a forward pass without
#: gradients (8 bf16 hidden-sized values: the layer's input, the norm's output, the attention's
#: and MLP's intermediates as they are made and freed).
FORWARD_LAYER_BYTES = 16.0

#: Bytes per token per hidden unit of a layer's activations that tensor parallelism without
#: sequence parallelism keeps whole on every rank: the 10 of Korthikanti et al. 2022's
#: sbh(10 + 24/t + 5as/(ht)) for tensor parallelism alone (the two norms' inputs, 2 + 2, the
#: two dropout masks, 1 + 1, and the inputs of the QKV and the MLP's first linear layers,
#: replicated over the ranks, 2 + 2).
UNSPLIT_BYTES = 10.0

#: Bytes per token per hidden unit of a GPT layer's 4h GeLU MLP in Korthikanti et al. 2022 (Sec.
#: 4.1): first linear's input 2, GeLU's input 8, second linear's input 8, dropout mask 1.
GPT_MLP_BYTES = 19.0


def activation_coeff(model: ModelShape, act_coeff: float) -> float:
    """Stored activation bytes per token per hidden unit of one layer of ``model``: ``act_coeff``
    (a GPT layer's, 34) with its 4h GeLU MLP's 19 replaced by a SwiGLU MLP's 2 + 6 f / h -- the
    gate and up projections' input (2 h bytes), their outputs (2 x 2 f; the fused SwiGLU keeps
    them and recomputes the activation in the backward pass, as Megatron-core does) and the down
    projection's input (2 f); no dropout. Qwen3-8B (f = 3 h): 35; Qwen2.5-7B (f = 5.3 h): 48.7."""
    return act_coeff - GPT_MLP_BYTES + 2.0 + 6.0 * model.ffn / model.hidden


def selective_activation_coeff(model: ModelShape) -> float:
    """Stored activation bytes per token per hidden unit of one dense layer under PyTorch's
    selective activation checkpointing with torchtitan's op policy (``selective_ac_option:
    op``: save the outputs of matmuls and attention, except every second matmul of the layer,
    and recompute every other op in the backward pass). A layer's seven matmuls in order (q, k,
    v, o, gate, up, down) keep q, v, gate and down's outputs (q + kv + f + h values), the
    attention keeps its output (q values; its log-sum-exp, 4 bytes per head, is counted too)
    and the checkpoint keeps the layer's input (h values), in bf16. Llama-3.1-8B: 15.5, against
    38 without recomputation and 2 with full recomputation."""
    q = model.heads * model.head_dim
    kv = model.kv_heads * model.head_dim
    values = model.hidden + (q + kv + model.ffn + model.hidden) + q
    return (2.0 * values + 4.0 * model.heads) / model.hidden


def selective_recompute_share(model: ModelShape) -> float:
    """The share of a dense layer's matmul FLOPs that selective activation checkpointing
    (:func:`selective_activation_coeff`) runs again in the backward pass: the k, o and up
    projections, (kv + q + f) / (2 q + 2 kv + 3 f). The attention and element-wise ops are not
    counted (the attention's output is kept; the rest is cheap). Llama-3.1-8B: 0.365."""
    q = model.heads * model.head_dim
    kv = model.kv_heads * model.head_dim
    return (kv + q + model.ffn) / (2 * q + 2 * kv + 3 * model.ffn)


def collectives_per_layer(kind: str, recompute: bool | str) -> int:
    """Collectives per layer per pass that carry a layer's activations -- tensor parallelism's
    all-reduces, expert parallelism's dispatch and combine all-to-alls: 2 in the forward, 2
    more for their gradients in training, and the forward's 2 again under full recomputation
    (6)."""
    if kind != "training":
        return 2
    return 6 if recompute_mode(recompute) == "full" else 4


def training_flops_mult(model: ModelShape, recompute: bool | str) -> float:
    """A training pass's FLOPs as a multiple of the forward's: 3 (forward + a backward of twice
    the forward), 4 with full recomputation (the forward again), 3 + the recomputed share under
    selective recomputation (:func:`selective_recompute_share`)."""
    mode = recompute_mode(recompute)
    if mode == "full":
        return 4.0
    if mode == "selective":
        return 3.0 + selective_recompute_share(model)
    return 3.0


def moe_activation_coeff(model: ModelShape, act_coeff: float, load: float = 1.0) -> float:
    """:func:`activation_coeff` of an MoE layer: its MLP part is the router's input (2 h bytes)
    and each of a token's top_k routed experts' (at the busiest rank's ``load``) and the
    shared experts' SwiGLU tensors (6 bytes per unit of width)."""
    moe = model.moe
    assert moe is not None
    width = load * moe.top_k * moe.expert_ffn + moe.shared_width
    return act_coeff - GPT_MLP_BYTES + 2.0 + 6.0 * width / model.hidden


@lru_cache(maxsize=4096)
def stage_shapes(model: ModelShape, layers_per_stage: tuple[int, ...], tp: int, lm_head: bool,
                 bytes_per_value: int, ep: int = 1, expert_load: float = 1.0,
                 fp8_weights: bool = False, fp8_matmul: bool = False,
                 sequence_parallel: bool = True) -> tuple[StageShape, ...]:
    """The stages of one layout (memoised: a pure function of the model, shared by every
    CostModel, so each stage's derived sizes are computed once). ``ep``, ``expert_load`` and
    the FP8 flags: see :class:`StageShape` (``expert_load`` counts only where ep > 1)."""
    pp = len(layers_per_stage)
    load = expert_load if ep > 1 else 1.0
    out, lo = [], 0
    for j, n in enumerate(layers_per_stage):
        out.append(StageShape(model, n, tp, j == 0, j == pp - 1, lm_head, bytes_per_value,
                              model.moe_layers_in(lo, lo + n), ep, load, fp8_weights,
                              fp8_matmul, sequence_parallel))
        lo += n
    return tuple(out)
