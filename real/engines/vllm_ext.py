"""What :mod:`real.engines.vllm_engine` runs inside vLLM's worker process, and vLLM's weight
layout; no vLLM import here, so this module is importable (and tested) anywhere.

vLLM's Qwen3 fuses per layer ``qkv_proj`` = [q_proj; k_proj; v_proj] (rows concatenated, tensor
parallel 1) and ``gate_up_proj`` = [gate_proj; up_proj]; its ``load_weights`` takes the Hugging
Face names and fuses them itself, so only reading weights back needs :func:`vllm_to_hf`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

import torch

from hetrl.errors import require
from real.model import TinyModelSpec

_LAYER = re.compile(r"^(model\.layers\.\d+\.)(.+)$")
#: vLLM's DEFAULT_VOCAB_PADDING_SIZE (vllm.model_executor.layers.vocab_parallel_embedding).
VOCAB_PADDING = 64
VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


def request_seed(seed: int, index: int) -> int:
    """The sampling seed of prompt ``index`` of a call seeded ``seed`` (63-bit, deterministic;
    distinct per index, so the repeated prompts of a GRPO group sample differently)."""
    h = hashlib.sha256(f"{seed}/{index}".encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


def hf_to_vllm(state: Mapping[str, torch.Tensor], spec: TinyModelSpec) -> dict[str, torch.Tensor]:
    """HF Qwen3 weights laid out as vLLM holds them: fused under vLLM's names, the vocabulary
    tensors zero-padded to a multiple of :data:`VOCAB_PADDING` rows (what vLLM's loader does)."""
    padded = -(-spec.vocab // VOCAB_PADDING) * VOCAB_PADDING
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        m = _LAYER.match(name)
        key = m.group(2) if m else ""
        if key in ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "mlp.up_proj.weight"):
            continue
        if key == "self_attn.q_proj.weight":
            p = m.group(1) + "self_attn."
            out[p + "qkv_proj.weight"] = torch.cat(
                [state[p + "q_proj.weight"], state[p + "k_proj.weight"], state[p + "v_proj.weight"]])
        elif key == "mlp.gate_proj.weight":
            p = m.group(1) + "mlp."
            out[p + "gate_up_proj.weight"] = torch.cat([state[p + "gate_proj.weight"],
                                                        state[p + "up_proj.weight"]])
        elif name in VOCAB_TENSORS:
            out[name] = torch.cat([tensor, tensor.new_zeros(padded - tensor.shape[0],
                                                            *tensor.shape[1:])])
        else:
            out[name] = tensor
    return out


def vllm_to_hf(state: Mapping[str, torch.Tensor], spec: TinyModelSpec) -> dict[str, torch.Tensor]:
    """vLLM's Qwen3 parameters under HF names: ``qkv_proj`` split into q [heads * D, H], k and v
    [kv_heads * D, H]; ``gate_up_proj`` into gate and up [ffn, H]; the vocabulary tensors cut
    to ``spec.vocab`` rows. Exact (slices)."""
    q_rows, kv_rows = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        m = _LAYER.match(name)
        key = m.group(2) if m else ""
        if key == "self_attn.qkv_proj.weight":
            require(tensor.shape[0] == q_rows + 2 * kv_rows, name, tuple(tensor.shape),
                    f"must have {q_rows} + 2 x {kv_rows} rows for spec {spec.name}")
            p = m.group(1) + "self_attn."
            for part, t in zip(("q", "k", "v"), tensor.split([q_rows, kv_rows, kv_rows]),
                               strict=True):
                out[f"{p}{part}_proj.weight"] = t.clone()
        elif key == "mlp.gate_up_proj.weight":
            require(tensor.shape[0] == 2 * spec.ffn, name, tuple(tensor.shape),
                    f"must have 2 x ffn = {2 * spec.ffn} rows")
            p = m.group(1) + "mlp."
            gate, up = tensor.split(spec.ffn)
            out[p + "gate_proj.weight"], out[p + "up_proj.weight"] = gate.clone(), up.clone()
        elif name in VOCAB_TENSORS:
            require(tensor.shape[0] >= spec.vocab, name, tuple(tensor.shape),
                    f"must have at least vocab = {spec.vocab} rows")
            out[name] = tensor[: spec.vocab].clone()
        else:
            out[name] = tensor
    return out


class HetrlWorkerExtension:
    """Mixed into vLLM's GPU worker (``worker_extension_cls``); called by name through
    ``LLM.collective_rpc``, so only tensors and names cross the process boundary."""

    def hetrl_load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """Load HF-named weights into the running model; returns the parameter names loaded."""
        model = self.get_model()  # type: ignore[attr-defined]
        loaded = model.load_weights(weights=[(str(n), t) for n, t in weights])
        return sorted(loaded or ())

    def hetrl_parameter_names(self) -> list[str]:
        """vLLM's parameter names of the running model."""
        return sorted(n for n, _ in self.get_model().named_parameters())  # type: ignore[attr-defined]

    def hetrl_state_dict(self) -> dict[str, torch.Tensor]:
        """The running model's parameters under vLLM's names (CPU copies)."""
        model = self.get_model()  # type: ignore[attr-defined]
        return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}
