"""vLLM-free helpers of :mod:`real.engines.vllm_engine`: per-request seeds and the checkpoint
files through which weights reach vLLM's worker (importable and tested without vLLM).

Weights go to vLLM as files, not as RPC arguments: vLLM's default multi-process mode cannot
carry tensors through ``LLM.collective_rpc``, but a path crosses any process boundary, and the
worker's own ``reload_weights(weights_path=...)`` reads the checkpoint with vLLM's loader (which
fuses q/k/v and gate/up and repacks linear weights for its kernels) in both modes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import torch

from hetrl.errors import require

WEIGHTS_FILE = "model.safetensors"


def request_seed(seed: int, index: int) -> int:
    """The sampling seed of prompt ``index`` of a call seeded ``seed`` (63-bit, deterministic;
    distinct per index, so the repeated prompts of a GRPO group sample differently)."""
    h = hashlib.sha256(f"{seed}/{index}".encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


def check_names(state: Mapping[str, torch.Tensor], expected: set[str]) -> None:
    """``state`` must hold exactly the HF parameter names ``expected`` (a full model)."""
    missing, unknown = sorted(expected - set(state)), sorted(set(state) - expected)
    require(not missing and not unknown, "state_dict", sorted(state)[:4],
            f"must hold exactly the model's parameters; missing {missing[:6]}, "
            f"unknown {unknown[:6]}")


def write_checkpoint(state: Mapping[str, torch.Tensor], directory: Path) -> Path:
    """Write HF-named ``state`` (CPU, contiguous copies) as ``directory``/model.safetensors;
    returns ``directory`` (created)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=False)
    save_file({n: t.detach().to("cpu").contiguous() for n, t in state.items()},
              str(directory / WEIGHTS_FILE))
    return directory


def read_checkpoint(directory: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors of ``directory``/model.safetensors cast to ``dtype``."""
    from safetensors.torch import load_file

    return {n: t.to(dtype) for n, t in load_file(str(directory / WEIGHTS_FILE)).items()}
