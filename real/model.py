"""Tiny randomly initialised Qwen3-family models, a value model, and pipeline stages of both.

Everything is built from a :class:`TinyModelSpec` and an explicit seed, so two processes that
build the same (spec, seed) hold bit-identical weights without exchanging them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn
from transformers import (
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3Model,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3MoeModel,
)
from transformers.masking_utils import create_causal_mask

from hetrl.errors import positive_int, require
from hetrl.spec.model import ModelShape
from hetrl.spec.moe import MoE
from real.tokenizer import BOS, EOS, PAD, ByteTokenizer

#: The keyword that passes a KV cache to a transformers model's forward: ``cache`` in recent
#: transformers 5 releases, ``past_key_values`` in earlier ones (5.17 has only that). Either way
#: an unknown keyword is swallowed by the forward's ``**kwargs``, so passing the wrong one would
#: silently drop the cache; found when the GPU machine's transformers 5.17 ran the engines.
#: Tested with 5.17 and 5.24 (pyproject asks for >= 5.17: 5.0's ``create_causal_mask`` still
#: takes a ``cache_position`` before the cache).
CACHE_KWARG = ("cache" if "cache" in inspect.signature(Qwen3ForCausalLM.forward).parameters
               else "past_key_values")


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny Qwen3 decoder (SwiGLU, GQA, RMSNorm, q/k norms, untied head); with
    ``experts`` > 0 a Qwen3-MoE one: every layer's MLP is ``experts`` SwiGLU experts of width
    ``expert_ffn``, ``top_k`` per token (softmax router, top-k weights renormalised)."""

    hidden: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 128
    vocab: int = ByteTokenizer().vocab_size
    max_positions: int = 512
    name: str = "tiny-qwen3"
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0

    def __post_init__(self) -> None:
        for key in ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab",
                    "max_positions"):
            positive_int(f"spec.{key}", getattr(self, key))
        if self.experts:
            for key in ("experts", "top_k", "expert_ffn"):
                positive_int(f"spec.{key}", getattr(self, key))
            require(self.top_k <= self.experts, "spec.top_k", self.top_k,
                    f"must be <= experts ({self.experts})")
        require(self.heads % self.kv_heads == 0, "spec.kv_heads", self.kv_heads,
                f"must divide heads ({self.heads})")
        require(self.vocab > EOS, "spec.vocab", self.vocab, f"must be > {EOS} (the special ids)")


def qwen3_config(spec: TinyModelSpec) -> Qwen3Config | Qwen3MoeConfig:
    """The Hugging Face config of ``spec`` (untied embeddings, byte-tokenizer special ids): a
    Qwen3-MoE one when it has experts."""
    moe = {}
    if spec.experts:
        moe = dict(num_experts=spec.experts, num_experts_per_tok=spec.top_k,
                   moe_intermediate_size=spec.expert_ffn, norm_topk_prob=True,
                   decoder_sparse_step=1, mlp_only_layers=[])
    return (Qwen3MoeConfig if spec.experts else Qwen3Config)(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.ffn,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=False,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        **moe,
    )


def build_causal_lm(spec: TinyModelSpec, seed: int) -> Qwen3ForCausalLM | Qwen3MoeForCausalLM:
    """A randomly initialised causal LM; the same ``seed`` gives the same weights.

    The global torch RNG is forked, so building a model does not disturb it.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return (Qwen3MoeForCausalLM if spec.experts else Qwen3ForCausalLM)(qwen3_config(spec))


class ValueModel(nn.Module):
    """A Qwen3 backbone with a scalar head: the critic and the reward model."""

    def __init__(self, config: Qwen3Config | Qwen3MoeConfig):
        super().__init__()
        self.config = config
        self.model = (Qwen3MoeModel if isinstance(config, Qwen3MoeConfig) else Qwen3Model)(config)
        self.value_head = nn.Linear(config.hidden_size, 1)
        nn.init.normal_(self.value_head.weight, std=config.initializer_range)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Values [B, T] (float) of ``input_ids`` [B, T]; position t has read tokens <= t."""
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids).last_hidden_state
        return self.value_head(hidden).squeeze(-1)


def build_value_model(spec: TinyModelSpec, seed: int) -> ValueModel:
    """A randomly initialised :class:`ValueModel`; the same ``seed`` gives the same weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ValueModel(qwen3_config(spec))


def model_shape(spec: TinyModelSpec) -> ModelShape:
    """The analytical cost model's view of ``spec``.

    ``ModelShape.params`` leaves out Qwen3's per-layer q_norm and k_norm weights, so the torch
    model has exactly :func:`qk_norm_params` more parameters.
    """
    return ModelShape(name=spec.name, layers=spec.layers, hidden=spec.hidden, ffn=spec.ffn,
                      heads=spec.heads, kv_heads=spec.kv_heads, head_dim=spec.head_dim,
                      vocab=spec.vocab, tied_embeddings=False,
                      moe=MoE(spec.experts, spec.top_k, spec.expert_ffn) if spec.experts else None)


def qk_norm_params(spec: TinyModelSpec) -> int:
    """Parameters of the q/k RMSNorms (head_dim each, two per layer) that ModelShape omits."""
    return 2 * spec.layers * spec.head_dim


class _Trunk(nn.Module):
    """The backbone parts a stage owns, under Qwen3Model's attribute names.

    Layers sit in a ModuleDict keyed by their global index, so a stage's state-dict keys are
    the full model's (``model.layers.3.mlp.up_proj.weight``).
    """

    def __init__(self, backbone: Qwen3Model, lo: int, hi: int):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): backbone.layers[i] for i in range(lo, hi)})
        self.rotary_emb = backbone.rotary_emb
        if lo == 0:
            self.embed_tokens = backbone.embed_tokens
        if hi == backbone.config.num_hidden_layers:
            self.norm = backbone.norm


class StageModule(nn.Module):
    """Layers ``[lo, hi)`` of a causal LM or value model, sharing its parameters.

    The first stage owns the token embedding, the last the final norm and the head (lm_head
    for a causal LM, value_head for a :class:`ValueModel`). Attention is causal with no padding
    mask, which is exact for the real tokens of right-padded sequences.
    """

    def __init__(self, model: Qwen3ForCausalLM | ValueModel, lo: int, hi: int):
        super().__init__()
        layers = model.config.num_hidden_layers
        require(0 <= lo < hi <= layers, "stage", (lo, hi), f"must satisfy 0 <= lo < hi <= {layers}")
        self.config = model.config
        self.lo, self.hi = lo, hi
        self.first, self.last = lo == 0, hi == layers
        self.is_value = isinstance(model, ValueModel)
        self.model = _Trunk(model.model, lo, hi)
        if self.last and self.is_value:
            self.value_head = model.value_head
        elif self.last:
            self.lm_head = model.lm_head

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Run the stage.

        ``x``: input_ids [B, T] (long) on the first stage, hidden states [B, T, H] otherwise.
        ``position_ids``: [B, T] or [1, T]; default ``arange(T)``.
        Returns hidden states [B, T, H]; on the last stage logits [B, T, V] (causal LM) or
        values [B, T] (value model).
        """
        if self.first:
            require(x.dim() == 2 and not x.is_floating_point(), "x", tuple(x.shape),
                    "first stage takes input_ids [B, T] of integers")
            hidden = self.model.embed_tokens(x)
        else:
            require(x.dim() == 3 and x.shape[-1] == self.config.hidden_size, "x", tuple(x.shape),
                    f"stage {self.lo}-{self.hi} takes hidden states [B, T, {self.config.hidden_size}]")
            hidden = x
        if position_ids is None:
            position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        position_embeddings = self.model.rotary_emb(hidden, position_ids)
        # the cache is the fourth argument, named past_key_values or cache by version: positional
        mask = create_causal_mask(self.config, hidden, None, None)
        for layer in self.model.layers.values():
            hidden = layer(hidden, attention_mask=mask, position_ids=position_ids,
                           position_embeddings=position_embeddings)
        if not self.last:
            return hidden
        hidden = self.model.norm(hidden)
        if self.is_value:
            return self.value_head(hidden).squeeze(-1)
        return self.lm_head(hidden)


def split_stages(model: Qwen3ForCausalLM | ValueModel, boundaries: list[int]) -> list[StageModule]:
    """Pipeline stages of ``model``: ``[0, 2, 4]`` gives layers 0-1 and 2-3.

    Boundaries start at 0, end at the layer count and strictly increase.
    """
    validate_boundaries(boundaries, model.config.num_hidden_layers)
    return [StageModule(model, lo, hi) for lo, hi in zip(boundaries, boundaries[1:], strict=False)]


def validate_boundaries(boundaries: list[int], layers: int) -> None:
    """Raise unless ``boundaries`` split ``layers`` layers into non-empty contiguous stages."""
    require(len(boundaries) >= 2, "boundaries", boundaries, "needs at least two entries")
    require(boundaries[0] == 0 and boundaries[-1] == layers, "boundaries", boundaries,
            f"must start at 0 and end at the layer count ({layers})")
    require(all(a < b for a, b in zip(boundaries, boundaries[1:], strict=False)), "boundaries",
            boundaries, "must strictly increase")
