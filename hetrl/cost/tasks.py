"""Per-replica costs of the three task kinds. Every function returns the replica's time split
into additive parts (seconds): ``compute``, ``hbm``, ``bubble``, ``tp``, ``pp``, ``overhead``.
Task-level parts (``dp``, ``data``) are added by the caller. Formulas: docs/cost-model.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from hetrl.cost.flops import StageShape
from hetrl.cost.lengths import LengthStats
from hetrl.cost.params import CostParams
from hetrl.cost.primitives import all_reduce_time, all_reduce_time_vec, p2p_time
from hetrl.cost.replica import ReplicaHW

PARTS = ("compute", "hbm", "bubble", "tp", "pp", "dp", "data", "overhead")


@dataclass(frozen=True)
class ReplicaCost:
    seconds: float
    parts: dict[str, float]
    concurrency: int = 0  # generation: sequences decoded at once
    violations: tuple[str, ...] = field(default=())


def _parts(**kw: float) -> dict[str, float]:
    out = dict.fromkeys(PARTS, 0.0)
    out.update(kw)
    return out


# --- generation ---------------------------------------------------------------------------------

def generation_replica(shapes: tuple[StageShape, ...], hw: ReplicaHW, n: float,
                       kv_budget: tuple[float, ...], L: LengthStats, max_concurrency: int,
                       params: CostParams) -> ReplicaCost:
    """Prefill then continuous-batching decode of ``n`` sequences on one replica.

    Concurrency B = min(max_concurrency, KV budget / KV bytes of an average sequence). While more
    than B sequences remain, B run at once (the saturated phase, ``(n - B) * mean / B`` steps at
    the mean running context); the last B drain as their lengths end: at step s the batch is
    B * P(len >= s) and the step runs if any of them is alive (P = 1 - P(len < s)^B).
    Each decode step costs, per stage, max(weights + KV bytes / HBM, FLOPs / peak) plus TP
    all-reduces, plus stage-to-stage sends and a fixed per-step overhead.
    """
    h = shapes[0].model.hidden
    bpv = shapes[0].bytes_per_value
    violations = []
    seq_tokens = L.prompt_mean + L.response_mean
    cap = max_concurrency
    for j, (s, budget) in enumerate(zip(shapes, kv_budget, strict=True)):
        need_one = s.kv_bytes_per_token * (L.prompt_max + L.response_max)
        if budget < need_one:
            violations.append(
                f"stage {j} ({hw.stages[j].gpu}): KV cache budget {budget / 1e9:.2f} GB < "
                f"{need_one / 1e9:.2f} GB for one max-length sequence")
        cap = min(cap, int(max(budget, 0.0) // (s.kv_bytes_per_token * seq_tokens)))
    B = max(cap, 1)
    m = min(n, B)
    if n <= 0:
        return ReplicaCost(0.0, _parts(), B, tuple(violations))

    # Prefill: compute-bound, in chunks of prefill_chunk_tokens, stage after stage.
    ptoks = n * L.prompt_mean
    chunks = max(1, math.ceil(ptoks / params.prefill_chunk_tokens))
    chunk_tok = ptoks / chunks
    pre_c, pre_h, pre_tp = 0.0, 0.0, 0.0
    p_sq = L.prompt_mean ** 2  # E[p^2] >= mean^2; prefill is a small term
    for s, st in zip(shapes, hw.stages, strict=True):
        fl = ptoks * s.matmul_flops_per_token + s.attn_flops_per_token_ctx * n * p_sq / 2
        c = fl / (st.flops * params.efficiency(st.gpu, "infer_flops"))
        hb = chunks * s.weight_bytes / (st.hbm_Bps * params.efficiency(st.gpu, "hbm"))
        tp = chunks * 2 * s.layers * all_reduce_time(chunk_tok * h * bpv, st.tp,
                                                     params.efficiency(st.gpu, "link"))
        pre_c += c if c >= hb else 0.0
        pre_h += hb if hb > c else 0.0
        pre_tp += tp
    link_eff = params.efficiency(hw.stages[0].gpu, "link")
    # a boundary's bandwidth already counts its tp ranks sending their slices in parallel
    pre_pp = chunks * sum(p2p_time(chunk_tok * h * bpv, lat, bw, link_eff)
                          for lat, bw in hw.boundaries)
    # Saturated phase: (n - B) * mean / B steps of B sequences at the mean running context.
    sat_steps = max(n - B, 0.0) * L.response_mean / B
    sc, sm, stp, spp, _ = _decode_steps(shapes, hw, float(B), L, params, saturated=True)
    # Drain phase: the last m sequences (memoised: it does not depend on n once n >= B).
    dc, dm, dtp, dpp, dsteps = _decode_steps(shapes, hw, float(m), L, params, saturated=False)
    compute = pre_c + sat_steps * sc + dc
    hbm = pre_h + sat_steps * sm + dm
    tp = pre_tp + sat_steps * stp + dtp
    pp = pre_pp + sat_steps * spp + dpp
    overhead = (sat_steps + dsteps) * params.decode_step_overhead_s
    parts = _parts(compute=compute, hbm=hbm, tp=tp, pp=pp, overhead=overhead)
    return ReplicaCost(sum(parts.values()), parts, B, tuple(violations))


@lru_cache(maxsize=8192)
def _decode_steps(shapes: tuple[StageShape, ...], hw: ReplicaHW, m: float, L: LengthStats,
                  params: CostParams, saturated: bool) -> tuple[float, float, float, float, float]:
    """Decode-step costs split into (compute, hbm, tp, pp, steps). ``saturated``: one step of
    ``m`` sequences at the mean running context (prompt + mean age). Otherwise the drain of
    ``m`` sequences started together: sum over steps s of P(any alive at s) x the step's cost at
    the expected batch given that one is alive, m P(len >= s) / P(any alive)."""
    h = shapes[0].model.hidden
    bpv = shapes[0].bytes_per_value
    link_eff = params.efficiency(hw.stages[0].gpu, "link")
    if saturated:
        batch = np.array([m])
        ctx = np.array([L.prompt_mean + L.mean_age])
        weight = np.ones(1)
    else:
        weight = L.prob_any_alive(m)
        batch = m * L.survival / np.maximum(weight, 1e-300)
        ctx = L.ctx
    comp = np.zeros_like(batch)
    mem = np.zeros_like(batch)
    tp = np.zeros_like(batch)
    for s, st in zip(shapes, hw.stages, strict=True):
        hb = (s.weight_bytes + batch * ctx * s.kv_bytes_per_token) / (
            st.hbm_Bps * params.efficiency(st.gpu, "decode_hbm"))
        fl = batch * (s.matmul_flops_per_token + s.attn_flops_per_token_ctx * ctx) / (
            st.flops * params.efficiency(st.gpu, "decode_flops"))
        comp += np.where(fl >= hb, fl, 0.0)
        mem += np.where(fl >= hb, 0.0, hb)
        tp += 2 * s.layers * all_reduce_time_vec(batch * h * bpv, st.tp,
                                                 params.efficiency(st.gpu, "link"))
    pp = np.zeros_like(batch)
    for lat, bw in hw.boundaries:
        pp += lat + batch * h * bpv / (bw * link_eff)
    return (float(comp @ weight), float(mem @ weight), float(tp @ weight), float(pp @ weight),
            float(weight.sum()))


# --- inference and training --------------------------------------------------------------------

def _micro(n: float, mbs: int) -> tuple[int, float]:
    """Micro-batch count and sequences per micro-batch for ``n`` sequences (fractional shares)."""
    count = max(1, math.ceil(n / mbs - 1e-9))
    return count, n / count


def _stage_times(shapes: tuple[StageShape, ...], hw: ReplicaHW, seqs: float, L: LengthStats,
                 params: CostParams, kind: str, flops_mult: float, tp_allreduces: int,
                 backward: bool) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per stage, for one micro-batch of ``seqs`` sequences: compute, HBM, TP and send times
    (seconds). A stage sends its activations over its outgoing boundary; with ``backward`` it
    also sends the activation gradient back over its incoming boundary (same size), so a
    boundary is paid once in each direction, by the stage that sends. ``flops_mult`` 1 forward,
    3 fwd+bwd, 4 with recomputation."""
    tokens = seqs * L.seq_mean
    h = shapes[0].model.hidden
    bpv = shapes[0].bytes_per_value
    comp, mem, tps, bnd = [], [], [], []
    sends = [p2p_time(tokens * h * bpv, lat, bw, params.efficiency(st.gpu, "link"))
             for (lat, bw), st in zip(hw.boundaries, hw.stages, strict=False)]
    for j, (s, st) in enumerate(zip(shapes, hw.stages, strict=True)):
        fl = flops_mult * (tokens * s.matmul_flops_per_token
                           + s.attn_flops_per_token_ctx * seqs * L.seq_sq_mean / 2)
        c = fl / (st.flops * params.efficiency(st.gpu, kind))
        hb = (1 if flops_mult == 1 else 2) * s.weight_bytes / (
            st.hbm_Bps * params.efficiency(st.gpu, "hbm"))
        comp.append(c if c >= hb else 0.0)
        mem.append(hb if hb > c else 0.0)
        tps.append(tp_allreduces * s.layers * all_reduce_time(
            tokens * h * bpv, st.tp, params.efficiency(st.gpu, "link")))
        out = sends[j] if j < len(sends) else 0.0
        back = sends[j - 1] if backward and j > 0 else 0.0
        bnd.append(out + back)
    return comp, mem, tps, bnd


def inference_replica(shapes: tuple[StageShape, ...], hw: ReplicaHW, n: float, mbs: int,
                      L: LengthStats, params: CostParams) -> ReplicaCost:
    """Forward passes over ``n`` sequences in micro-batches of ``mbs``, pipelined over stages:
    time = sum_j c_j + (m - 1) max_j c_j, with c_j a stage's micro-batch time (max(compute,
    weight reads) + TP all-reduces, 2 per layer, + the send to the next stage)."""
    if n <= 0:
        return ReplicaCost(0.0, _parts())
    m, seqs = _micro(n, mbs)
    comp, mem, tps, bnd = _stage_times(shapes, hw, seqs, L, params, "infer_flops", 1.0, 2, False)
    return _pipeline(m, comp, mem, tps, bnd, fill_all=True)


def training_replica(shapes: tuple[StageShape, ...], hw: ReplicaHW, n: float, mbs: int,
                     L: LengthStats, params: CostParams, recompute: bool) -> ReplicaCost:
    """One optimizer step's forward+backward over ``n`` sequences with 1F1B: time =
    (m + pp - 1) x the slowest stage's micro-batch time (3x forward FLOPs, 4x with full
    recomputation; 4 TP all-reduces per layer, 6 with recomputation; a stage sends activations
    forward over its outgoing boundary and gradients back over its incoming one). The bubble is
    (pp - 1) slowest-stage slots."""
    if n <= 0:
        return ReplicaCost(0.0, _parts())
    m, seqs = _micro(n, mbs)
    mult = 4.0 if recompute else 3.0
    comp, mem, tps, bnd = _stage_times(shapes, hw, seqs, L, params, "train_flops", mult,
                                       6 if recompute else 4, True)
    return _pipeline(m, comp, mem, tps, bnd, fill_all=False)


def _pipeline(m: int, comp: list[float], mem: list[float], tps: list[float], bnd: list[float],
              fill_all: bool) -> ReplicaCost:
    per = [c + h + t + b for c, h, t, b in zip(comp, mem, tps, bnd, strict=True)]
    k = int(np.argmax(per))
    slow = per[k]
    pp = len(per)
    if fill_all:
        total = sum(per) + (m - 1) * slow
        bubble = sum(per) - slow
    else:
        total = (m + pp - 1) * slow
        bubble = (pp - 1) * slow
    parts = _parts(compute=m * comp[k], hbm=m * mem[k], tp=m * tps[k], pp=m * bnd[k], bubble=bubble)
    return ReplicaCost(total, parts)
