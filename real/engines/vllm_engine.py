"""A rollout engine on vLLM (``vllm.LLM``, V1 engine), for one CUDA device.

The model is the tiny Qwen3 of :mod:`real.model`: ``build_causal_lm(spec, seed)`` is saved
(config + safetensors) to a temporary directory and vLLM loads it from there, so at start it
holds the same weights as a :class:`~real.engines.torch_engine.TorchRollout` of the same (spec,
seed) (cast to ``dtype``). Prompts go in as token ids (``skip_tokenizer_init``: the byte
tokenizer stays on our side). Each request is sampled with its own seed, derived from the call's
``seed`` and the prompt's index, so a call is reproducible and the repeated prompts of a GRPO
group get different samples.

Weights: :meth:`VLLMRollout.update_weights` sends HF-named CPU tensors to the worker through
``LLM.collective_rpc`` into :class:`~real.engines.vllm_ext.HetrlWorkerExtension` (vLLM's
``worker_extension_cls``), which calls the model's own ``load_weights`` (it fuses q/k/v and
gate/up); prefix caching is off, so no KV computed with old weights is reused.

Only importable with vLLM installed (``pip install -e '.[gpu]'``, Linux + CUDA); the registry in
:mod:`real.engines` imports it only when the vllm engine is chosen. Written against vLLM 0.33.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping

import torch

from hetrl.errors import HetrlError, require
from real.engines.base import check_generate_args
from real.engines.vllm_ext import request_seed, vllm_to_hf
from real.model import TinyModelSpec, build_causal_lm
from real.tokenizer import EOS

INSTALL_HINT = "the vllm engine needs vLLM and a CUDA GPU: pip install -e '.[gpu]'"
EXTENSION = "real.engines.vllm_ext.HetrlWorkerExtension"
DTYPES = ("bfloat16", "float16", "float32")

try:
    import vllm
    from vllm.inputs import TokensPrompt
except ImportError as exc:  # pragma: no cover - depends on the machine
    raise HetrlError(f"{INSTALL_HINT} ({exc})") from None


class VLLMRollout:
    """Samples responses with vLLM; same interface as TorchRollout (``generate``,
    ``update_weights``, ``state_dict``).

    ``gpu_memory_utilization``: share of the GPU's memory vLLM may take (weights + KV cache),
    in (0, 1]; ``dtype``: one of :data:`DTYPES`.
    """

    def __init__(self, spec: TinyModelSpec, seed: int, device: str = "cuda",
                 gpu_memory_utilization: float = 0.3, dtype: str = "bfloat16"):
        require(device in ("cuda", "cuda:0"), "device", device,
                "must be cuda or cuda:0 (vLLM uses the first visible GPU; choose it with "
                "CUDA_VISIBLE_DEVICES)")
        if not torch.cuda.is_available():
            raise HetrlError(f"{INSTALL_HINT}: no CUDA GPU is available here")
        require(0 < gpu_memory_utilization <= 1, "gpu_memory_utilization", gpu_memory_utilization,
                "must be in (0, 1]")
        require(dtype in DTYPES, "dtype", dtype, f"must be one of {DTYPES}")
        self.spec = spec
        self.dtype = dtype
        self._dir = tempfile.mkdtemp(prefix="hetrl-vllm-")
        build_causal_lm(spec, seed).save_pretrained(self._dir)
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
        self.llm = vllm.LLM(
            model=self._dir, skip_tokenizer_init=True, enforce_eager=True, dtype=dtype,
            seed=seed, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=spec.max_positions, enable_prefix_caching=False,
            worker_extension_cls=EXTENSION,
        )
        self._names = self.llm.collective_rpc("hetrl_parameter_names")[0]

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
        """Load the actor's full HF-named state dict into the running engine; every one of
        vLLM's parameters must be covered."""
        weights = [(name, t.detach().to("cpu").contiguous()) for name, t in state_dict.items()]
        loaded = self.llm.collective_rpc("hetrl_load_weights", args=(weights,))[0]
        missing = sorted(set(self._names) - set(loaded))
        require(not missing, "state_dict", sorted(state_dict)[:4],
                f"left vLLM parameters unloaded: {missing[:6]}")
        self.llm.reset_prefix_cache()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The engine's current weights under HF names (CPU copies, in ``dtype``)."""
        return vllm_to_hf(self.llm.collective_rpc("hetrl_state_dict")[0], self.spec)

    def close(self) -> None:
        """Shut the engine down and delete the model directory."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None)
            if callable(shutdown):
                shutdown()
        shutil.rmtree(self._dir, ignore_errors=True)
