"""Per-replica costs of the three task kinds. Every function returns the replica's time split
into additive parts (seconds): ``compute``, ``hbm``, ``bubble``, ``tp``, ``pp``, ``overhead``.
Task-level parts (``dp``, ``data``) are added by the caller. Formulas: docs/cost-model.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from hetrl.cost.batching import Batching, micro_batcher, micro_count
from hetrl.cost.flops import StageShape, collectives_per_layer, training_flops_mult
from hetrl.cost.kernels import forward_replica_seconds
from hetrl.cost.lengths import LengthStats
from hetrl.cost.memo import ENGINE_ENTRIES, TASK_TERMS, Table
from hetrl.cost.params import CostParams
from hetrl.cost.primitives import (
    all_reduce_pieces,
    all_reduce_time,
    all_reduce_time_vec,
    p2p_time,
)
from hetrl.cost.replica import ReplicaHW
from hetrl.cost.rollout import decode_step_overhead_s, generation_concurrency

#: ``framework``: the per-call framework costs of hetrl.cost.framework (task level); ``ep``:
#: expert parallelism's all-to-alls (hetrl.cost.expert_parallel, task level)
PARTS = ("compute", "hbm", "bubble", "tp", "pp", "dp", "data", "overhead", "offload",
         "framework", "ep")


@dataclass(frozen=True)
class ReplicaCost:
    seconds: float
    parts: dict[str, float]
    concurrency: int = 0  # generation: sequences decoded at once
    violations: tuple[str, ...] = field(default=())
    #: generation: (prefill seconds, decode seconds, decode steps); the two sum to ``seconds``
    phases: tuple[float, float, float] = (0.0, 0.0, 0.0)


def _parts(**kw: float) -> dict[str, float]:
    out = dict.fromkeys(PARTS, 0.0)
    out.update(kw)
    return out


# --- generation ---------------------------------------------------------------------------------

def generation_replica(shapes: tuple[StageShape, ...], hw: ReplicaHW, n: float,
                       kv_budget: tuple[float, ...], L: LengthStats, max_concurrency: int,
                       params: CostParams, cuda_graphs: bool = True) -> ReplicaCost:
    """Prefill then continuous-batching decode of ``n`` sequences on one replica.

    Concurrency B = min(max_concurrency, KV budget / KV bytes of an average sequence). While more
    than B sequences remain, B run at once (the saturated phase, ``(n - B) * mean / B`` steps at
    the mean running context); the last B drain as their lengths end: at step s the batch is
    B * P(len >= s) and the step runs if any of them is alive (P = 1 - P(len < s)^B).
    Each decode step costs, per stage, max(weights + KV bytes / HBM, FLOPs / peak) plus TP
    all-reduces, plus stage-to-stage sends and a fixed per-step overhead (with or without
    ``cuda_graphs``: :func:`hetrl.cost.rollout.decode_step_overhead_s`).
    """
    return generation_engine(shapes, hw, L, params, cuda_graphs).replica(n, kv_budget,
                                                                         max_concurrency)


def generation_engine(shapes: tuple[StageShape, ...], hw: ReplicaHW, L: LengthStats,
                      params: CostParams, cuda_graphs: bool = True) -> _GenerationEngine:
    """The generation costs of one layout on one replica's hardware as a function of the
    sequence count (memoised: its n-independent terms are computed once)."""
    key = ("gen", shapes, hw, L, params, cuda_graphs)
    out = TASK_TERMS.get(key)
    if out is None:
        out = _GenerationEngine(shapes, hw, L, params, cuda_graphs)
        TASK_TERMS.put(key, out)
    return out


class _GenerationEngine:
    """:func:`generation_replica` with its n-independent terms computed once: per stage the
    prefill factors, per KV budget the concurrency and violations, per concurrency the saturated
    step, per drain size the drain (up to a bound)."""

    def __init__(self, shapes: tuple[StageShape, ...], hw: ReplicaHW, L: LengthStats,
                 params: CostParams, cuda_graphs: bool = True):
        self.shapes, self.hw, self.L, self.params = shapes, hw, L, params
        self.step_overhead_s = decode_step_overhead_s(shapes, params, cuda_graphs)
        eff = params.efficiency
        hidden = shapes[0].model.hidden
        # prefill: the body's FLOPs per prompt token, the head's once per sequence
        self.stages = [(s.matmul_flops_per_token - s.head_flops_per_token,
                        s.head_flops_per_token, s.attn_flops_per_token_ctx,
                        s.peak_flops(st) * params.flops_efficiency(st.gpu, "infer_flops",
                                                                   hidden),
                        s.weight_bytes,
                        st.hbm_Bps * eff(st.gpu, "hbm"), s.layers, st.tp, eff(st.gpu, "link"))
                       for s, st in zip(shapes, hw.stages, strict=True)]
        self.link_eff = eff(hw.stages[0].gpu, "link")
        self.h, self.bpv = shapes[0].model.hidden, shapes[0].bytes_per_value
        self.p_sq = L.prompt_mean ** 2  # E[p^2] >= mean^2; prefill is a small term
        #: KV tokens per sequence of a batch started together at its peak
        self.together_tokens = float((L.survival * L.ctx).max())
        #: per (KV budget, concurrency cap): the concurrency and its violations
        self.concurrency = Table("generation concurrency", ENGINE_ENTRIES)
        #: per concurrency: the saturated phase's per-step terms
        self.saturated = Table("saturated decode", ENGINE_ENTRIES)
        #: per drain size: the drain's terms
        self.drain = Table("decode drain", ENGINE_ENTRIES)
        #: per (sequences, concurrency, violations): the replica's cost
        self.priced = Table("generation replicas", ENGINE_ENTRIES)

    def _concurrency(self, kv_budget: tuple[float, ...],
                     max_concurrency: int) -> tuple[int, tuple[str, ...]]:
        L, hw = self.L, self.hw
        violations = []
        for j, (s, budget) in enumerate(zip(self.shapes, kv_budget, strict=True)):
            need_one = s.kv_bytes_per_token * (L.prompt_max + L.response_max)
            if budget < need_one:
                violations.append(
                    f"stage {j} ({hw.stages[j].gpu}): KV cache budget {budget / 1e9:.2f} GB < "
                    f"{need_one / 1e9:.2f} GB for one max-length sequence")
        # KV on demand: a running sequence holds its prompt and its age, mean_age at the mean
        # (the saturated phase); sequences started together (the drain) peak at
        # max_s P(len >= s) (prompt + s) tokens each
        cap = generation_concurrency(self.shapes, kv_budget, L.prompt_mean + L.mean_age,
                                     max_concurrency)
        together = generation_concurrency(self.shapes, kv_budget, self.together_tokens,
                                          max_concurrency)
        return cap, together, tuple(violations)

    def replica(self, n: float, kv_budget: tuple[float, ...], max_concurrency: int,
                batch_total: float | None = None) -> ReplicaCost:
        """``n`` sequences on this replica, of ``batch_total`` in the whole batch (default
        ``n``): the task ends with its slowest replica, the one that holds the batch's longest
        response, so the drain runs until the longest of ``batch_total`` ends."""
        key = (kv_budget, max_concurrency)
        conc = self.concurrency.get(key)
        if conc is None:
            conc = self.concurrency.put(key, self._concurrency(kv_budget, max_concurrency))
        # The budget enters only through the concurrency it allows (and its violations), so
        # budgets that allow the same concurrency share one answer.
        total = n if batch_total is None else max(batch_total, n)
        out = self.priced.get((n, total, *conc))
        if out is None:
            out = self.priced.put((n, total, *conc), self._replica(n, total, *conc))
        return out

    def _replica(self, n: float, total: float, B: int, together: int,
                 violations: tuple[str, ...]) -> ReplicaCost:
        # one wave when the cache holds all n started together; else the saturated phase at B
        # and a drain of the last min(B, together)
        m = n if n <= together else min(n, B, together)
        if n <= 0:
            return ReplicaCost(0.0, _parts(), B, violations)
        L, params, h, bpv = self.L, self.params, self.h, self.bpv

        # Prefill of the first m prompts on its own: compute-bound, in chunks of
        # prefill_chunk_tokens, stage after stage; the other n - m prompts are admitted while
        # the batch decodes and their prefill joins the saturated steps (chunked prefill).
        ptoks = m * L.prompt_mean
        chunks = max(1, math.ceil(ptoks / params.prefill_chunk_tokens))
        chunk_tok = ptoks / chunks
        pre_c, pre_h, pre_tp = 0.0, 0.0, 0.0
        p_sq = self.p_sq
        msg = chunk_tok * h * bpv
        for body, head, afpc, flops_rate, wb, hbm_rate, layers, g, tp_eff in self.stages:
            fl = ptoks * body + m * head + afpc * m * p_sq / 2
            c = fl / flops_rate
            hb = chunks * wb / hbm_rate
            tp = chunks * 2 * layers * all_reduce_time(msg, g, tp_eff)
            pre_c += c if c >= hb else 0.0
            pre_h += hb if hb > c else 0.0
            pre_tp += tp
        # a boundary's bandwidth already counts its tp ranks sending their slices in parallel
        link_eff = self.link_eff
        pre_pp = chunks * sum(p2p_time(msg, lat, bw, link_eff) for lat, bw in self.hw.boundaries)
        # Saturated phase: (n - m) * mean / B steps of B sequences at the mean running context.
        sat_steps = max(n - m, 0.0) * L.response_mean / B
        sat = self.saturated.get(B)
        if sat is None:
            sat = self.saturated.put(B, _decode_steps(self.shapes, self.hw, float(B), L,
                                                      params, saturated=True))
        sc, sm, stp, spp, _ = sat
        # Drain phase: the last m sequences (memoised: it does not depend on n once n >= B).
        drain = self.drain.get((m, total))
        if drain is None:
            drain = self.drain.put((m, total), _drain(self.shapes, self.hw, float(m), L, params,
                                                      float(total)))
        dc, dm, dtp, dpp, dsteps = drain
        compute = pre_c + sat_steps * sc + dc
        hbm = pre_h + sat_steps * sm + dm
        tp = pre_tp + sat_steps * stp + dtp
        pp = pre_pp + sat_steps * spp + dpp
        steps = sat_steps + dsteps
        # per step its fixed overhead; per running sequence per step (every generated token:
        # (n - m) mean in the saturated phase, m mean in the drain) the engine's host work
        overhead = steps * self.step_overhead_s + n * L.response_mean * params.decode_s_per_token
        launch = params.launch_overhead_s_per_layer
        if launch > 0:  # prefill launches every layer once per chunk, stage after stage
            pre_launch = chunks * launch * sum(s[6] for s in self.stages)
            overhead += pre_launch
        else:
            pre_launch = 0.0
        parts = {"compute": compute, "hbm": hbm, "bubble": 0.0, "tp": tp, "pp": pp, "dp": 0.0,
                 "data": 0.0, "overhead": overhead, "offload": 0.0, "framework": 0.0, "ep": 0.0}
        seconds = compute + hbm + tp + pp + overhead
        prefill = pre_c + pre_h + pre_tp + pre_pp + pre_launch
        return ReplicaCost(seconds, parts, B, violations,
                           (prefill, max(seconds - prefill, 0.0), steps))



@lru_cache(maxsize=8192)
def _decode_steps(shapes: tuple[StageShape, ...], hw: ReplicaHW, m: float, L: LengthStats,
                  params: CostParams, saturated: bool) -> tuple[float, float, float, float, float]:
    """Decode-step costs split into (compute, hbm, tp, pp, steps). ``saturated``: one step of
    ``m`` sequences at the mean running context (prompt + mean age), carrying the chunked
    prefill of the m / (mean response) prompts admitted per step in steady state (their FLOPs
    at the prefill rate, in lumps of whole prompts on a share of the steps; their tokens in the
    TP and stage messages). Otherwise the drain of
    ``m`` sequences started together: sum over steps s of P(any alive at s) x the step's cost at
    the expected batch given that one is alive, m P(len >= s) / P(any alive)."""
    h = shapes[0].model.hidden
    bpv = shapes[0].bytes_per_value
    link_eff = params.efficiency(hw.stages[0].gpu, "link")
    if not saturated:
        return _drain(shapes, hw, m, L, params)
    batch = np.array([m])
    ctx = np.array([L.prompt_mean + L.mean_age])
    weight = np.ones(1)
    comp = np.zeros_like(batch)
    mem = np.zeros_like(batch)
    tp = np.zeros_like(batch)
    admitted = m / L.response_mean  # prompts admitted per step
    # vLLM prefills an admitted prompt within one step (its tokens fit the step's budget), so
    # the prefill comes in lumps: a step carries prompts with probability w = 1 - e^-admitted
    # (sequences end as a Poisson stream), admitted / w of them when it does
    with_prefill = -math.expm1(-admitted)
    lump = admitted / with_prefill if with_prefill > 0 else 0.0
    p_sq = L.prompt_var + L.prompt_mean ** 2
    for s, st in zip(shapes, hw.stages, strict=True):
        # (weights: the experts the step's tokens use, :meth:`StageShape.decode_weight_bytes`)
        hb = (s.decode_weight_bytes(batch) + batch * ctx * s.kv_bytes_per_token) / (
            st.hbm_Bps * params.efficiency(st.gpu, "decode_hbm"))
        peak = s.peak_flops(st)
        fl = batch * (s.matmul_flops_per_token + s.attn_flops_per_token_ctx * ctx) / (
            peak * params.efficiency(st.gpu, "decode_flops"))
        pre = lump * (L.prompt_mean * (s.matmul_flops_per_token - s.head_flops_per_token)
                      + s.head_flops_per_token + s.attn_flops_per_token_ctx * p_sq / 2) / (
            peak * params.flops_efficiency(st.gpu, "infer_flops", h))
        for share, flops in ((1.0 - with_prefill, fl), (with_prefill, fl + pre)):
            comp += share * np.where(flops >= hb, flops, 0.0)
            mem += share * np.where(flops >= hb, 0.0, hb)
        tp += 2 * s.layers * all_reduce_time_vec((batch + admitted * L.prompt_mean) * h * bpv,
                                                 st.tp, params.efficiency(st.gpu, "link"))
    pp = np.zeros_like(batch)
    for lat, bw in hw.boundaries:
        pp += lat + (batch + admitted * L.prompt_mean) * h * bpv / (bw * link_eff)
    return (float(comp @ weight), float(mem @ weight), float(tp @ weight), float(pp @ weight),
            float(weight.sum()))


def _drain(shapes: tuple[StageShape, ...], hw: ReplicaHW, m: float, L: LengthStats,
           params: CostParams, total: float | None = None
           ) -> tuple[float, float, float, float, float]:
    """The drain of :func:`_decode_steps`, weighted sums taken in closed form: with w = P(any
    of ``total`` alive) (default m: the replica's own; the batch's, for the replica that holds
    its longest response) and batch = m P(len >= s) / w, w x batch = m P(len >= s), so a step's FLOPs, KV reads
    and messages weigh in as m x survival x (per-sequence constants, memoised per shapes and
    hardware); only the compute/HBM choice and the collective algorithm need the batch."""
    consts, log_below, surv, surv_sum, lat_sum, send_coeff = _drain_consts(shapes, hw, L, params)
    wx = np.empty((2, surv.size))  # rows: weight, m x survival (the TP pieces' two variables)
    weight, ms = wx
    np.exp(max(m if total is None else total, 1.0) * log_below, out=weight)
    np.subtract(1.0, weight, out=weight)
    np.multiply(m, surv, out=ms)
    steps = float(weight.sum())
    batch = ms / np.maximum(weight, 1e-300)
    comp = mem = tp = 0.0
    for margin, w_s, fk_w, kv_w_total, pieces, experts in consts:
        # weight-read seconds per step: constant, or (MoE) the experts each step's batch uses
        w_steps = w_s if experts is None else experts[0].decode_weight_bytes(batch) / experts[1]
        is_comp = batch * margin >= w_steps  # FLOPs >= weight + KV reads
        flops_c, kv_c = fk_w @ is_comp
        comp += m * float(flops_c)
        if experts is None:
            mem += w_s * (steps - float(weight @ is_comp)) + m * (kv_w_total - float(kv_c))
        else:
            mem += float((weight * w_steps) @ ~is_comp) + m * (kv_w_total - float(kv_c))
        if pieces is not None:
            tp += float((pieces @ wx).min(axis=0).sum())
    pp = lat_sum * steps + m * send_coeff * surv_sum
    return comp, mem, tp, pp, steps


def _drain_consts(shapes: tuple[StageShape, ...], hw: ReplicaHW, L: LengthStats,
                  params: CostParams) -> tuple:
    """Per stage (FLOP minus KV-read seconds per sequence per step, weight-read seconds per
    step, survival-weighted FLOP and KV arrays stacked, the latter's total, TP all-reduce pieces
    as rows (a, b): a x weight + b x m x survival, and where a step reads only the experts its
    batch uses (the stage shape, whose :meth:`StageShape.decode_weight_bytes` says how many
    bytes, and the achieved HBM bytes/s), else None), log P(len < s), survival, its sum, the
    boundaries' summed latency and seconds per sequence (memoised)."""
    key = ("drain", shapes, hw, L, params)
    out = TASK_TERMS.get(key)
    if out is not None:
        return out
    eff = params.efficiency
    h, bpv = shapes[0].model.hidden, shapes[0].bytes_per_value
    surv, ctx = L.survival, L.ctx
    consts = []
    for s, st in zip(shapes, hw.stages, strict=True):
        hbm = st.hbm_Bps * eff(st.gpu, "decode_hbm")
        fl = (s.matmul_flops_per_token + s.attn_flops_per_token_ctx * ctx) / (
            s.peak_flops(st) * eff(st.gpu, "decode_flops"))
        kv = ctx * s.kv_bytes_per_token / hbm
        pieces = [(2 * s.layers * a, 2 * s.layers * b * h * bpv)
                  for a, b in all_reduce_pieces(st.tp, eff(st.gpu, "link"))]
        fk_w = np.stack([surv * fl, surv * kv])
        experts = (s, hbm) if s.experts_touched_vary else None
        consts.append((fl - kv, s.weight_bytes / hbm, fk_w, float(surv @ kv),
                       np.array(pieces) if pieces else None, experts))
    with np.errstate(divide="ignore"):
        log_below = np.log(1.0 - surv)
    link_eff = eff(hw.stages[0].gpu, "link")
    out = (consts, log_below, surv, float(surv.sum()), sum(lat for lat, _ in hw.boundaries),
           sum(h * bpv / (bw * link_eff) for _, bw in hw.boundaries))
    TASK_TERMS.put(key, out)
    return out


# --- inference and training --------------------------------------------------------------------

def _stage_consts(shapes: tuple[StageShape, ...], hw: ReplicaHW, L: LengthStats,
                  params: CostParams, kind: str, flops_mult: float, tp_allreduces: int
                  ) -> tuple[list[tuple], list[tuple[float, float, float]], int, int]:
    """The n-independent factors of a forward or training replica's stages (the inputs of
    :func:`hetrl.cost.kernels.forward_replica_seconds`; memoised per shapes, hardware,
    lengths, params and kernel kind): per stage (matmul FLOPs/token, attention FLOPs/token/ctx,
    FLOP rate, weight-read seconds, TP all-reduces x layers, TP links, link efficiency), per
    boundary (latency, bandwidth, link efficiency), hidden size, bytes per value."""
    key = ("stages", shapes, hw, L, params, kind, flops_mult, tp_allreduces)
    out = TASK_TERMS.get(key)
    if out is not None:
        return out
    eff = params.efficiency
    stages = [(s.matmul_flops_per_token, s.attn_flops_per_token_ctx,
               s.peak_flops(st) * params.flops_efficiency(st.gpu, kind, s.model.hidden),
               (1 if flops_mult == 1 else 2) * s.weight_bytes / (
                   st.hbm_Bps * eff(st.gpu, "hbm")),
               tp_allreduces * s.layers, st.tp, eff(st.gpu, "link"))
              for s, st in zip(shapes, hw.stages, strict=True)]
    sends = [(lat, bw, eff(st.gpu, "link"))
             for (lat, bw), st in zip(hw.boundaries, hw.stages, strict=False)]
    out = (stages, sends, shapes[0].model.hidden, shapes[0].bytes_per_value)
    TASK_TERMS.put(key, out)
    return out


def inference_replica(shapes: tuple[StageShape, ...], hw: ReplicaHW, n: float, mbs: int,
                      L: LengthStats, params: CostParams) -> ReplicaCost:
    """Forward passes over ``n`` sequences in micro-batches of ``mbs``, pipelined over stages:
    time = sum_j c_j + (m - 1) max_j c_j, with c_j a stage's micro-batch time (max(compute,
    weight reads) + TP all-reduces, 2 per layer, + the send to the next stage)."""
    return forward_engine("inference", shapes, hw, L, params, mbs, False).replica(n)


def training_replica(shapes: tuple[StageShape, ...], hw: ReplicaHW, n: float, mbs: int,
                     L: LengthStats, params: CostParams, recompute: bool | str) -> ReplicaCost:
    """One optimizer step's forward+backward over ``n`` sequences with 1F1B: time =
    (m + pp - 1) x the slowest stage's micro-batch time (3x forward FLOPs, 4x with full
    recomputation, in between with selective (:func:`~hetrl.cost.flops.training_flops_mult`); 4
    TP all-reduces per layer, 6 with full recomputation; a stage sends activations
    forward over its outgoing boundary and gradients back over its incoming one). The bubble is
    (pp - 1) slowest-stage slots."""
    return forward_engine("training", shapes, hw, L, params, mbs, recompute).replica(n)


def exposed_grad_sync(dp_s: float, micro_work_s: float, flops_mult: float) -> float:
    """The seconds of a Megatron stage's DP gradient sync (reduce-scatter + parameter
    all-gather, ``dp_s``) left after ``--overlap-grad-reduce`` hides it behind the stage's last
    micro-batch's backward (``micro_work_s``: that micro-batch's forward+backward work,
    ``flops_mult`` x a forward: the backward is (mult - 1) / mult of it). Gradient accumulation
    syncs nothing before the last micro-batch; the all-gather's overlap with the next step's
    first forward (``--overlap-param-gather``) is not counted."""
    return max(0.0, dp_s - micro_work_s * (flops_mult - 1.0) / flops_mult)


def forward_engine(kind: str, shapes: tuple[StageShape, ...], hw: ReplicaHW, L: LengthStats,
                   params: CostParams, mbs: int | Batching, recompute: bool | str,
                   tp_overlap: bool = False) -> _ForwardEngine:
    """An inference (``kind`` "inference") or training replica's cost as a function of its
    sequence count, with the n-independent factors computed once (memoised). ``mbs``: sequences
    per micro-batch (padding removed), or a :class:`~hetrl.cost.batching.Batching` (a token
    budget, padding kept). ``tp_overlap``: training's TP collectives pipelined with its GEMMs
    (Megatron's ``--tp-comm-overlap``)."""
    key = ("fwd", kind, shapes, hw, L, params, mbs, recompute, tp_overlap)
    out = TASK_TERMS.get(key)
    if out is None:
        out = _ForwardEngine(kind, shapes, hw, L, params, mbs, recompute, tp_overlap)
        TASK_TERMS.put(key, out)
    return out


class _ForwardEngine:
    """:func:`inference_replica` / :func:`training_replica` for one layout and hardware."""

    def __init__(self, kind: str, shapes: tuple[StageShape, ...], hw: ReplicaHW,
                 L: LengthStats, params: CostParams, mbs: int | Batching, recompute: bool | str,
                 tp_overlap: bool = False):
        self.training = kind == "training"
        self.tp_overlap = self.training and tp_overlap
        self.allreduces = collectives_per_layer(kind, recompute)
        if self.training:
            self.mult = training_flops_mult(shapes[0].model, recompute)
            flops_kind = "train_flops"
        else:
            self.mult, flops_kind = 1.0, "infer_flops"
        self.L, self.mbs = L, mbs
        #: micro-batches by a token budget or padded (None: by count, padding removed)
        self.batcher = None if isinstance(mbs, int) else micro_batcher(mbs, L)
        stages, sends, self.hidden, self.value_bytes = _stage_consts(
            shapes, hw, L, params, flops_kind, self.mult, self.allreduces)
        #: per stage its factors and its TP group's links (kernels.FORWARD_STAGE, LINK_FACTS),
        #: per boundary (latency s, bandwidth bytes/s, link efficiency)
        self.stages = np.array([(mfpt, afpc, rate, hb, tpl, link_eff, g.n, g.ring_latency_s,
                                 g.ring_Bps, g.nodes, g.per_node, g.intra_latency_s,
                                 g.intra_Bps, g.inter_latency_s, g.inter_Bps, g.cross_Bps)
                                for mfpt, afpc, rate, hb, tpl, g, link_eff in stages], dtype=float)
        self.sends = np.array(sends, dtype=float).reshape(len(sends), 3)
        passes = 3.0 if self.training else 1.0
        #: fixed launch seconds per micro-batch: every layer, x3 for a forward+backward
        self.launch_s = params.launch_overhead_s_per_layer * sum(s.layers for s in shapes) * passes
        #: fixed seconds per micro-batch slot of the pipeline (every stage pays it per
        #: micro-batch: m + pp - 1 slots on the critical path)
        self.micro_s = params.micro_batch_overhead_s * passes
        self.pp = len(shapes)

    def replica(self, n: float, load: float = 1.0) -> ReplicaCost:
        """``n`` sequences in the engine's micro-batches, each micro-batch carrying ``load`` x
        its mean tokens (:mod:`hetrl.cost.stragglers`: the slowest replica's); by a token budget
        or padded, as :meth:`hetrl.cost.batching.MicroBatcher.split` counts and sizes them."""
        if n <= 0:
            return ReplicaCost(0.0, _parts())
        if self.batcher is None:
            m, seqs = micro_count(n, self.mbs, self.L.seq_mean)
            seqs, mean, sq = seqs * load, self.L.seq_mean, self.L.seq_sq_mean
        else:
            m, seqs, mean, sq = self.batcher.split(n, load)
        total, compute, hbm, tp, pp, bubble = forward_replica_seconds(
            self.stages, self.sends, seqs, m, mean, sq, self.hidden,
            self.value_bytes, self.mult, self.training, not self.training, self.tp_overlap)
        overhead = 0.0
        if self.launch_s > 0:  # every micro-batch launches every layer, stage after stage
            overhead = m * self.launch_s
            total += overhead
        if self.micro_s > 0:
            fixed = (m + self.pp - 1) * self.micro_s
            overhead += fixed
            total += fixed
        return ReplicaCost(total, {"compute": compute, "hbm": hbm, "bubble": bubble, "tp": tp,
                                   "pp": pp, "dp": 0.0, "data": 0.0, "overhead": overhead,
                                   "offload": 0.0, "framework": 0.0, "ep": 0.0})
