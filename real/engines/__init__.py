"""Engines that hold a model and run one RL role on one device (no Ray here), and the registry
that picks them by name.

An engine name maps each task kind it serves ("generation", "inference", "training") to a class,
given as ``module:Class`` and imported only when built, so choosing "torch" never imports vLLM or
megatron-core:

========== ============== ============== ==================
name       generation     inference      training
========== ============== ============== ==================
torch      TorchRollout   TorchInference TorchTrainer
vllm       VLLMRollout    --             --
megatron   --             --             MegatronTrainer
========== ============== ============== ==================
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from hetrl.errors import require

ENGINE_KINDS = ("generation", "inference", "training")
DEFAULT_ENGINE = "torch"

#: Engine name -> task kind -> "module:Class".
ENGINES: dict[str, dict[str, str]] = {
    "torch": {"generation": "real.engines.torch_engine:TorchRollout",
              "inference": "real.engines.torch_engine:TorchInference",
              "training": "real.engines.torch_engine:TorchTrainer"},
    "vllm": {"generation": "real.engines.vllm_engine:VLLMRollout"},
    "megatron": {"training": "real.engines.megatron_engine:MegatronTrainer"},
}
#: Engines that need a CUDA device: none (vllm runs on CPU through vLLM's CPU build, megatron
#: over gloo; see their modules).
GPU_ENGINES: tuple[str, ...] = ()


def validate_engines(engines: Mapping[str, str], device: str = "cpu",
                     field: str = "engines") -> dict[str, str]:
    """``engines`` (task kind -> engine name) checked: known kinds, engines that serve that kind,
    GPU engines only with ``device`` cuda. Returns it as a plain dict."""
    out = dict(engines)
    for kind, name in out.items():
        require(kind in ENGINE_KINDS, f"{field}.{kind}", name,
                f"names an unknown task kind; kinds: {', '.join(ENGINE_KINDS)}")
        serving = sorted(n for n, kinds in ENGINES.items() if kind in kinds)
        require(name in serving, f"{field}.{kind}", name,
                f"is not an engine for {kind} tasks; choose one of {', '.join(serving)}")
        require(name not in GPU_ENGINES or device.startswith("cuda"), f"{field}.{kind}", name,
                f"needs device cuda (device is {device!r})")
    return out


def engine_class(kind: str, name: str = DEFAULT_ENGINE) -> type:
    """The class of engine ``name`` for tasks of ``kind`` (imports its module now)."""
    validate_engines({kind: name}, device="cuda")
    module, cls = ENGINES[name][kind].split(":")
    return getattr(importlib.import_module(module), cls)


def build_engine(kind: str, name: str, role: str, spec: Any, seed: int, device: str,
                 algo: Any, stage: int | None = None, stages: list[int] | None = None,
                 **placement: Any) -> Any:
    """An engine of ``name`` for one tasklet: ``kind`` and ``role`` of its task, model ``spec``
    (:class:`~real.model.TinyModelSpec`), weights ``seed``, torch ``device``, ``algo``
    (:class:`~real.algos.AlgoConfig`; inference uses its temperature, training all of it), for
    a pipelined trainer its ``stage`` index and layer boundaries ``stages``, and for the
    megatron trainer its ``placement`` in the task's grid (``grid``, ``device_id``, ``groups``,
    ``on_receive``: see :class:`~real.engines.megatron_engine.MegatronTrainer`)."""
    cls = engine_class(kind, name)
    if kind == "generation":
        return cls(spec, seed, device)
    if kind == "inference":
        return cls(role, spec, seed, device, temperature=algo.temperature)
    return cls(role, spec, seed, device, algo, stage=stage, stages=stages, **placement)
