"""Hugging Face Qwen3 <-> megatron-core GPTModel weight names and layouts (pure torch).

Megatron (local layer spec, tensor parallel 1) fuses per layer:

* ``linear_qkv.weight`` [G * (P + 2) * D, H]: for each of the G = ``kv_heads`` query groups,
  the P = ``heads / kv_heads`` query heads of that group, then its key head, then its value head,
  D = ``head_dim`` rows each (Hugging Face keeps q_proj [heads * D, H], k_proj and v_proj
  [G * D, H], head-major; query head h belongs to group h // P in both);
* ``linear_fc1.weight`` [2 * F, H]: gate_proj's F rows, then up_proj's (SwiGLU ``silu(gate) *
  up``, Megatron's ``gated_linear_unit``).

A Qwen3-MoE layer (``spec.experts`` > 0) has no dense MLP: its router ``mlp.gate.weight``
[E, H] becomes ``mlp.router.weight``, and transformers' stacked experts ``mlp.experts.
gate_up_proj`` [E, 2 F_e, H] (gate rows, then up rows) and ``down_proj`` [E, H, F_e] become each
expert's ``mlp.experts.local_experts.{e}.linear_fc1.weight`` [2 F_e, H] and ``linear_fc2.weight``
[H, F_e] (megatron-core's SequentialMLP, numbered over all E experts here; a rank of an
expert-parallel group keeps and renumbers its own, :func:`~real.engines.megatron_parallel.
expert_slice`).

Every other tensor is renamed unchanged. The value model's ``value_head`` (weight [1, H], bias
[1]) becomes ``output_layer`` (see :mod:`real.engines.megatron_engine`). Both directions are
exact (slicing and concatenation only), so ``megatron_to_hf(hf_to_megatron(s)) == s``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from hetrl.errors import SpecError, require
from real.model import TinyModelSpec

#: HF name (after ``model.layers.{i}.``) -> Megatron name (after ``decoder.layers.{i}.``),
#: tensors renamed without change.
LAYER_RENAMES = {
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
}
#: Whole-model tensors renamed without change (HF -> Megatron).
GLOBAL_RENAMES = {
    "model.embed_tokens.weight": "embedding.word_embeddings.weight",
    "model.norm.weight": "decoder.final_layernorm.weight",
    "lm_head.weight": "output_layer.weight",
    "value_head.weight": "output_layer.weight",
    "value_head.bias": "output_layer.bias",
}
QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
FC1 = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
#: a Qwen3-MoE layer's router and stacked experts (HF names after ``model.layers.{i}.``)
MOE = ("mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj")
_MEG_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.weight$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_MEG_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             spec: TinyModelSpec) -> torch.Tensor:
    """Megatron's ``linear_qkv`` [G * (P + 2) * D, H] from HF's q [heads * D, H], k and v
    [G * D, H] (G groups of P query heads, D = head_dim)."""
    G, D = spec.kv_heads, spec.head_dim
    P = spec.heads // G
    H = q.shape[1]
    require(tuple(q.shape) == (G * P * D, H), "q_proj", tuple(q.shape),
            f"must be [{G * P * D}, H] for spec {spec.name}")
    require(tuple(k.shape) == (G * D, H) and tuple(v.shape) == (G * D, H), "k_proj/v_proj",
            (tuple(k.shape), tuple(v.shape)), f"must be [{G * D}, {H}]")
    parts = (q.reshape(G, P * D, H), k.reshape(G, D, H), v.reshape(G, D, H))
    return torch.cat(parts, dim=1).reshape(G * (P + 2) * D, H)


def split_qkv(qkv: torch.Tensor, spec: TinyModelSpec) -> tuple[torch.Tensor, ...]:
    """HF's (q [heads * D, H], k [G * D, H], v [G * D, H]) from Megatron's ``linear_qkv``."""
    G, D = spec.kv_heads, spec.head_dim
    P = spec.heads // G
    require(qkv.dim() == 2 and qkv.shape[0] == G * (P + 2) * D, "linear_qkv", tuple(qkv.shape),
            f"must be [{G * (P + 2) * D}, H] for spec {spec.name}")
    H = qkv.shape[1]
    q, k, v = qkv.reshape(G, (P + 2) * D, H).split([P * D, D, D], dim=1)
    return (q.reshape(G * P * D, H).clone(), k.reshape(G * D, H).clone(),
            v.reshape(G * D, H).clone())


def hf_to_megatron(state: Mapping[str, torch.Tensor], spec: TinyModelSpec) -> dict[str, torch.Tensor]:
    """A Qwen3 causal LM's or value model's HF state dict under Megatron GPTModel names.

    Every key must be known (an unknown one raises naming it); the result has no
    ``_extra_state`` entries (load it with ``strict=False`` and check what is missing).
    """
    out: dict[str, torch.Tensor] = {}
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        m = _HF_LAYER.match(name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = tensor
        elif name in GLOBAL_RENAMES:
            out[GLOBAL_RENAMES[name]] = tensor
        else:
            raise SpecError("state", name, "is not a Qwen3 weight this converter knows")
    for i, parts in sorted(layers.items()):
        prefix = f"decoder.layers.{i}."
        mlp = MOE if spec.experts else FC1
        missing = [k for k in QKV + mlp if k not in parts]
        require(not missing, f"model.layers.{i}", missing, "are missing from the state dict")
        out[prefix + "self_attention.linear_qkv.weight"] = fuse_qkv(*(parts.pop(k) for k in QKV),
                                                                    spec=spec)
        if spec.experts:
            router, gate_up, down = (parts.pop(k) for k in MOE)
            out[prefix + "mlp.router.weight"] = router
            for e in range(gate_up.shape[0]):
                expert = f"{prefix}mlp.experts.local_experts.{e}."
                out[expert + "linear_fc1.weight"] = gate_up[e].clone()
                out[expert + "linear_fc2.weight"] = down[e].clone()
        else:
            out[prefix + "mlp.linear_fc1.weight"] = torch.cat([parts.pop(k) for k in FC1], dim=0)
        for key, tensor in parts.items():
            if key not in LAYER_RENAMES:
                raise SpecError("state", f"model.layers.{i}.{key}",
                                "is not a Qwen3 weight this converter knows")
            out[prefix + LAYER_RENAMES[key]] = tensor
    return out


def megatron_to_hf(state: Mapping[str, torch.Tensor], spec: TinyModelSpec,
                   value_model: bool | None = None) -> dict[str, torch.Tensor]:
    """A Megatron GPTModel state dict under HF Qwen3 names (``_extra_state`` entries dropped).

    ``value_model``: whether ``output_layer`` is a value head (default: it has a bias).
    """
    if value_model is None:
        value_model = "output_layer.bias" in state
    heads = ("value_head.weight", "value_head.bias") if value_model else ("lm_head.weight",)
    back = {GLOBAL_RENAMES[k]: k for k in ("model.embed_tokens.weight", "model.norm.weight") + heads}
    layer_back = {v: k for k, v in LAYER_RENAMES.items()}
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}  # HF stacked name -> expert -> tensor
    for name, tensor in state.items():
        if name.endswith("_extra_state"):
            continue
        m = _MEG_LAYER.match(name)
        if not m:
            if name not in back:
                raise SpecError("state", name, "is not a GPTModel weight this converter knows")
            out[back[name]] = tensor
            continue
        prefix, key = f"model.layers.{m.group(1)}.", m.group(2)
        e = _MEG_EXPERT.match(key) if spec.experts else None
        if e:
            stacked = prefix + (MOE[1] if e.group(2) == "linear_fc1" else MOE[2])
            experts.setdefault(stacked, {})[int(e.group(1))] = tensor
        elif key == "mlp.router.weight" and spec.experts:
            out[prefix + MOE[0]] = tensor
        elif key == "self_attention.linear_qkv.weight":
            for hf_key, part in zip(QKV, split_qkv(tensor, spec), strict=True):
                out[prefix + hf_key] = part
        elif key == "mlp.linear_fc1.weight":
            require(tensor.shape[0] == 2 * spec.ffn, name, tuple(tensor.shape),
                    f"must have 2 x ffn = {2 * spec.ffn} rows")
            gate, up = tensor.split(spec.ffn, dim=0)
            out[prefix + FC1[0]], out[prefix + FC1[1]] = gate.clone(), up.clone()
        elif key in layer_back:
            out[prefix + layer_back[key]] = tensor
        else:
            raise SpecError("state", name, "is not a GPTModel weight this converter knows")
    for stacked, by_expert in experts.items():
        require(sorted(by_expert) == list(range(spec.experts)), stacked, sorted(by_expert),
                f"must hold every expert 0..{spec.experts - 1} (gather them first)")
        out[stacked] = torch.stack([by_expert[e] for e in range(spec.experts)])
    return out
