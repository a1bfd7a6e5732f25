"""Dense decoder model shapes; the parameter count is derived, never typed in."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from hetrl.errors import SpecError, boolean, did_you_mean, positive_int, require, string
from hetrl.limits import MAX_LAYERS, MAX_MODEL_DIM


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder-only transformer (SwiGLU MLP, grouped-query attention, RMSNorm).

    ``ffn`` is the MLP intermediate size; ``head_dim`` may differ from hidden/heads (Qwen3).
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

    def __post_init__(self) -> None:
        require(isinstance(self.name, str) and self.name != "", "model.name", self.name,
                "must be a non-empty string")
        for key in ("layers", "hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab"):
            positive_int(f"model[{self.name}].{key}", getattr(self, key),
                         MAX_LAYERS if key == "layers" else MAX_MODEL_DIM)
        boolean(f"model[{self.name}].tied_embeddings", self.tied_embeddings)
        require(self.heads % self.kv_heads == 0, f"model[{self.name}].kv_heads", self.kv_heads,
                f"must divide heads ({self.heads})")

    # --- derived sizes (parameters) ---
    @property
    def attn_params_per_layer(self) -> int:
        """Q and O projections (hidden x heads*head_dim each) plus K and V (hidden x kv*head_dim)."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return 2 * self.hidden * q + 2 * self.hidden * kv

    @property
    def mlp_params_per_layer(self) -> int:
        """SwiGLU: gate, up (hidden x ffn) and down (ffn x hidden)."""
        return 3 * self.hidden * self.ffn

    @property
    def params_per_layer(self) -> int:
        """Matrices plus the two RMSNorm weight vectors (and Qwen3's q/k norms are negligible)."""
        return self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        """Input embedding plus output head (once if tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        """Total parameters."""
        return self.layers * self.params_per_layer + self.embedding_params + self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token over all layers, bf16 (2 bytes per value)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "model") -> ModelShape:
        require(isinstance(data, Mapping), field, data, "must be a mapping")
        known = set(cls.__dataclass_fields__)
        extra = set(data) - known
        if extra:
            raise SpecError(f"{field}.{sorted(extra)[0]}", data[sorted(extra)[0]],
                            f"unknown key; known keys: {sorted(known)}")
        missing = [k for k in known - {"tied_embeddings", "name"} if k not in data]
        if missing:
            raise SpecError(f"{field}.{sorted(missing)[0]}", None, "is required")
        values = dict(data)
        values.setdefault("name", "custom")
        values["tied_embeddings"] = _as_bool(values.get("tied_embeddings", False),
                                             f"{field}.tied_embeddings")
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
        return cls(
            name=string(f"{field}.name", named) if name is not None else str(named),
            layers=dim("num_hidden_layers"),
            hidden=hidden,
            ffn=dim("intermediate_size"),
            heads=heads,
            kv_heads=dim("num_key_value_heads", heads),
            head_dim=dim("head_dim", hidden // heads),
            vocab=dim("vocab_size"),
            tied_embeddings=_as_bool(cfg.get("tie_word_embeddings", False),
                                     f"{field}.tie_word_embeddings"),
        )


def _as_bool(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise SpecError(field, value, "must be true or false")


@lru_cache(maxsize=1)
def _presets() -> dict[str, ModelShape]:
    text = resources.files("hetrl.data").joinpath("models.csv").read_text()
    out = {}
    for row in csv.DictReader(text.splitlines()):
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
    return out


def model_presets() -> dict[str, ModelShape]:
    """Built-in model shapes by name (from ``hetrl/data/models.csv``)."""
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
