"""Calibration parameters of the cost model: named efficiency factors with documented defaults.

An efficiency factor is achieved / peak for one kernel kind on one GPU type. ``defaults`` holds
one value per kind; ``per_gpu`` overrides it for a GPU type. ``hetrl calibrate`` fits these from
traces; ``hetrl estimate --params FILE`` loads them. Defaults and their sources: docs/cost-model.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from functools import cached_property, lru_cache
from numbers import Real
from typing import Any

from hetrl.errors import SpecError, is_int, require

#: Kernel kinds with an efficiency factor, and the default achieved/peak of each.
KERNEL_KINDS: dict[str, float] = {
    # Training forward+backward matmuls at hidden size 4096 (flops_half_hidden scales it),
    # kernel-level: collectives, bubble and the optimizer are priced on their own, never folded
    # in. Fitted (experiments/fit_public.py, docs/validation.md) on Megatron-LM's and
    # torchtitan's training rows and the H200 kernel runs: 0.439, rounded.
    "train_flops": 0.44,
    # Inference forwards and prefill at hidden size 4096, fitted the same way on TensorRT-LLM's
    # prefill row and the H200 kernel runs: 0.526, rounded.
    "infer_flops": 0.53,
    # Decode-step matmuls at small batch sizes: 0.40 of peak when they are compute-bound.
    "decode_flops": 0.40,
    # HBM streaming during decode (weights + KV cache): fitted on the public set's generation
    # rows (TensorRT-LLM, SGLang; fit_public.py): 0.804, rounded; public reports see ~77% of
    # the roofline for single-stream decode.
    "decode_hbm": 0.80,
    # Other HBM-bound kernels (optimizer step, weight reads of inference micro-batches): 0.80.
    "hbm": 0.80,
    # Achieved fraction of a link's nominal bandwidth for bulk transfers and collectives: 0.80.
    "link": 0.80,
}

#: Kernel kinds whose efficiency depends on the model's hidden size (CostParams.flops_efficiency).
SIZED_KINDS = ("train_flops", "infer_flops")


@dataclass(frozen=True)
class CostParams:
    """Every tunable constant of the cost model (units in the names).

    ``eta``: None derives the overlap of independent tasks from the device grouping (tasks sharing
    a device run one after another, disjoint ones in parallel); a number in [0, 1] forces the
    paper's Phi = eta * max + (1 - eta) * sum over each stage's tasks.
    """

    defaults: tuple[tuple[str, float], ...] = tuple(KERNEL_KINDS.items())
    per_gpu: tuple[tuple[str, str, float], ...] = ()
    decode_step_overhead_s: float = 1e-3  # scheduler, sampling and launch time per decode step
    # An eager rollout engine (no CUDA graphs: verl's default enforce_eager until 2025-08) runs
    # each layer's decode step from Python: its kernels' launches (~12 at ~5 us: NVIDIA, "Getting
    # Started with CUDA Graphs", 2019) and the framework's per-op dispatch around them. Fitted on
    # the fit step rows (experiments/fit_public.py, docs/validation.md): 0.761 ms, rounded (the
    # launch latency alone, 60 us, was the default before verl's logs were fitted).
    eager_launch_s_per_layer: float = 0.76e-3
    # Fixed seconds per transformer layer of every forward pass, beyond its FLOPs and bytes: the
    # framework's per-kernel launch and dispatch cost (a few kernels per layer). 0 (the default)
    # for GPU engines, whose steps the FLOP, HBM and per-step terms already cover; `hetrl
    # calibrate` fits it to a tiny model's CPU trace, where dispatch dominates the arithmetic
    # (without it the fit drives FLOP efficiencies to ~1e-4 to explain the time). Charged once per
    # layer per decode step, per prefill chunk and per micro-batch forward (x3 for a training
    # forward+backward).
    launch_overhead_s_per_layer: float = 0.0
    # Fixed cost of a co-located engine's sleep and wake per iteration (free and re-allocate the
    # KV pool, restore CUDA graphs): vLLM's sleep-mode post (2025-10) measures a level-1 wake of
    # Qwen3-0.6B at 0.26 s, of which moving 1.2 GB of weights takes ~0.05 s.
    engine_switch_s: float = 0.2
    # CUDA-graph capture of an engine that restarts cold each rollout (gen_sleep_level 0, graphs
    # on): vLLM logs "Graph capturing finished in 14 secs" for Llama-3.2-1B (35 batch shapes;
    # vllm-project/vllm#11349) and for Llama-3.1-8B on 8 GPUs (mlcommons/inference#2267); its
    # code comments "this usually takes < 10 seconds". Sleep mode (levels 1, 2) keeps the graphs.
    graph_capture_s: float = 14.0
    # Per NCCL call of a weight sync beyond its bytes: SGLang's per-tensor sync of a 1B and an
    # 8B model (public set row W4, a fit row: 147 and 291 calls) took 0.5 and 0.6 s, i.e. a
    # fixed 0.4 s (that engine's own, not modelled) + 0.7 ms per call.
    sync_call_overhead_s: float = 0.7e-3
    # Bytes per weight-sync call when the trainer buckets tensors; 0: one call per tensor (verl's
    # and NeMo-RL's NCCL broadcast).
    sync_bucket_bytes: float = 0.0
    # Per-step framework costs (hetrl.cost.framework), fitted on the public set's fit step rows
    # (experiments/fit_public.py --phase framework, docs/validation.md):
    # The rollout engine's host work per generated token in an RL framework, beyond the
    # per-step overhead: its scheduler, sampler and output processing handle every running
    # sequence every step (vLLM's "performance update" post, 2024-09: at large batches the GPU
    # idles on this host work). Charged per sequence per decode step, i.e. per generated token;
    # fitted with the framework costs on the fit step rows: 22.9 us, rounded.
    decode_s_per_token: float = 23e-6
    # Fixed seconds per micro-batch pass of an inference or training task on each pipeline
    # stage, whatever its tokens (x3 for a training forward+backward): the framework's Python
    # loop, host-device synchronisations, FSDP's per-layer gather latencies, the log-prob and
    # entropy kernels of one micro-batch. Fitted on the fit step rows: 21.5 ms, rounded.
    micro_batch_overhead_s: float = 0.021
    # A fixed cost per task call and the CPU scoring of a rule reward per sequence: the fit on
    # the fit step rows drives both to their floor (1 ms, 1e-7 s), so they default to 0.
    task_call_s: float = 0.0
    # The driver's data movement per token of the padded batch per task call: fitted on the
    # fit step rows, 0.69 us, rounded.
    driver_s_per_token: float = 0.7e-6
    rule_reward_s_per_sequence: float = 0.0
    prefill_chunk_tokens: int = 8192  # vLLM max_num_batched_tokens: one prefill chunk
    # of the memory the driver reports (GPUType.memory_bytes); the rest: the driver's reserved
    # block (0.35-0.76 GiB on the catalog's parts), the CUDA context, allocator fragmentation
    usable_memory_fraction: float = 0.92
    grad_bytes: int = 4  # bytes per gradient value kept and all-reduced (fp32 main grads)
    optimizer_state_bytes: int = 12  # fp32 master copy + Adam m and v, sharded over DP (ZeRO-1)
    # of optimizer_state_bytes, the master copy of the weights (fp32): an FSDP rank keeps it as
    # its weight shard (hetrl.cost.fsdp); 0 where the weights themselves are stepped
    master_weight_bytes: int = 4
    optimizer_step_hbm_bytes: int = 32  # HBM traffic per parameter of one Adam step (read+write)
    # Korthikanti et al. 2022, flash attention: a GPT layer's (its MLP part is adapted to SwiGLU,
    # see hetrl.cost.flops.activation_coeff)
    activation_bytes_per_token_hidden: float = 34.0
    # Host <-> GPU copies of offloaded FSDP shards, GB/s: PCIe Gen4 x16 is 32 GB/s per direction
    # in theory; pinned-memory copies reach ~25 (NVIDIA bandwidthTest on A100 hosts).
    host_link_GBps: float = 25.0
    # Matmul efficiency grows with the GEMMs' inner dimension, the model's hidden size h, and
    # saturates: the train_flops and infer_flops factors hold at flops_reference_hidden and scale
    # by s(h) / s(reference), s(h) = h / (h + flops_half_hidden) (0: no size dependence). The
    # H200 kernel runs (experiments/results/gpu-h200) measured 0.37 of peak training Qwen3-4B
    # (h 2560) and 0.46 for Qwen3-8B (h 4096); fitted with the public set's fit rows by
    # experiments/fit_public.py (docs/validation.md): 3152, rounded.
    flops_half_hidden: float = 3150.0
    flops_reference_hidden: int = 4096
    # Mixture of experts: the busiest expert-parallel rank's tokens over the mean, for its expert
    # matmuls, activations and all-to-all bytes (ep > 1; with ep = 1 one rank holds every expert
    # and the sum over experts is exact). 1.25 is the capacity factor Switch Transformer trains
    # with (Fedus et al. 2022, Sec. 2.2 and Table 1: capacity factor 1.0-1.25), the load a
    # capacity-bounded router lets one expert take; dropless routers (Megatron's default) can
    # exceed it.
    moe_load_imbalance: float = 1.25
    # Per framework profile (hetrl.cost.profiles) the multiplier on the framework costs above,
    # overriding the profile's own: (framework, scale) pairs; a file gives a mapping.
    framework_scale: tuple[tuple[str, float], ...] = ()
    eta: float | None = None

    def __post_init__(self) -> None:
        for kind, value in self.defaults:
            require(kind in KERNEL_KINDS, f"params.defaults.{kind}", value,
                    f"unknown kernel kind; kinds: {list(KERNEL_KINDS)}")
            require(0 < value <= 1, f"params.defaults.{kind}", value, "must be in (0, 1]")
        for gpu, kind, value in self.per_gpu:
            require(kind in KERNEL_KINDS, f"params.per_gpu.{gpu}.{kind}", value,
                    f"unknown kernel kind; kinds: {list(KERNEL_KINDS)}")
            require(0 < value <= 1, f"params.per_gpu.{gpu}.{kind}", value, "must be in (0, 1]")
        for key in ("decode_step_overhead_s", "prefill_chunk_tokens", "usable_memory_fraction",
                    "grad_bytes", "optimizer_state_bytes", "master_weight_bytes",
                    "optimizer_step_hbm_bytes", "activation_bytes_per_token_hidden",
                    "host_link_GBps",
                    "eager_launch_s_per_layer", "engine_switch_s", "graph_capture_s",
                    "sync_call_overhead_s",
                    "sync_bucket_bytes", "flops_half_hidden", "flops_reference_hidden",
                    "launch_overhead_s_per_layer", "task_call_s", "driver_s_per_token",
                    "rule_reward_s_per_sequence", "decode_s_per_token",
                    "micro_batch_overhead_s"):
            _number(f"params.{key}", getattr(self, key))
        for key in ("prefill_chunk_tokens", "grad_bytes", "optimizer_state_bytes",
                    "master_weight_bytes", "optimizer_step_hbm_bytes"):
            require(is_int(getattr(self, key)), f"params.{key}", getattr(self, key),
                    "must be an integer")
        for key in ("eager_launch_s_per_layer", "engine_switch_s", "graph_capture_s",
                    "sync_call_overhead_s", "sync_bucket_bytes", "flops_half_hidden",
                    "launch_overhead_s_per_layer",
                    "task_call_s", "driver_s_per_token", "rule_reward_s_per_sequence",
                    "decode_s_per_token", "micro_batch_overhead_s"):
            require(getattr(self, key) >= 0, f"params.{key}", getattr(self, key), "must be >= 0")
        require(self.flops_reference_hidden >= 1, "params.flops_reference_hidden",
                self.flops_reference_hidden, "must be >= 1 (a hidden size)")
        require(self.host_link_GBps > 0, "params.host_link_GBps", self.host_link_GBps,
                "must be > 0 GB/s")
        for key in ("grad_bytes", "optimizer_state_bytes", "master_weight_bytes",
                    "optimizer_step_hbm_bytes", "activation_bytes_per_token_hidden"):
            require(getattr(self, key) >= 0, f"params.{key}", getattr(self, key), "must be >= 0")
        require(self.master_weight_bytes <= self.optimizer_state_bytes,
                "params.master_weight_bytes", self.master_weight_bytes,
                f"must be <= optimizer_state_bytes ({self.optimizer_state_bytes}): the master "
                "copy is one of the optimizer's states")
        require(self.decode_step_overhead_s >= 0, "params.decode_step_overhead_s",
                self.decode_step_overhead_s, "must be >= 0 seconds")
        require(self.prefill_chunk_tokens >= 1, "params.prefill_chunk_tokens",
                self.prefill_chunk_tokens, "must be >= 1")
        require(0 < self.usable_memory_fraction <= 1, "params.usable_memory_fraction",
                self.usable_memory_fraction, "must be in (0, 1]")
        _number("params.moe_load_imbalance", self.moe_load_imbalance)
        require(1 <= self.moe_load_imbalance <= 64, "params.moe_load_imbalance",
                self.moe_load_imbalance, "must be in [1, 64] (the busiest rank's load / the mean)")
        from hetrl.spec.workload import FRAMEWORKS

        for name, scale in self.framework_scale:
            require(name in FRAMEWORKS, f"params.framework_scale.{name}", scale,
                    f"unknown framework; frameworks: {list(FRAMEWORKS)}")
            _number(f"params.framework_scale.{name}", scale)
            require(0 <= scale <= 100, f"params.framework_scale.{name}", scale,
                    "must be in [0, 100] (a multiplier on the fitted framework costs)")
        if self.eta is not None:
            _number("params.eta", self.eta)
            require(0 <= self.eta <= 1, "params.eta", self.eta, "must be in [0, 1] or null")

    @cached_property
    def _table(self) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
        return ({(g, k): v for g, k, v in self.per_gpu}, {**KERNEL_KINDS, **dict(self.defaults)})

    def efficiency(self, gpu: str, kind: str) -> float:
        """Achieved / peak of kernel ``kind`` on GPU type ``gpu`` (memoised per pair)."""
        try:
            return self._memo[gpu, kind]
        except KeyError:
            per, default = self._table
            value = self._memo[gpu, kind] = per.get((gpu, kind)) or default[kind]
            return value

    def flops_efficiency(self, gpu: str, kind: str, hidden: int) -> float:
        """Achieved / peak of kernel ``kind`` for a model of hidden size ``hidden`` on ``gpu``:
        for the kinds in :data:`SIZED_KINDS` the kind's factor scaled by the saturating size
        curve (see ``flops_half_hidden``), at most 1; other kinds as :meth:`efficiency`."""
        if kind not in SIZED_KINDS:
            return self.efficiency(gpu, kind)
        h0 = self.flops_half_hidden
        ref = self.flops_reference_hidden
        scale = hidden * (ref + h0) / (ref * (hidden + h0))
        return min(1.0, self.efficiency(gpu, kind) * scale)

    @cached_property
    def _memo(self) -> dict[tuple[str, str], float]:
        return {}

    def __hash__(self) -> int:  # hashed in the cost model's cache keys: compute once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))
            self.__dict__["_hash"] = h
        return h

    def __getstate__(self) -> dict:  # string hashes differ between processes: drop the cached one
        return {k: v for k, v in self.__dict__.items() if k not in ("_hash", "_memo")}

    def with_efficiency(self, gpu: str | None, kind: str, value: float) -> CostParams:
        """A copy with one factor set (``gpu`` None sets the default of ``kind``)."""
        if gpu is None:
            d = dict(self.defaults)
            d[kind] = value
            return replace(self, defaults=tuple(d.items()))
        rest = tuple(x for x in self.per_gpu if not (x[0] == gpu and x[1] == kind))
        return replace(self, per_gpu=rest + ((gpu, kind, value),))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["defaults"] = dict(self.defaults)
        per: dict[str, dict[str, float]] = {}
        for g, k, v in self.per_gpu:
            per.setdefault(g, {})[k] = v
        out["per_gpu"] = per
        out["framework_scale"] = dict(self.framework_scale)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostParams:
        require(isinstance(data, Mapping), "params", data, "must be a mapping")
        known = set(cls.__dataclass_fields__)
        for key in data:
            require(key in known, f"params.{key}", data[key], f"unknown key; known: {sorted(known)}")
        values = dict(data)
        defaults = dict(KERNEL_KINDS)
        raw_defaults = values.pop("defaults", {}) or {}
        require(isinstance(raw_defaults, Mapping), "params.defaults", raw_defaults, "must be a mapping")
        defaults.update({k: _number(f"params.defaults.{k}", v) for k, v in raw_defaults.items()})
        raw_per = values.pop("per_gpu", {}) or {}
        require(isinstance(raw_per, Mapping), "params.per_gpu", raw_per,
                "must be a mapping gpu -> {kind: value}")
        for g, kinds in raw_per.items():
            require(isinstance(g, str), "params.per_gpu", g, "GPU type names must be strings")
            require(isinstance(kinds, Mapping), f"params.per_gpu.{g}", kinds,
                    "must be a mapping kind -> efficiency")
        # built-in short names (A100) mean their type (A100-80GB), as in cluster files
        from hetrl.spec.hardware import gpu_aliases

        aliases = gpu_aliases()
        per = tuple((aliases.get(str(g), str(g)), str(k), _number(f"params.per_gpu.{g}.{k}", v))
                    for g, kinds in raw_per.items() for k, v in kinds.items())
        raw_scale = values.pop("framework_scale", {}) or {}
        require(isinstance(raw_scale, Mapping), "params.framework_scale", raw_scale,
                "must be a mapping framework -> multiplier")
        values["framework_scale"] = tuple((str(k), v) for k, v in raw_scale.items())
        try:
            return cls(defaults=tuple(defaults.items()), per_gpu=per, **values)
        except TypeError as exc:
            raise SpecError("params", data, str(exc)) from None


def _number(field: str, value: Any) -> float:
    """``value`` as a float if it is a finite real number (not a bool), else a SpecError."""
    require(isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value),
            field, value, "must be a finite number")
    return float(value)


DEFAULT_PARAMS = CostParams()

#: What an optimizer precision (``WorkloadSpec.optimizer_precision``) keeps per parameter, bytes.
#: ``fp32``: CostParams' own -- mixed precision, fp32 main gradients, an fp32 master copy and fp32
#: Adam m and v (Megatron's distributed optimizer, DeepSpeed's bf16 optimizer, verl's FSDP
#: actor loaded in fp32). ``bf16``: the model cast to bf16 and stepped in place by
#: ``torch.optim.Adam``, whose states take the parameters' dtype (``exp_avg =
#: torch.zeros_like(p)``): bf16 gradients, m and v, no master copy (NeMo AutoModel's MoE
#: benchmark recipes: the model's ``initialize_weights`` casts it to bf16, the optimizer is
#: torch.optim.Adam with no ``fused``). An Adam step by torch's default multi-tensor path runs
#: seven kernels (lerp of m; mul and addcmul of v; sqrt, div and add of the denominator; addcdiv
#: of the weight) that read 11 and write 7 values of 2 bytes: 36 bytes of HBM traffic per
#: parameter. A bf16 optimizer sets these four fields whatever a params file gives them (a file's
#: values hold for fp32).
OPTIMIZER_PRECISIONS: dict[str, dict[str, int]] = {
    "fp32": {},
    "bf16": {"grad_bytes": 2, "optimizer_state_bytes": 4, "master_weight_bytes": 0,
             "optimizer_step_hbm_bytes": 36},
}


@lru_cache(maxsize=64)
def optimizer_params(params: CostParams, precision: str) -> CostParams:
    """``params`` with the bytes per parameter that optimizer ``precision`` keeps
    (:data:`OPTIMIZER_PRECISIONS`; the same object for the same arguments, and ``params`` itself
    for ``fp32``)."""
    bytes_of = OPTIMIZER_PRECISIONS[precision]
    return replace(params, **bytes_of) if bytes_of else params
