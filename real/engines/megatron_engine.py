"""A training engine on megatron-core: GPTModel (local layer spec, no Transformer Engine) over a
plan's (dp, pp, tp) grid, Megatron's own pipeline schedule (1F1B), DistributedDataParallel and
distributed optimizer.

The model is configured as the tiny Qwen3 of :mod:`real.model` (RMSNorm, SwiGLU, GQA, q/k
RMSNorm, RoPE, untied head) and starts from exactly the weights ``build_causal_lm(spec, seed)``
(or ``build_value_model``) holds, converted by :mod:`real.engines.megatron_convert` and sliced
for this rank's stage and tensor rank by :mod:`real.engines.megatron_parallel`.
:meth:`MegatronTrainer.state_dict` gathers the stage's tensor ranks and converts back, so a
:class:`~real.engines.torch_engine.TorchRollout` or a vLLM rollout loads it unchanged (one stage
slice per pipeline stage, merged by the receiver, as the torch engine's stages).

One training step (:meth:`MegatronTrainer.train_step`) is Megatron's: the schedule of
``get_forward_backward_func`` over the replica's micro-batches (1F1B when pp > 1, p2p over the
``pp`` group), with ``calculate_per_token_loss``: each micro-batch returns its token-sum loss
(:func:`real.algos.trainer_loss`'s token mean x its response tokens) and its token count, DDP
sums gradients over the replicas (reduce-scatter into the distributed optimizer's shards) and
``finalize_model_grads`` divides by the whole batch's response tokens, so replicas with uneven
data shares train on the whole batch's token-mean loss, as the torch path does; then the
optimizer clips to the global norm (over tp, pp and dp) and steps (Adam, no weight decay), and
all-gathers the parameters. For identical inputs the result equals
:class:`~real.engines.torch_engine.TorchTrainer`'s up to floating-point rounding.

Process groups are explicit (megatron-core's ``ProcessGroupCollection``), not
``parallel_state``'s globals, so one process can host the trainers of several tasks (an actor
and a critic on one device) in a world that also holds generation and inference workers.

CPU: megatron-core assumes CUDA in places a training step reaches (``torch.cuda``
``current_device``/``synchronize``, tensors made on ``"cuda"``, CUDA type names checked by the
optimizer and gradient clipping, the CUDA RNG tracker). On ``device="cpu"`` the engine's calls
into megatron-core run under :func:`cpu_shims`, which redirects those for their duration; gloo
carries every collective. That mode exists to test this engine against TorchTrainer on machines
without a GPU; on GPUs the same code runs on NCCL.

megatron-core is imported only when an engine is built; without it the error says how to
install it.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hetrl.errors import HetrlError, require
from real.algos import TRAINER_ROLES, AlgoConfig, trainer_loss
from real.engines.base import Extras, RolloutBatch
from real.engines.megatron_convert import hf_to_megatron, megatron_to_hf
from real.engines.megatron_parallel import (
    MegatronGrid,
    expert_slice,
    global_expert_name,
    mark_tensor_parallel,
    padded_vocab,
    process_group_collection,
    renumber,
    shard,
    stage_slice,
    task_world,
    unshard,
)
from real.engines.megatron_support import (
    OnReceive,
    counting_alltoalls,
    cpu_shims,
    one_process_world,
    reporting_p2p,
    timed_backward,
)
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
    from megatron.core.transformer.moe import moe_utils

    # megatron-core 0.16.1 binds te_general_gemm only when Transformer Engine imports, yet its
    # router reads it either way (a NameError without TE): absent means None, its torch path
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    return megatron.core


def transformer_config(spec: TinyModelSpec, grid: MegatronGrid | None = None) -> Any:
    """Megatron's TransformerConfig of ``spec`` on ``grid`` (float32, no dropout, no fused
    kernels, per-token loss, p2p shapes sent with each micro-batch)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    hf = qwen3_config(spec)
    tp, pp = (grid.tp, grid.pp) if grid else (1, 1)
    first, last = grid.layer_split() if grid else (None, None)
    config = TransformerConfig(
        num_layers=spec.layers, hidden_size=spec.hidden, ffn_hidden_size=spec.ffn,
        num_attention_heads=spec.heads, num_query_groups=spec.kv_heads, kv_channels=spec.head_dim,
        normalization="RMSNorm", layernorm_epsilon=hf.rms_norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, qk_layernorm=True,
        hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32,
        pipeline_dtype=torch.float32, bf16=False, fp16=False, use_cpu_initialization=True,
        perform_initialization=False, masked_softmax_fusion=False, bias_activation_fusion=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
        calculate_per_token_loss=True, **moe_config(spec, grid.ep if grid else 1),
    )
    # set after __post_init__, whose check of it concerns MoE token dispatchers only
    config.variable_seq_lengths = True
    return config


def moe_config(spec: TinyModelSpec, ep: int) -> dict[str, Any]:
    """TransformerConfig's mixture-of-experts fields for a Qwen3-MoE ``spec`` split over ``ep``
    ranks (none for a dense one): every layer MoE, top-k of the router's logits then a softmax
    over them (= transformers' softmax, top-k, renormalise), no auxiliary loss (the torch
    trainer has none), dropless, the all-to-all token dispatcher, one GEMM per expert."""
    if not spec.experts:
        return {}
    return dict(num_moe_experts=spec.experts, moe_router_topk=spec.top_k,
                moe_ffn_hidden_size=spec.expert_ffn, expert_model_parallel_size=ep,
                moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type="none",
                moe_aux_loss_coeff=0.0, moe_grouped_gemm=False, moe_router_pre_softmax=False,
                moe_permute_fusion=False)


class ValueHead(nn.Linear):
    """The critic's head in GPTModel's ``output_layer`` slot: hidden [S, B, H] -> values
    [S, B, 1], returned as GPTModel's output layers return (output, bias) = (values, None)."""

    def __init__(self, hidden: int):
        super().__init__(hidden, 1)

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None,
                runtime_gather_output: bool | None = None) -> tuple[torch.Tensor, None]:
        return super().forward(x), None


def build_gpt_model(spec: TinyModelSpec, value_model: bool = False,
                    grid: MegatronGrid | None = None, stage: int = 0,
                    pg_collection: Any = None) -> nn.Module:
    """An (uninitialised) GPTModel shaped as ``spec``, on CPU: stage ``stage`` of ``grid`` (the
    whole model without one), its vocabulary padded to a multiple of tp; ``value_model``: a
    :class:`ValueHead` in place of the vocabulary projection. The actor's logits come back
    gathered over the tensor ranks (``parallel_output=False``): the loss is the torch path's."""
    import_megatron()
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer_spec = get_gpt_layer_local_spec(num_experts=spec.experts or None,
                                              moe_grouped_gemm=False, qk_layernorm=True,
                                              normalization="RMSNorm")
    pp = grid.pp if grid else 1
    model = GPTModel(transformer_config(spec, grid), layer_spec,
                     vocab_size=padded_vocab(spec.vocab, grid.tp if grid else 1),
                     max_sequence_length=spec.max_positions, position_embedding_type="rope",
                     rotary_base=int(qwen3_config(spec).rope_parameters["rope_theta"]),
                     share_embeddings_and_output_weights=False, parallel_output=False,
                     pre_process=stage == 0, post_process=stage == pp - 1,
                     pg_collection=pg_collection)
    if value_model and stage == pp - 1:
        model.output_layer = ValueHead(spec.hidden)
    return model


class MegatronTrainer:
    """Actor or critic trainer on megatron-core; see the module docstring.

    ``grid`` (the task's :class:`MegatronGrid`), ``device_id`` (this rank's device in it) and
    ``groups`` (the created process groups, :func:`create_groups`) place it in a larger world;
    without them it trains the whole model alone in a world of one. ``stage``/``stages`` (the
    torch engine's pipeline arguments) must agree with the grid when given.
    """

    def __init__(self, role: str, spec: TinyModelSpec, seed: int, device: str = "cuda",
                 cfg: AlgoConfig | None = None, stage: int | None = None,
                 stages: Sequence[int] | None = None, grid: MegatronGrid | None = None,
                 device_id: int | None = None, groups: Mapping[str, Any] | None = None,
                 on_receive: OnReceive | None = None):
        require(role in TRAINER_ROLES, "role", role, f"must be one of {TRAINER_ROLES}")
        self.device = torch.device(device)
        require(self.device.type in ("cpu", "cuda"), "device", device, "must be cpu or cuda[:i]")
        if self.device.type == "cuda":
            require(torch.cuda.is_available(), "device", device, "needs a CUDA GPU; none is available")
            if self.device.index is not None:
                torch.cuda.set_device(self.device)
        import_megatron()
        if grid is None:
            require(stages is None, "stages", stages, "need the task's grid (pipeline stages "
                    "run in a world with one process per stage)")
            grid = MegatronGrid("alone", (((0,),),), (0, spec.layers), moe=spec.experts > 0)
            device_id = 0
            groups = one_process_world(self.device, grid)
        require(groups is not None and device_id is not None, "groups", groups,
                "must be given with the grid, with device_id")
        self.role, self.spec, self.cfg = role, spec, cfg or AlgoConfig()
        self.grid = grid
        self.replica, self.stage, self.tp_rank = grid.coords(device_id)
        require(stage is None or stage == self.stage, "stage", stage,
                f"must be the grid's stage of device {device_id} ({self.stage})")
        require(stages is None or tuple(stages) == grid.boundaries, "stages", stages,
                f"must be the grid's boundaries {grid.boundaries}")
        self.ep_rank = self.replica % grid.ep  # its place in its expert-parallel group
        self.first_layer, self.last_layer = grid.boundaries[self.stage], grid.boundaries[self.stage + 1]
        self.pre, self.post = self.stage == 0, self.stage == grid.pp - 1
        self.pgc = process_group_collection(grid, device_id, groups)
        self.on_receive = on_receive
        self.compute_s = 0.0  # seconds of the last train_step's forwards, losses and backwards
        self._alltoall = [0, 0, 0]  # MoE all-to-all bytes sent off the rank, calls, tokens
        self.last_grad_norm = 0.0  # the last step's gradient norm before clipping
        with self._shims():
            self._build(seed)
        self._export: dict[str, torch.Tensor] = {}
        self.refresh_export()

    def _shims(self) -> Any:
        return cpu_shims() if self.device.type == "cpu" else contextlib.nullcontext()

    def _build(self, seed: int) -> None:
        from megatron.core import parallel_state, tensor_parallel
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        if parallel_state._GLOBAL_MEMORY_BUFFER is None:  # the attention's scratch space, made
            parallel_state._set_global_memory_buffer()    # by initialize_model_parallel
        if self.device.type == "cuda" and not tensor_parallel.get_cuda_rng_tracker().is_initialized():
            # the attention forks the tracker's model-parallel state even without dropout
            tensor_parallel.model_parallel_cuda_manual_seed(seed, tp_rank=self.tp_rank, ep_rank=0,
                                                            etp_rank=0)
        value = self.role == "critic"
        self.module = build_gpt_model(self.spec, value, self.grid, self.stage, self.pgc)
        hf = (build_value_model if value else build_causal_lm)(self.spec, seed).state_dict()
        self.load_hf_state(hf)
        mark_tensor_parallel(self.module, value)
        self.module.to(self.device).train()
        self.config = self.module.config
        ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                            use_distributed_optimizer=True)
        self.ddp = DistributedDataParallel(self.config, ddp, self.module,
                                           pg_collection=self.pgc)
        self.config.no_sync_func = self.ddp.no_sync
        self.config.finalize_model_grads_func = finalize_model_grads
        lr = self.cfg.lr if self.role == "actor" else self.cfg.critic_lr
        opt = OptimizerConfig(optimizer="adam", lr=lr, weight_decay=0.0, adam_beta1=0.9,
                              adam_beta2=0.999, adam_eps=1e-8, clip_grad=self.cfg.grad_clip,
                              use_distributed_optimizer=True, bf16=False, fp16=False,
                              params_dtype=torch.float32)
        with warnings.catch_warnings(), task_world(self.pgc.intra_dist_opt):
            warnings.simplefilter("ignore")
            self.optimizer = get_megatron_optimizer(opt, [self.ddp], use_gloo_process_groups=False,
                                                    pg_collection=self.pgc)
        self.p2p = reporting_p2p(self.pgc.pp, self.config, self.on_receive)

    # --- weights ---
    def load_hf_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load HF-named weights of the whole model (this rank keeps its stage and tensor
        rank's part; all of its weights must be there)."""
        full = stage_slice(hf_to_megatron(state, self.spec), self.first_layer, self.last_layer,
                           self.pre, self.post)
        if self.grid.ep > 1:
            full = expert_slice(full, self.grid.ep, self.ep_rank, self.spec.experts)
        rows = padded_vocab(self.spec.vocab, self.grid.tp)
        value = self.role == "critic"
        mine = {k: shard(k, v, self.grid.tp, self.tp_rank, rows, value) for k, v in full.items()}
        missing, unexpected = self.module.load_state_dict(mine, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        require(not missing and not unexpected, "state", {"missing": missing,
                                                          "unexpected": unexpected},
                "must hold exactly the GPTModel's weights")

    def refresh_export(self) -> None:
        """Gather this stage's weights over its tensor ranks (a collective of the ``tp`` group:
        every tensor rank calls it), and with expert parallelism its experts over the ``ep``
        group (every replica of the group calls it: Megatron's gather before a weight sync),
        into HF-named CPU tensors, kept for :meth:`state_dict`."""
        import torch.distributed as dist

        tp, ep, out = self.grid.tp, self.grid.ep, {}
        local = self.spec.experts // ep if self.spec.experts else 0
        for name, p in self.module.state_dict().items():
            if name.endswith("_extra_state") or not isinstance(p, torch.Tensor):
                continue
            t = p.detach().to("cpu", copy=True)
            parts = [t]
            if tp > 1:
                parts = [torch.empty_like(t) for _ in range(tp)]
                dist.all_gather(parts, t.contiguous(), group=self.pgc.tp)
            whole = unshard(name, parts, self.spec.vocab, self.role == "critic")
            if ep > 1 and global_expert_name(name, 0, local) is not None:
                gathered = [torch.empty_like(whole) for _ in range(ep)]
                dist.all_gather(gathered, whole.contiguous(), group=self.pgc.ep)
                for r, g in enumerate(gathered):
                    out[global_expert_name(name, r, local)] = g
                continue
            out[name] = whole
        self._export = megatron_to_hf(renumber(out, self.first_layer), self.spec,
                                      value_model=self.role == "critic")

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This stage's weights under HF Qwen3 names (CPU copies; the whole model when pp = 1),
        as of the last step."""
        return {k: v.clone() for k, v in self._export.items()}

    def stage_state_dict(self) -> dict[str, torch.Tensor]:
        """The same as :meth:`state_dict`: one stage slice, merged with the other stages' by the
        receiver."""
        return self.state_dict()

    def parameters(self) -> list[torch.nn.Parameter]:
        """This rank's trainable parameters (its stage and tensor rank's shards), in a fixed order."""
        return list(self.module.parameters())

    def take_alltoall(self) -> tuple[int, int, int]:
        """Since the last call: the bytes this rank's MoE all-to-alls sent to other ranks
        (forward and backward), their number, and the tokens its MoE layers routed (padding
        included, per layer); zeros without expert parallelism."""
        out, self._alltoall = tuple(self._alltoall), [0, 0, 0]
        return out  # type: ignore[return-value]

    def save_state(self) -> dict[str, Any]:
        """This rank's weights and its shard of the optimizer state (CPU copies), to rebuild the
        same rank on resume (the same grid)."""
        return {"module": _cpu_clone({k: v for k, v in self.module.state_dict().items()
                                      if isinstance(v, torch.Tensor)}),
                "optimizer": [_cpu_clone(o.state_dict()) for o in self._inner_optimizers()]}

    def load_saved(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`save_state`'s output (then the stage's export, a tp collective). The
        optimizer state is copied: torch's ``load_state_dict`` would adopt the given tensors."""
        with torch.no_grad():
            missing, unexpected = self.module.load_state_dict(state["module"], strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        require(not missing and not unexpected, "checkpoint", {"missing": missing,
                                                               "unexpected": unexpected},
                "must hold exactly this rank's weights (the same grid and model)")
        for opt, saved in zip(self._inner_optimizers(), state["optimizer"], strict=True):
            opt.load_state_dict(_cpu_clone(saved))
        self.refresh_export()

    def _inner_optimizers(self) -> list[torch.optim.Optimizer]:
        """The torch optimizers over this rank's parameter shards, inside Megatron's wrappers."""
        chained = getattr(self.optimizer, "chained_optimizers", [self.optimizer])
        return [o.optimizer for o in chained]

    # --- compute ---
    def forward(self, batch: RolloutBatch) -> torch.Tensor:
        """The whole model's output on ``batch`` (pp = 1 only): logits [B, T, V] (actor) or
        per-position values [B, T] (critic); causal attention without padding mask, as
        TorchTrainer."""
        require(self.grid.pp == 1, "grid.pp", self.grid.pp, "must be 1: forward() runs the whole "
                "model only")
        batch = batch.to(self.device)
        with self._shims():
            out = self.module(batch.input_ids, batch.position_ids,
                              attention_mask=_causal_mask(batch, self.device))
        return self._head(out)

    def _head(self, out: torch.Tensor) -> torch.Tensor:
        return out.squeeze(-1) if self.role == "critic" else out[..., : self.spec.vocab]

    def train_step(self, micro_batches: Sequence[tuple[RolloutBatch, Extras]],
                   scales: Sequence[float]) -> dict[str, float]:
        """One optimizer step of this rank over its replica's ``micro_batches`` (every rank of
        every replica of the task calls it at once; see the module docstring). ``scales``
        (each micro-batch's share of the whole batch's response tokens) weight the returned
        loss statistics, which only the last stage's tensor rank 0 returns (others: {}). A
        micro-batch of scale 0 adds nothing to the gradients (its tokens are not counted):
        with expert parallelism a replica with fewer micro-batches than its group's busiest
        repeats its last one so, to take part in as many all-to-alls."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        require(len(micro_batches) == len(scales) and micro_batches, "micro_batches",
                len(micro_batches), f"must be non-empty and match scales ({len(scales)})")
        moved = [(b.to(self.device), {k: v.to(self.device) for k, v in e.items()})
                 for b, e in micro_batches]
        stats: list[dict[str, float]] = []
        data = iter(zip(moved, scales, strict=True))
        compute: list[float] = []  # seconds of each forward, loss and backward

        def forward_step(data_iterator: Iterator[Any], model: nn.Module) -> Any:
            (batch, extras), scale = next(data_iterator)
            start = time.perf_counter()
            out = model(batch.input_ids, batch.position_ids,
                        attention_mask=_causal_mask(batch, self.device))
            compute.append(time.perf_counter() - start)

            def loss_func(output: torch.Tensor) -> Any:
                start = time.perf_counter()
                loss, st = trainer_loss(self.role, self.cfg, self._head(output), batch.input_ids,
                                        batch.response_mask, dict(extras))
                stats.append(st)
                n = batch.response_mask.sum() * (scale > 0)  # a padding micro-batch: none
                compute.append(time.perf_counter() - start)
                return loss * n, n.to(torch.int), {}

            return out, loss_func

        sent = [0, 0]  # the dispatcher's forward all-to-alls: bytes off the rank, calls
        with self._shims(), timed_backward(compute), counting_alltoalls(sent):
            self.ddp.zero_grad_buffer()
            self.optimizer.zero_grad()
            get_forward_backward_func(pp_size=self.grid.pp)(
                forward_step_func=forward_step, data_iterator=data, model=[self.ddp],
                num_microbatches=len(moved), seq_length=max(b.input_ids.shape[1] for b, _ in moved),
                micro_batch_size=max(b.size for b, _ in moved), forward_only=False,
                p2p_communicator=self.p2p, pg_collection=self.pgc)
            _, norm, _ = self.optimizer.step()
        self.last_grad_norm = float(norm)
        if self.grid.ep > 1:  # the backward's all-to-alls send the same bytes back
            self._alltoall[0] += 2 * sent[0]
            self._alltoall[1] += 2 * sent[1]
            self._alltoall[2] += sum(b.input_ids.numel() for b, _ in moved)
        # float32 has no loss scaler to skip a bad step: a non-finite norm is an error here
        require(math.isfinite(self.last_grad_norm), "gradient norm", self.last_grad_norm,
                "must be finite (the step's loss or gradients overflowed)")
        self.compute_s = sum(compute)
        self.refresh_export()
        if not (self.post and self.tp_rank == 0):
            return {}
        out: dict[str, float] = {}
        for st, scale in zip(stats, scales, strict=True):
            for k, v in st.items():
                out[k] = out.get(k, 0.0) + float(v) * scale
        return out


def _cpu_clone(tree: Any) -> Any:
    """``tree`` with every tensor replaced by a detached CPU copy."""
    return torch.utils._pytree.tree_map(
        lambda x: x.detach().cpu().clone() if isinstance(x, torch.Tensor) else x, tree)


def _causal_mask(batch: RolloutBatch, device: torch.device) -> torch.Tensor:
    T = batch.input_ids.shape[1]
    return torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), 1)[None, None]
