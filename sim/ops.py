"""Durations of elementary steps, from the cost model's own primitives and efficiency factors
(one source of truth for hardware speed): a prefill, a run of decode steps, a forward or
backward micro-batch on one pipeline stage. Seconds throughout."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetrl.cost.expert_parallel import alltoall_pieces, dispatch_bytes
from hetrl.cost.flops import StageShape, collectives_per_layer, training_flops_mult
from hetrl.cost.params import CostParams
from hetrl.cost.primitives import GroupLinks, all_reduce_time
from hetrl.cost.replica import ReplicaHW, StageHW
from hetrl.cost.rollout import decode_step_overhead_s


def sum_max_affine(a1: float, b1: float, a2: float, b2: float, k: int) -> float:
    """sum_{i=0}^{k-1} max(a1 + b1 i, a2 + b2 i), exactly (the lines cross at most once)."""
    if k <= 0:
        return 0.0

    def series(a: float, b: float, lo: int, hi: int) -> float:  # sum over i in [lo, hi)
        n = hi - lo
        return n * a + b * (lo + hi - 1) * n / 2 if n > 0 else 0.0

    if b1 == b2:
        return series(max(a1, a2), b1, 0, k)
    cross = (a2 - a1) / (b1 - b2)  # a1 + b1 x = a2 + b2 x
    split = min(max(math.ceil(cross), 0), k)
    # before the crossing the line with the smaller slope is above, after it the other
    lo_line, hi_line = ((a1, b1), (a2, b2)) if b1 < b2 else ((a2, b2), (a1, b1))
    return series(*lo_line, 0, split) + series(*hi_line, split, k)


def _prefill_flops(s: StageShape, tokens: float, sq_sum: float, prompts: float) -> float:
    """FLOPs of prefilling ``prompts`` prompts of ``tokens`` tokens in all (``sq_sum``: the sum of
    their squared lengths) on stage ``s``: the output head for one position per prompt."""
    return (tokens * (s.matmul_flops_per_token - s.head_flops_per_token)
            + prompts * s.head_flops_per_token + s.attn_flops_per_token_ctx * sq_sum / 2)


def _decode_lines(st: StageSpeed, batch: int, ctx_sum: float) -> tuple[float, float, float, float]:
    """A decode step of ``batch`` sequences on stage ``st`` as two lines in the step index i
    (seconds): HBM a_h + b_h i (weights + KV of the whole context) and FLOPs a_f + b_f i (dense
    per sequence + attention), the contexts summing to ``ctx_sum`` tokens at i = 0."""
    s = st.shape
    # (the weights a step of this batch reads: the experts its tokens use, for an MoE model)
    a_h = (s.decode_weight_bytes(batch) + ctx_sum * s.kv_bytes_per_token) / st.hbm_decode
    b_h = batch * s.kv_bytes_per_token / st.hbm_decode
    a_f = (batch * s.matmul_flops_per_token + s.attn_flops_per_token_ctx * ctx_sum) / st.flops_decode
    b_f = batch * s.attn_flops_per_token_ctx / st.flops_decode
    return a_h, b_h, a_f, b_f


@dataclass(frozen=True)
class PrefillWork:
    """Prompt tokens still to prefill: their count, the sum of their prompts' squared lengths
    (attention) and the number of prompts (the output head runs once per prompt)."""

    tokens: float
    sq_sum: float
    prompts: float

    def plus(self, other: PrefillWork) -> PrefillWork:
        return PrefillWork(self.tokens + other.tokens, self.sq_sum + other.sq_sum,
                           self.prompts + other.prompts)


NO_PREFILL = PrefillWork(0.0, 0.0, 0.0)


@dataclass(frozen=True)
class StageSpeed:
    """One pipeline stage's speeds with efficiencies applied."""

    shape: StageShape
    hw: StageHW
    flops_infer: float  # achieved FLOP/s
    flops_train: float
    flops_decode: float
    hbm: float  # achieved bytes/s for weight reads
    hbm_decode: float
    link_eff: float

    @classmethod
    def of(cls, shape: StageShape, hw: StageHW, params: CostParams) -> StageSpeed:
        e, sized = params.efficiency, params.flops_efficiency
        h = shape.model.hidden
        peak = shape.peak_flops(hw)  # (FP8's where the stage runs FP8 matmuls)
        return cls(shape, hw, peak * sized(hw.gpu, "infer_flops", h),
                   peak * sized(hw.gpu, "train_flops", h),
                   peak * e(hw.gpu, "decode_flops"), hw.hbm_Bps * e(hw.gpu, "hbm"),
                   hw.hbm_Bps * e(hw.gpu, "decode_hbm"), e(hw.gpu, "link"))

    def tp_allreduce(self, nbytes: float) -> float:
        return all_reduce_time(nbytes, self.hw.tp, self.link_eff)


class ReplicaOps:
    """Step durations of one replica (stages in order)."""

    def __init__(self, shapes: tuple[StageShape, ...], hw: ReplicaHW, params: CostParams,
                 cuda_graphs: bool = True, tp_overlap: bool = False,
                 expert_links: list[GroupLinks] | None = None):
        self.stages = [StageSpeed.of(s, h, params) for s, h in zip(shapes, hw.stages, strict=True)]
        #: generation with expert parallelism: per stage its all-to-all as (seconds per call,
        #: seconds per token) over its expert-parallel group's links (None: no EP)
        self.alltoall = None
        if expert_links is not None and shapes[0].ep > 1:
            self.alltoall = []
            for sh, st, g in zip(shapes, self.stages, expert_links, strict=True):
                a, b = alltoall_pieces(g, st.link_eff)
                calls = collectives_per_layer("generation", False) * sh.moe_layers
                self.alltoall.append((calls * a, calls * b * dispatch_bytes(sh, 1.0)))
        self.boundaries = hw.boundaries
        self.params = params
        self.step_overhead_s = decode_step_overhead_s(shapes, params, cuda_graphs)
        self.h = shapes[0].model.hidden
        self.bpv = shapes[0].bytes_per_value
        self.tp = shapes[0].tp
        #: training's TP collectives pipelined with its GEMMs (Megatron's --tp-comm-overlap)
        self.tp_overlap = tp_overlap
        self._tp_decode: dict[int, float] = {}

    # --- generation ---
    def prefill(self, prompt_tokens: float, prompt_sq_sum: float, prompts: int) -> float:
        """Chunked prefill of ``prompts`` prompts with ``prompt_tokens`` tokens in all, stage after
        stage (the output head runs for one position per prompt, as in the cost model)."""
        if prompt_tokens <= 0:
            return 0.0
        chunks = max(1, math.ceil(prompt_tokens / self.params.prefill_chunk_tokens))
        chunk_tok = prompt_tokens / chunks
        total = 0.0
        for st in self.stages:
            s = st.shape
            fl = _prefill_flops(s, prompt_tokens, prompt_sq_sum, prompts)
            total += max(fl / st.flops_infer, chunks * s.weight_bytes / st.hbm)
            total += chunks * 2 * s.layers * st.tp_allreduce(chunk_tok * self.h * self.bpv)
            total += chunks * s.layers * self.params.launch_overhead_s_per_layer
        for lat, bw in self.boundaries:
            total += chunks * (lat + chunk_tok * self.h * self.bpv / (bw * self.stages[0].link_eff))
        return total + self.expert_alltoall(chunks, prompt_tokens)

    def expert_alltoall(self, calls: float, tokens: float) -> float:
        """Generation's all-to-alls (expert parallelism) for ``calls`` passes (decode steps,
        prefill chunks) moving ``tokens`` tokens in all, every stage in turn, priced over the
        expert-parallel group's links as the cost model prices them
        (:func:`hetrl.cost.expert_parallel.alltoall_pieces`): per decode step they are small,
        latency-bound messages, replayed as a duration rather than as flows."""
        if self.alltoall is None:
            return 0.0
        return sum(calls * a + tokens * b for a, b in self.alltoall)

    def decode(self, batch: int, ctx_sum: float, steps: int) -> float:
        """``steps`` decode steps of ``batch`` sequences whose contexts sum to ``ctx_sum`` tokens
        at the first step (each step adds ``batch`` tokens of context)."""
        if steps <= 0 or batch <= 0:
            return 0.0
        total = 0.0
        for st in self.stages:
            total += sum_max_affine(*_decode_lines(st, batch, ctx_sum), steps)
        total += steps * (self._decode_comm(batch) + self.step_overhead_s
                          + batch * self.params.decode_s_per_token)
        return total + self.expert_alltoall(steps, steps * batch)

    def decode_mixed(self, batch: int, ctx_sum: float, steps: int, prefill: PrefillWork
                     ) -> tuple[float, PrefillWork | None]:
        """``steps`` decode steps as :meth:`decode`, with ``prefill`` (prompts admitted while
        the batch runs) chunked into them as vLLM's chunked prefill does: each step carries up
        to ``prefill_chunk_tokens`` (``max_num_batched_tokens``) less its ``batch`` decode
        tokens of prompt, whose FLOPs join the step's and whose tokens join its TP messages;
        the weights are read once per step. Returns (seconds, the prefill left for later steps
        or None)."""
        if prefill.tokens <= 0:
            return self.decode(batch, ctx_sum, steps), None
        per_step = max(self.params.prefill_chunk_tokens - batch, 1)
        mixed = min(steps, math.ceil(prefill.tokens / per_step))
        done = min(prefill.tokens, mixed * per_step)
        share = done / prefill.tokens  # of the prefill's FLOPs and its prompts, these steps
        chunk = done / mixed
        total = 0.0
        for st in self.stages:
            pre_f = share * _prefill_flops(st.shape, prefill.tokens, prefill.sq_sum,
                                           prefill.prompts) / st.flops_infer
            a_h, b_h, a_f, b_f = _decode_lines(st, batch, ctx_sum)
            total += sum_max_affine(a_h, b_h, a_f + pre_f / mixed, b_f, mixed)
            total += sum_max_affine(a_h + b_h * mixed, b_h, a_f + b_f * mixed, b_f, steps - mixed)
        total += mixed * self._decode_comm(batch + math.ceil(chunk))
        total += (steps - mixed) * self._decode_comm(batch)
        total += steps * (self.step_overhead_s + batch * self.params.decode_s_per_token)
        total += self.expert_alltoall(steps, steps * batch + done)
        left = None if done >= prefill.tokens else PrefillWork(
            prefill.tokens - done, prefill.sq_sum * (1 - share), prefill.prompts * (1 - share))
        return total, left

    def _decode_comm(self, batch: int) -> float:
        t = self._tp_decode.get(batch)
        if t is None:
            t = sum(2 * st.shape.layers * st.tp_allreduce(batch * self.h * self.bpv)
                    for st in self.stages)
            t += sum(lat + batch * self.h * self.bpv / (bw * self.stages[0].link_eff)
                     for lat, bw in self.boundaries)
            self._tp_decode[batch] = t
        return t

    # --- inference and training micro-batches ---
    def forward(self, j: int, tokens: float, sq_sum: float, kind: str) -> float:
        """One micro-batch's forward on stage j (``kind`` "infer" or "train")."""
        st = self.stages[j]
        s = st.shape
        fl = tokens * s.matmul_flops_per_token + s.attn_flops_per_token_ctx * sq_sum / 2
        peak = st.flops_infer if kind == "infer" else st.flops_train
        return self._with_tp(max(fl / peak, s.weight_bytes / st.hbm),
                             2 * s.layers * st.tp_allreduce(tokens * self.h * self.bpv),
                             kind == "train") + s.layers * self.params.launch_overhead_s_per_layer + (
            self.params.micro_batch_overhead_s)

    def backward(self, j: int, tokens: float, sq_sum: float, recompute: bool | str) -> float:
        """One micro-batch's backward on stage j: 2x the forward FLOPs (3x with full
        recomputation, in between with selective: the training pass's multiple less the forward,
        :func:`~hetrl.cost.flops.training_flops_mult`) and 2 TP all-reduces per layer (4 with
        full recomputation)."""
        st = self.stages[j]
        s = st.shape
        fl = tokens * s.matmul_flops_per_token + s.attn_flops_per_token_ctx * sq_sum / 2
        mult = training_flops_mult(s.model, recompute) - 1.0
        ars = collectives_per_layer("training", recompute) - 2  # (the forward's 2 are not here)
        return self._with_tp(max(mult * fl / st.flops_train, s.weight_bytes / st.hbm),
                             ars * s.layers * st.tp_allreduce(tokens * self.h * self.bpv), True) + (
            2 * s.layers * self.params.launch_overhead_s_per_layer
            + 2 * self.params.micro_batch_overhead_s)

    def _with_tp(self, work: float, tp: float, training: bool) -> float:
        """An op's compute (or weight reads) and its TP collectives: one after the other, or
        pipelined (the longer of the two) in training with ``tp_overlap``."""
        return max(work, tp) if training and self.tp_overlap else work + tp

    def boundary_bytes(self, tokens: float) -> float:
        """Bytes each tp rank sends to its peer in the next stage for ``tokens`` tokens."""
        return tokens * self.h * self.bpv / self.tp
