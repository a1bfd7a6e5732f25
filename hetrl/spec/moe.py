"""The optional parts of a model shape: a mixture-of-experts MLP and multi-head latent attention.

Both are plain data; the parameter counts they imply are derived here, never typed in. Layer
``i`` (0-based) of a model with a :class:`MoE` block is an MoE layer when ``i >= dense_layers``
and ``(i - dense_layers) % layer_freq == 0`` (DeepSeek-V3's ``first_k_dense_replace`` and
``moe_layer_freq``; Qwen3-MoE's ``decoder_sparse_step`` 1 is ``layer_freq`` 1); every other
layer has the model's dense SwiGLU MLP of width ``ffn``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from hetrl.errors import SpecError, integer, positive_int, require
from hetrl.limits import MAX_LAYERS, MAX_MODEL_DIM

#: Routers a MoE block may name: softmax over the experts' logits then top-k (Mixtral, Qwen3),
#: or sigmoid scores with a bias for the top-k choice (DeepSeek-V3). Both cost one hidden x
#: experts matmul per token; the name is kept for the exports and the real engines.
ROUTERS = ("softmax", "sigmoid")
#: At most this many routed experts per layer (DeepSeek-V3 has 256).
MAX_EXPERTS = 4_096


def _from_mapping(cls: type, data: Any, field: str, required: tuple[str, ...]) -> Any:
    """``cls(**data)`` from a mapping with only ``cls``'s keys and at least ``required``."""
    require(isinstance(data, Mapping), field, data, "must be a mapping")
    known = set(cls.__dataclass_fields__)
    extra = sorted(set(map(str, data)) - known)
    if extra:
        raise SpecError(f"{field}.{extra[0]}", data.get(extra[0]),
                        f"unknown key; known keys: {sorted(known)}")
    for key in required:
        require(key in data, f"{field}.{key}", None, "is required")
    return cls(**dict(data))


@dataclass(frozen=True)
class MoE:
    """A mixture-of-experts MLP: ``experts`` routed experts (SwiGLU, width ``expert_ffn``) of
    which each token uses ``top_k``, plus ``shared_experts`` always-on experts of width
    ``shared_ffn`` (0: ``expert_ffn``), on the layers :func:`is_moe_layer` selects."""

    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    shared_ffn: int = 0
    dense_layers: int = 0
    layer_freq: int = 1
    router: str = "softmax"

    def __post_init__(self) -> None:
        positive_int("model.moe.experts", self.experts, MAX_EXPERTS)
        positive_int("model.moe.top_k", self.top_k, MAX_EXPERTS)
        require(self.top_k <= self.experts, "model.moe.top_k", self.top_k,
                f"must be <= experts ({self.experts})")
        positive_int("model.moe.expert_ffn", self.expert_ffn, MAX_MODEL_DIM)
        integer("model.moe.shared_experts", self.shared_experts, 0, MAX_EXPERTS)
        integer("model.moe.shared_ffn", self.shared_ffn, 0, MAX_MODEL_DIM)
        require(self.shared_ffn == 0 or self.shared_experts > 0, "model.moe.shared_ffn",
                self.shared_ffn, "needs shared_experts >= 1 (a shared-expert width without "
                "shared experts)")
        integer("model.moe.dense_layers", self.dense_layers, 0, MAX_LAYERS)
        positive_int("model.moe.layer_freq", self.layer_freq, MAX_LAYERS)
        require(self.router in ROUTERS, "model.moe.router", self.router,
                f"must be one of {list(ROUTERS)}")

    @property
    def shared_width(self) -> int:
        """The shared experts' summed SwiGLU width (0 without shared experts)."""
        return self.shared_experts * (self.shared_ffn or self.expert_ffn)

    def is_moe_layer(self, i: int) -> bool:
        return i >= self.dense_layers and (i - self.dense_layers) % self.layer_freq == 0

    def moe_layers_in(self, lo: int, hi: int) -> int:
        """How many of layers [lo, hi) are MoE layers."""
        def upto(n: int) -> int:  # MoE layers among [0, n)
            if n <= self.dense_layers:
                return 0
            return (n - self.dense_layers - 1) // self.layer_freq + 1
        return upto(hi) - upto(lo)

    def router_params(self, hidden: int) -> int:
        """The router's weights (hidden x experts); a single expert needs no router (it gets
        every token), so one expert has none."""
        return hidden * self.experts if self.experts > 1 else 0

    def expert_params(self, hidden: int) -> int:
        """The routed experts' weights of one MoE layer (SwiGLU: 3 x hidden x expert_ffn each)."""
        return self.experts * 3 * hidden * self.expert_ffn

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, field: str = "model.moe") -> MoE:
        return _from_mapping(cls, data, field, ("experts", "top_k", "expert_ffn"))


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3): queries through a rank-``q_lora_rank``
    bottleneck (0: a full projection), keys and values through one shared latent of
    ``kv_lora_rank`` plus a ``rope_dim`` positional key. The model's ``head_dim`` is the
    non-positional query/key head size (``qk_nope_head_dim``); ``v_head_dim`` the value head.
    The KV cache holds the latent and the positional key per token and layer
    (``kv_lora_rank + rope_dim`` values, not split over tensor-parallel ranks: vLLM's MLA
    replicates it)."""

    kv_lora_rank: int
    rope_dim: int
    v_head_dim: int
    q_lora_rank: int = 0

    def __post_init__(self) -> None:
        for key in ("kv_lora_rank", "rope_dim", "v_head_dim"):
            positive_int(f"model.mla.{key}", getattr(self, key), MAX_MODEL_DIM)
        integer("model.mla.q_lora_rank", self.q_lora_rank, 0, MAX_MODEL_DIM)

    def attn_params(self, hidden: int, heads: int, head_dim: int) -> int:
        """Q (through its bottleneck and norm), the KV latent and positional key, the latent's
        up-projection to per-head keys and values, and the output projection."""
        qk = heads * (head_dim + self.rope_dim)
        q = (hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * qk
             if self.q_lora_rank else hidden * qk)
        kv = hidden * (self.kv_lora_rank + self.rope_dim) + self.kv_lora_rank \
            + self.kv_lora_rank * heads * (head_dim + self.v_head_dim)
        return q + kv + heads * self.v_head_dim * hidden

    @property
    def kv_values_per_token_layer(self) -> int:
        return self.kv_lora_rank + self.rope_dim

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, field: str = "model.mla") -> MLA:
        return _from_mapping(cls, data, field, ("kv_lora_rank", "rope_dim", "v_head_dim"))
