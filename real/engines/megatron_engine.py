"""A training engine on megatron-core's GPTModel (local layer spec, no Transformer Engine).

The model is Megatron's, configured as the tiny Qwen3 of :mod:`real.model` (RMSNorm, SwiGLU,
GQA, q/k RMSNorm, RoPE, untied head), starting from exactly the weights
``build_causal_lm(spec, seed)`` (or ``build_value_model``) holds, converted by
:mod:`real.engines.megatron_convert`; :meth:`MegatronTrainer.state_dict` converts back, so a
:class:`~real.engines.torch_engine.TorchRollout` or a vLLM rollout loads it unchanged. The loss
is :func:`real.algos.trainer_loss`, the optimizer torch Adam with the same clipping as
:class:`~real.engines.torch_engine.TorchTrainer`: for identical inputs the two trainers agree up
to floating-point rounding.

Parallelism: tensor and pipeline parallel size 1 in a torch.distributed world of one process
(initialised here if nobody did: NCCL on CUDA, gloo on CPU). Pipeline stages are not
implemented (constructing with ``stages`` raises).

CPU: megatron-core assumes CUDA in two places a forward pass reaches (RoPE frequencies are moved
to ``torch.cuda.current_device()``; attention forks the CUDA RNG tracker). On ``device="cpu"``
the forward runs under :func:`cpu_shims`, which redirects both for its duration. That mode exists
to test this engine against TorchTrainer on machines without a GPU; it is not for real runs.

megatron-core is imported only when an engine is built; without it the error says how to
install it.
"""

from __future__ import annotations

import contextlib
import socket
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hetrl.errors import HetrlError, require
from real.algos import TRAINER_ROLES, AlgoConfig, trainer_loss
from real.engines.base import Extras, RolloutBatch
from real.engines.megatron_convert import hf_to_megatron, megatron_to_hf
from real.engines.torch_engine import clipped_step, grad_sq_norm
from real.model import TinyModelSpec, build_causal_lm, build_value_model, qwen3_config

INSTALL_HINT = "the megatron engine needs megatron-core: pip install -e '.[gpu]'"


def import_megatron() -> Any:
    """The ``megatron.core`` package, or a HetrlError saying how to install it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
            import megatron.core
            import megatron.core.models.gpt  # noqa: F401
            import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401
    except ImportError as exc:
        raise HetrlError(f"{INSTALL_HINT} ({exc})") from None
    return megatron.core


@contextlib.contextmanager
def cpu_shims() -> Iterator[None]:
    """Let a megatron-core forward pass run on CPU: ``torch.cuda.current_device()`` returns
    ``"cpu"``, the CUDA RNG tracker's ``fork()`` does nothing (no dropout is configured) and
    Megatron's global scratch buffer is a fresh one (a CUDA engine built earlier in the process
    leaves CUDA tensors in it, which the attention would reuse), all restored on exit.
    Process-global while active; for tests only."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.utils import GlobalMemoryBuffer

    tracker = tensor_parallel.get_cuda_rng_tracker()
    saved_device, saved_fork = torch.cuda.current_device, tracker.fork
    saved_buffer = parallel_state._GLOBAL_MEMORY_BUFFER
    torch.cuda.current_device = lambda: "cpu"
    tracker.fork = lambda *args, **kwargs: contextlib.nullcontext()
    if saved_buffer is not None:
        parallel_state._GLOBAL_MEMORY_BUFFER = GlobalMemoryBuffer()
    try:
        yield
    finally:
        torch.cuda.current_device = saved_device
        tracker.fork = saved_fork
        parallel_state._GLOBAL_MEMORY_BUFFER = saved_buffer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_model_parallel(device: torch.device, seed: int) -> None:
    """A torch.distributed world of one (unless one exists) and Megatron's TP = PP = 1 groups;
    on CUDA also Megatron's model-parallel RNG state (seeded by ``seed``). Idempotent."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}",
                                rank=0, world_size=1)
    require(dist.get_world_size() == 1, "torch.distributed world size", dist.get_world_size(),
            "must be 1: the megatron engine runs tensor and pipeline parallel size 1 in its own "
            "process and does not take part in a larger world")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    if device.type == "cuda" and not tensor_parallel.get_cuda_rng_tracker().is_initialized():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def transformer_config(spec: TinyModelSpec) -> Any:
    """Megatron's TransformerConfig of ``spec`` (float32, no dropout, no fused kernels)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    hf = qwen3_config(spec)
    return TransformerConfig(
        num_layers=spec.layers, hidden_size=spec.hidden, ffn_hidden_size=spec.ffn,
        num_attention_heads=spec.heads, num_query_groups=spec.kv_heads, kv_channels=spec.head_dim,
        normalization="RMSNorm", layernorm_epsilon=hf.rms_norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, qk_layernorm=True,
        hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32,
        pipeline_dtype=torch.float32, bf16=False, fp16=False, use_cpu_initialization=True,
        perform_initialization=False, masked_softmax_fusion=False, bias_activation_fusion=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
    )


class ValueHead(nn.Linear):
    """The critic's head in GPTModel's ``output_layer`` slot: hidden [S, B, H] -> values
    [S, B, 1], returned as GPTModel's output layers return (output, bias) = (values, None)."""

    def __init__(self, hidden: int):
        super().__init__(hidden, 1)

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None,
                runtime_gather_output: bool | None = None) -> tuple[torch.Tensor, None]:
        return super().forward(x), None


def build_gpt_model(spec: TinyModelSpec, value_model: bool = False) -> nn.Module:
    """An (uninitialised) GPTModel shaped as ``spec``, on CPU; ``value_model``: a
    :class:`ValueHead` in place of the vocabulary projection."""
    import_megatron()
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer_spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    model = GPTModel(transformer_config(spec), layer_spec, vocab_size=spec.vocab,
                     max_sequence_length=spec.max_positions, position_embedding_type="rope",
                     rotary_base=int(qwen3_config(spec).rope_parameters["rope_theta"]),
                     share_embeddings_and_output_weights=False)
    if value_model:
        model.output_layer = ValueHead(spec.hidden)
    return model


class MegatronTrainer:
    """Actor or critic trainer on a megatron-core GPTModel; see the module docstring.

    Same interface as :class:`~real.engines.torch_engine.TorchTrainer` in whole-model mode
    (``forward_backward``, ``step``, ``state_dict`` with HF names, ``parameters``,
    ``grad_sq_norm``, ``.module``, ``.optimizer``).
    """

    def __init__(self, role: str, spec: TinyModelSpec, seed: int, device: str = "cuda",
                 cfg: AlgoConfig | None = None, stage: int | None = None,
                 stages: list[int] | None = None):
        require(role in TRAINER_ROLES, "role", role, f"must be one of {TRAINER_ROLES}")
        if stage is not None or stages is not None:
            raise HetrlError(f"stages = {stages}: the megatron engine does not implement pipeline "
                             "stages; use the torch engine for pipelined training tasks")
        self.device = torch.device(device)
        require(self.device.type in ("cpu", "cuda"), "device", device, "must be cpu or cuda[:i]")
        if self.device.type == "cuda":
            require(torch.cuda.is_available(), "device", device, "needs a CUDA GPU; none is available")
            if self.device.index is not None:
                torch.cuda.set_device(self.device)
        import_megatron()
        self.role, self.spec, self.stages = role, spec, None
        self.pipeline = False
        self.cfg = cfg or AlgoConfig()
        init_model_parallel(self.device, seed)
        value = role == "critic"
        self.module = build_gpt_model(spec, value_model=value)
        hf = (build_value_model if value else build_causal_lm)(spec, seed).state_dict()
        self.load_hf_state(hf)
        self.module.to(self.device).train()
        lr = self.cfg.lr if role == "actor" else self.cfg.critic_lr
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=lr)

    # --- weights ---
    def load_hf_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load HF-named weights (all of the model's must be there)."""
        converted = hf_to_megatron(state, self.spec)
        missing, unexpected = self.module.load_state_dict(converted, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        require(not missing and not unexpected, "state", {"missing": missing,
                                                          "unexpected": unexpected},
                "must hold exactly the GPTModel's weights")

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full model weights under HF Qwen3 names (CPU copies), for the rollout engines."""
        state = {k: v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()
                 if isinstance(v, torch.Tensor)}
        return megatron_to_hf(state, self.spec, value_model=self.role == "critic")

    def stage_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights (this engine has no pipeline stages)."""
        return self.state_dict()

    def parameters(self) -> list[torch.nn.Parameter]:
        """Trainable parameters, in a fixed order."""
        return list(self.module.parameters())

    # --- compute ---
    def forward(self, batch: RolloutBatch) -> torch.Tensor:
        """The model's output on ``batch`` (moved to this device): logits [B, T, V] (actor) or
        per-position values [B, T] (critic); causal attention without padding mask, as
        TorchTrainer."""
        batch = batch.to(self.device)
        T = batch.input_ids.shape[1]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=self.device), 1)[None, None]
        shims = cpu_shims() if self.device.type == "cpu" else contextlib.nullcontext()
        with shims:
            out = self.module(batch.input_ids, batch.position_ids, attention_mask=mask)
        return out.squeeze(-1) if self.role == "critic" else out

    def forward_backward(self, batch: RolloutBatch, extras: Extras,
                         scale: float = 1.0) -> dict[str, float]:
        """Accumulate gradients of ``scale`` x the token-mean loss (see TorchTrainer)."""
        batch = batch.to(self.device)
        loss, stats = trainer_loss(self.role, self.cfg, self.forward(batch), batch.input_ids,
                                   batch.response_mask, dict(extras))
        (loss * scale).backward()
        return stats

    def stage_forward(self, *args: Any, **kwargs: Any) -> Any:
        raise HetrlError("the megatron engine does not implement pipeline stages")

    def stage_backward(self, *args: Any, **kwargs: Any) -> Any:
        raise HetrlError("the megatron engine does not implement pipeline stages")

    def grad_sq_norm(self) -> float:
        """Sum of squared gradients of the parameters."""
        return grad_sq_norm(self.module.parameters())

    def step(self, grad_norm: float | None = None) -> None:
        """Clip to global norm ``cfg.grad_clip`` (``grad_norm``, default the own norm), Adam
        step, zero the gradients."""
        clipped_step(self.parameters(), self.optimizer, self.cfg.grad_clip, grad_norm)
