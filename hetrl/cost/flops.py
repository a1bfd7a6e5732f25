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

from hetrl.spec.model import ModelShape

#: Roles whose model ends in a vocabulary head (log-probs); reward and critic end in a scalar head.
LM_HEAD_ROLES = frozenset({"actor", "reference"})


@dataclass(frozen=True)
class StageShape:
    """One pipeline stage of ``layers`` layers of ``model`` split over ``tp`` ranks.

    All quantities are per tensor-parallel rank: FLOPs per token (forward), bytes of weights, KV
    bytes per token, attention FLOPs per token per context token.
    """

    model: ModelShape
    layers: int
    tp: int
    first: bool
    last: bool
    lm_head: bool
    bytes_per_value: int

    def __hash__(self) -> int:  # hashed in every per-replica cache key: compute once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.model, self.layers, self.tp, self.first, self.last, self.lm_head,
                      self.bytes_per_value))
            self.__dict__["_hash"] = h
        return h

    def __getstate__(self) -> dict:  # string hashes differ between processes: drop the cached one
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @cached_property
    def params(self) -> float:
        """Parameters held by one rank of this stage."""
        m = self.model
        p = self.layers * m.params_per_layer
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
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_value

    @cached_property
    def matmul_flops_per_token(self) -> float:
        """Forward FLOPs per token of the dense matmuls (no attention scores, no embedding look-up)."""
        m = self.model
        f = 2.0 * self.layers * (m.attn_params_per_layer + m.mlp_params_per_layer) / self.tp
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
        return 4.0 * self.layers * m.heads * m.head_dim / self.tp

    @cached_property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes per token held by one rank (KV heads replicate when tp > kv_heads)."""
        m = self.model
        kv_heads = max(m.kv_heads / self.tp, 1.0)
        return 2.0 * self.layers * kv_heads * m.head_dim * self.bytes_per_value

    def activation_bytes(self, tokens: float, recompute: bool, act_coeff: float) -> float:
        """Stored activations of ``tokens`` tokens through this stage for the backward pass.
        ``act_coeff``: bytes per token per hidden unit of a GPT layer (Korthikanti et al. 2022:
        34 = attention 11 + MLP 19 for a 4h GeLU MLP + norms 4); the MLP's part is replaced by a
        SwiGLU MLP's of width ffn (see :func:`activation_coeff`). Full recomputation keeps only
        each layer's input (2 bytes)."""
        coeff = 2.0 if recompute else activation_coeff(self.model, act_coeff)
        return self.layers * coeff * tokens * self.model.hidden / self.tp

    def logits_bytes(self, tokens: float) -> float:
        """Materialised vocabulary logits of ``tokens`` tokens (bf16, vocab-parallel over tp)."""
        if not (self.last and self.lm_head):
            return 0.0
        return tokens * self.model.vocab * 2.0 / self.tp


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


@lru_cache(maxsize=4096)
def stage_shapes(model: ModelShape, layers_per_stage: tuple[int, ...], tp: int, lm_head: bool,
                 bytes_per_value: int) -> tuple[StageShape, ...]:
    """The stages of one layout (memoised: a pure function of the model, shared by every
    CostModel, so each stage's derived sizes are computed once)."""
    pp = len(layers_per_stage)
    return tuple(
        StageShape(model, n, tp, j == 0, j == pp - 1, lm_head, bytes_per_value)
        for j, n in enumerate(layers_per_stage)
    )
