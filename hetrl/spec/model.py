"""Decoder model shapes, dense or mixture-of-experts (:mod:`hetrl.spec.moe`); the parameter
counts are derived, never typed in."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hetrl.errors import SpecError, boolean, did_you_mean, positive_int, require, string
from hetrl.limits import MAX_LAYERS, MAX_MODEL_DIM
from hetrl.spec.moe import MLA, MoE


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (SwiGLU MLP, grouped-query attention, RMSNorm).

    ``ffn`` is the dense MLP intermediate size; ``head_dim`` may differ from hidden/heads
    (Qwen3). ``moe``: the MoE layers' experts (:class:`~hetrl.spec.moe.MoE`; None: dense);
    ``mla``: multi-head latent attention instead of grouped-query attention
    (:class:`~hetrl.spec.moe.MLA`; ``kv_heads`` is then unused by the formulas).
    """

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    moe: MoE | None = None
    mla: MLA | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.name, str) and self.name != "", "model.name", self.name,
                "must be a non-empty string")
        for key in ("layers", "hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab"):
            positive_int(f"model[{self.name}].{key}", getattr(self, key),
                         MAX_LAYERS if key == "layers" else MAX_MODEL_DIM)
        boolean(f"model[{self.name}].tied_embeddings", self.tied_embeddings)
        require(self.heads % self.kv_heads == 0, f"model[{self.name}].kv_heads", self.kv_heads,
                f"must divide heads ({self.heads})")
        require(self.moe is None or isinstance(self.moe, MoE), f"model[{self.name}].moe",
                self.moe, "must be a MoE block")
        require(self.mla is None or isinstance(self.mla, MLA), f"model[{self.name}].mla",
                self.mla, "must be an MLA block")
        if self.moe is not None:
            require(self.moe.dense_layers < self.layers, f"model[{self.name}].moe.dense_layers",
                    self.moe.dense_layers, f"must be < layers ({self.layers}): no MoE layer left")

    # --- derived sizes (parameters) ---
    @property
    def attn_params_per_layer(self) -> int:
        """Q and O projections (hidden x heads*head_dim each) plus K and V (hidden x kv*head_dim);
        with MLA, :meth:`~hetrl.spec.moe.MLA.attn_params`."""
        if self.mla is not None:
            return self.mla.attn_params(self.hidden, self.heads, self.head_dim)
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return 2 * self.hidden * q + 2 * self.hidden * kv

    @property
    def mlp_params_per_layer(self) -> int:
        """SwiGLU: gate, up (hidden x ffn) and down (ffn x hidden)."""
        return 3 * self.hidden * self.ffn

    @property
    def params_per_layer(self) -> int:
        """A dense layer's matrices plus its two RMSNorm weight vectors (Qwen3's q/k norms are
        negligible); an MoE model's mean over its layers (rounded down)."""
        if self.moe is not None:
            return self.layer_params_total // self.layers
        return self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden

    # --- mixture of experts (a dense model: every layer dense, no experts) ---
    @property
    def moe_layers(self) -> int:
        """How many layers are MoE layers."""
        return 0 if self.moe is None else self.moe.moe_layers_in(0, self.layers)

    def moe_layers_in(self, lo: int, hi: int) -> int:
        """How many of layers [lo, hi) are MoE layers."""
        return 0 if self.moe is None else self.moe.moe_layers_in(lo, hi)

    @property
    def moe_layer_replicated_params(self) -> int:
        """An MoE layer's weights outside its routed experts: attention, norms, router and
        shared experts (every expert-parallel rank holds them)."""
        assert self.moe is not None
        return (self.attn_params_per_layer + 2 * self.hidden + self.moe.router_params(self.hidden)
                + 3 * self.hidden * self.moe.shared_width)

    @property
    def expert_params_per_layer(self) -> int:
        """An MoE layer's routed experts' weights (0 for a dense model)."""
        return 0 if self.moe is None else self.moe.expert_params(self.hidden)

    @property
    def layer_params_total(self) -> int:
        """All layers' weights."""
        dense = self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden
        if self.moe is None:
            return self.layers * dense
        n = self.moe_layers
        return ((self.layers - n) * dense
                + n * (self.moe_layer_replicated_params + self.expert_params_per_layer))

    @property
    def expert_params(self) -> int:
        """All routed experts' weights (0 for a dense model)."""
        return self.moe_layers * self.expert_params_per_layer

    @property
    def active_params(self) -> float:
        """Parameters a token passes through: every weight but the routed experts it does not
        use (top_k of experts). A dense model's: :attr:`params`."""
        if self.moe is None:
            return self.params
        return self.params - self.expert_params * (1 - self.moe.top_k / self.moe.experts)

    @property
    def embedding_params(self) -> int:
        """Input embedding plus output head (once if tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        """Total parameters (every expert included)."""
        if self.moe is None:
            return self.layers * self.params_per_layer + self.embedding_params + self.hidden
        return self.layer_params_total + self.embedding_params + self.hidden

    @property
    def kv_values_per_token_layer(self) -> int:
        """KV-cache values per token per layer: keys and values of the KV heads, or MLA's
        latent and positional key."""
        if self.mla is not None:
            return self.mla.kv_values_per_token_layer
        return 2 * self.kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token over all layers, bf16 (2 bytes per value)."""
        if self.mla is not None:
            return self.layers * self.kv_values_per_token_layer * 2
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("moe", "mla"):  # (a dense GQA shape's dict is as it always was)
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "model") -> ModelShape:
        require(isinstance(data, Mapping), field, data, "must be a mapping")
        known = set(cls.__dataclass_fields__)
        extra = set(data) - known
        if extra:
            raise SpecError(f"{field}.{sorted(extra)[0]}", data[sorted(extra)[0]],
                            f"unknown key; known keys: {sorted(known)}")
        missing = [k for k in known - {"tied_embeddings", "name", "moe", "mla"} if k not in data]
        if missing:
            raise SpecError(f"{field}.{sorted(missing)[0]}", None, "is required")
        values = dict(data)
        values.setdefault("name", "custom")
        values["tied_embeddings"] = _as_bool(values.get("tied_embeddings", False),
                                             f"{field}.tied_embeddings")
        if values.get("moe") is not None:
            values["moe"] = MoE.from_dict(values["moe"], f"{field}.moe")
        if values.get("mla") is not None:
            values["mla"] = MLA.from_dict(values["mla"], f"{field}.mla")
        return cls(**values)

    @classmethod
    def from_hf_config(cls, path: str | Path, name: str | None = None) -> ModelShape:
        """Read a Hugging Face ``config.json`` (Llama/Qwen/Mistral-style keys)."""
        from hetrl.io import read_mapping  # (io imports the specs: read lazily)

        p = Path(path)
        try:
            cfg = read_mapping(p, "hf_config")
        except SpecError as exc:
            raise SpecError("hf_config", str(p), f"cannot read JSON: {exc.problem}") from None
        field = f"hf_config[{p.name}]"
        for key in ("num_hidden_layers", "hidden_size", "intermediate_size",
                    "num_attention_heads", "vocab_size"):
            require(key in cfg, f"{field}.{key}", None, "is required in config.json")

        def dim(key: str, default: Any = None) -> int:
            value = cfg.get(key)
            value = default if value is None and default is not None else value
            return positive_int(f"{field}.{key}", value,
                                MAX_LAYERS if key == "num_hidden_layers" else MAX_MODEL_DIM)

        heads, hidden = dim("num_attention_heads"), dim("hidden_size")
        named = name if name is not None else cfg.get("_name_or_path") or p.parent.name or "hf-model"
        mla = _hf_mla(cfg, dim)
        return cls(
            name=string(f"{field}.name", named) if name is not None else str(named),
            layers=dim("num_hidden_layers"),
            hidden=hidden,
            ffn=dim("intermediate_size"),
            heads=heads,
            kv_heads=dim("num_key_value_heads", heads),
            head_dim=dim("qk_nope_head_dim") if mla is not None
            else dim("head_dim", hidden // heads),
            vocab=dim("vocab_size"),
            tied_embeddings=_as_bool(cfg.get("tie_word_embeddings", False),
                                     f"{field}.tie_word_embeddings"),
            moe=_hf_moe(cfg, dim, f"{field}"),
            mla=mla,
        )


def _hf_moe(cfg: Mapping[str, Any], dim: Any, field: str) -> MoE | None:
    """The MoE block of a Hugging Face config: Qwen2/3-MoE (``num_experts``,
    ``moe_intermediate_size``, ``decoder_sparse_step``, ``shared_expert_intermediate_size``),
    DeepSeek-V2/V3 (``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``,
    ``moe_layer_freq``, ``scoring_func``) or Mixtral (``num_local_experts``, the experts as
    wide as ``intermediate_size``); None for a dense config."""
    experts = next((cfg[k] for k in ("num_experts", "n_routed_experts", "num_local_experts")
                    if cfg.get(k)), None)
    if experts is None:
        return None
    require(not cfg.get("mlp_only_layers"), f"{field}.mlp_only_layers",
            cfg.get("mlp_only_layers"), "is not supported (dense layers must come first)")
    if "moe_intermediate_size" in cfg:
        expert_ffn = dim("moe_intermediate_size")
    else:
        expert_ffn = dim("intermediate_size")
    shared = int(cfg.get("n_shared_experts") or 0)
    shared_ffn = int(cfg.get("shared_expert_intermediate_size") or 0)
    if shared_ffn and not shared:
        shared = 1  # Qwen2-MoE: one shared expert of that width
    return MoE(experts=int(experts), top_k=int(cfg.get("num_experts_per_tok") or 1),
               expert_ffn=expert_ffn, shared_experts=shared,
               shared_ffn=shared_ffn,
               dense_layers=int(cfg.get("first_k_dense_replace") or 0),
               layer_freq=int(cfg.get("moe_layer_freq") or cfg.get("decoder_sparse_step") or 1),
               router="sigmoid" if cfg.get("scoring_func") == "sigmoid" else "softmax")


def _hf_mla(cfg: Mapping[str, Any], dim: Any) -> MLA | None:
    """Multi-head latent attention of a DeepSeek-V2/V3 config (``kv_lora_rank``), else None."""
    if not cfg.get("kv_lora_rank"):
        return None
    return MLA(kv_lora_rank=dim("kv_lora_rank"), rope_dim=dim("qk_rope_head_dim"),
               v_head_dim=dim("v_head_dim"), q_lora_rank=int(cfg.get("q_lora_rank") or 0))


def _as_bool(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise SpecError(field, value, "must be true or false")


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, ModelShape], dict[str, str]]:
    """The built-in models (``models.csv``, ``moe_models.yaml``): shapes by name, and the
    Hugging Face id of each that has one (``hf_id``)."""
    text = resources.files("hetrl.data").joinpath("models.csv").read_text()
    out, ids = {}, {}
    for row in csv.DictReader(text.splitlines()):
        if row.get("hf_id"):
            ids[row["name"]] = row["hf_id"]
        out[row["name"]] = ModelShape(
            name=row["name"],
            layers=int(row["layers"]),
            hidden=int(row["hidden"]),
            ffn=int(row["ffn"]),
            heads=int(row["heads"]),
            kv_heads=int(row["kv_heads"]),
            head_dim=int(row["head_dim"]),
            vocab=int(row["vocab"]),
            tied_embeddings=_as_bool(row["tied_embeddings"], "models.csv"),
        )
    raw = yaml.safe_load(resources.files("hetrl.data").joinpath("moe_models.yaml").read_text())
    for i, entry in enumerate(raw["models"]):
        shape = {k: v for k, v in entry.items() if k not in ("hf_id", "source")}
        out[entry["name"]] = ModelShape.from_dict(shape, f"moe_models.yaml:models[{i}]")
        if entry.get("hf_id"):
            ids[entry["name"]] = entry["hf_id"]
    return out, ids


def _presets() -> dict[str, ModelShape]:
    return _catalog()[0]


def hf_id(name: str) -> str | None:
    """The Hugging Face id of the built-in model ``name`` (None for one without: a model of
    the user's own, Megatron-LM's GPTs, the tiny test models)."""
    return _catalog()[1].get(name)


def model_presets() -> dict[str, ModelShape]:
    """Built-in model shapes by name (dense ones from ``hetrl/data/models.csv``, mixture-of-experts
    ones from ``hetrl/data/moe_models.yaml``)."""
    return dict(_presets())


def model_preset(name: str, field: str = "model") -> ModelShape:
    """A built-in shape by name; case-insensitive."""
    presets = _presets()
    for key, shape in presets.items():
        if key.lower() == str(name).lower():
            return shape
    raise SpecError(field, name, f"unknown model; known: {', '.join(presets)}"
                                 f"{did_you_mean(name, presets)}")


def resolve_model(value: Any, field: str = "model", base_dir: Path | None = None) -> ModelShape:
    """A model from a preset name, a shape mapping, or ``{hf_config: path}``."""
    if isinstance(value, ModelShape):
        return value
    if isinstance(value, str):
        return model_preset(value, field)
    if isinstance(value, Mapping) and "hf_config" in value:
        extra = set(value) - {"hf_config", "name"}
        require(not extra, f"{field}.{sorted(map(str, extra))[0] if extra else ''}", None,
                "unknown key next to hf_config; known keys: hf_config, name")
        path = Path(string(f"{field}.hf_config", value["hf_config"]))
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        return ModelShape.from_hf_config(path, name=value.get("name"))
    return ModelShape.from_dict(value, field)
